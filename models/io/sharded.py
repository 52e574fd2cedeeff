"""The one loader: pretrained weights placed shard by shard into a parameter tree laid out by the caller's shardings, or
(no shardings: ``from_pretrained``, ``flaxzoo convert``) whole on the default device, a single device being a mesh of
one. No device and no process holds a full copy of a parameter it only holds shards of (the process reading a GGUF
file or a LoRA run's merge aside: see below). Every source takes the same steps: open (``flaxzoo.models.io.sources``),
plan and check once (``flaxzoo.models.io.sharded_plan.prepare``), place (``tensor_arrays`` or, for a flaxzoo work
directory, ``flaxzoo.models.io.sharded_workdir``), initialise what the checkpoint lacks.

``load_sharded(path, shardings=...)`` takes what ``from_pretrained`` takes (a Hugging Face directory or Hub id, a GGUF
file, a flaxzoo work directory, a packaged name; the same class, dtype, layout, label and vocabulary overrides) and
returns the parameters of the model ``from_pretrained`` would build, ``nnx.split(model, nnx.Param, ...)[1]``, as global
``jax.Array``s laid out by the given ``NamedSharding`` per parameter. Each is made by
``jax.make_array_from_callback``, whose callback, given the index of one addressable shard, reads only what that
shard needs:

* Hugging Face safetensors (one file or sharded with an index): the shard's index is mapped back through the table
  entry's transform to the stored tensor's box (``flaxzoo.models.io.slicing``) and read with
  ``safe_open(file, "np").get_slice(name)[...]`` (bfloat16 / float8: a memory map of the tensor's bytes). *Exact*:
  every transform that is a rearrangement of axes, which is every one the bert, roberta, gpt2 and llama tables use:
  the identity (embeddings, norms, biases), ``LINEAR`` (a transpose: the slices transposed), the head splits
  ``(h k) d -> d h k`` / ``d (h k) -> h k d`` / ``(h k) -> h k`` (contiguous row or column ranges), GPT-2's fused
  ``c_attn`` ``d (parts h k) -> parts d h k`` (one part's columns); a stacked ``[num_layers, ...]`` parameter
  (``scan_layers``) reads only the layers of its index, each from its own tensor. *Whole* (read once per parameter
  per process, translated, then sliced): a transform that computes (arithmetic, gathers, dtype conversions), and a
  checkpoint's tied duplicate (``lm_head.weight`` beside a tied embedding), which is compared whole as
  ``from_pretrained`` does. A box is read with one slice per stored axis; when the shard's part of a stored axis is
  not contiguous (a ``(h k)`` axis split inside a head) the smallest slice holding it is read.
* ``pytorch_model.bin`` (``allow_pickle``): read whole, as ``from_pretrained`` does, then sliced per shard.
* GGUF: each tensor is dequantised whole in every process, translated, then sliced per shard.
* A flaxzoo work directory (orbax): restored straight into the target shardings (``jax.ShapeDtypeStruct(...,
  sharding=...)`` targets: orbax reads only this process's shards; ``flaxzoo.models.io.sharded_workdir``). A LoRA
  run's work directory: its base is loaded (through this loader), the adapters applied and merged, whole in every
  process, then sliced per shard.

Heads the checkpoint lacks (a classifier on a base-model checkpoint) are initialised at ``seed`` with the model's
initialisers under ``jax.jit`` with ``out_shardings`` (born sharded), to the values ``from_pretrained`` gives them,
and listed in the same one warning. Vocabulary padding (``pad_vocab_to``): padding rows are zeros, never read.

Reads are reported, one :class:`flaxzoo.models.io.stored.Read` each, to the optional ``on_read`` hook (how the
tests count what each process reads).

A trainer with a mesh and the logical-axis rules of ``flaxzoo.train.sharding`` calls it in every process::

    shardings = lambda abstract: param_shardings(nnx.to_pure_dict(nnx.get_partition_spec(abstract)),
                                                 nnx.to_pure_dict(abstract), mesh)
    params = load_sharded(path, cls=BertForSequenceClassification, num_labels=3, shardings=shardings)
    plain = nnx.to_pure_dict(params)  # the tree train.sharding.global_from_host would have made

(``pretrained_shapes(path, ...)`` gives the config, class and abstract parameters first, without reading weights.)

``load_model`` builds the model itself (what ``from_pretrained`` returns): float, or int8 with each projection
quantised as soon as it is placed (``quantize="int8"``: the float projections of the whole model are never held).

"""

from __future__ import annotations

from typing import Any, Callable, Iterable, NamedTuple

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from flaxzoo.models.adapters.lora import merge_lora
from flaxzoo.models.adapters.quantize import check_quantize, quantize_value
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families import family_and_class
from flaxzoo.models.families.base import ParamPath, dotted
from flaxzoo.models.io.files import PathLike, weight_files
from flaxzoo.models.io.sharded_plan import (Prepared, check_shardings, initial_state, layer_groups, prepare,
                                            tensor_arrays)
from flaxzoo.models.io.sharded_workdir import stored_tensors, workdir_arrays
from flaxzoo.models.io.sources import HFSource, LoraRunSource, Source, WorkdirSource, open_source
from flaxzoo.models.io.stored import OnRead, Read, SafetensorsFiles
from flaxzoo.models.layers.layer_layout import unstack_layer_values
from flaxzoo.models.modeling import abstract_params, assemble_model, override_config

__all__ = ["PretrainedShapes", "Read", "load_adapted", "load_model", "load_sharded", "pretrained_shapes"]

Make = Callable[[dict[ParamPath, NamedSharding] | None], Iterable[tuple[ParamPath, jax.Array]]]


class PretrainedShapes(NamedTuple):
    """What ``pretrained_shapes`` returns: the config and class ``from_pretrained`` would build, and the abstract
    parameters (``nnx.State`` of ``nnx.Param`` with ``jax.ShapeDtypeStruct`` values and their logical axes
    metadata): what a trainer computes its shardings from."""

    config: TransformerConfig
    model_cls: type
    params: nnx.State


def _source(path: PathLike | Source, revision: str | None, allow_pickle: bool) -> Source:
    return path if isinstance(path, Source) else open_source(path, revision=revision, allow_pickle=allow_pickle)


def _one_device(prepared: Prepared) -> dict[ParamPath, NamedSharding]:
    mesh = jax.sharding.Mesh(np.array(jax.local_devices()[:1]), ("data",))
    return {p: NamedSharding(mesh, PartitionSpec()) for p in prepared.abstract.shapes}


def _prepare(source: Source, cls: type | str | None, overrides: dict[str, Any], seed: int, on_read: OnRead | None,
             announce: bool = True, progress: bool = False) -> tuple[Prepared, Make, Callable[[], None]]:
    """Ask the source (config, class, tensors, table), check once; returns the check's result, the function making
    the arrays of the parameters the source has (given shardings, or None: the default device), and the clean-up."""
    stored_config, _ = source.describe()
    model_cls = source.model_class(cls)
    scan = source.default_scan_layers if overrides.get("scan_layers") is None else overrides["scan_layers"]
    config = override_config(stored_config, **{**overrides, "scan_layers": scan})
    workdir = isinstance(source, WorkdirSource) and not isinstance(source, LoraRunSource)
    files = weight_files(source.root, source.allow_pickle)[0] if isinstance(source, HFSource) else []
    release = None
    if isinstance(source, LoraRunSource):  # the merge is built whole: its values are read whole
        tensors = merged_tensors(source)
    elif workdir:  # restored by orbax straight into the shardings: only the metadata now
        tensors, where, metadata = stored_tensors(source.step_dir, stored_config.layer_counts)
    elif files and all(f.suffix == ".safetensors" for f in files):
        stored = SafetensorsFiles(files, family_and_class(source.hf, None)[0].rename, on_read)
        tensors, release = stored.tensors, stored.release
    else:  # GGUF (lazy: each tensor dequantised whole when read), pickles (read whole)
        tensors = source.read(progress=progress)
    prepared = prepare(config, model_cls, source.plan(config, model_cls, tensors.keys()), tensors, seed, announce)
    if workdir:
        return (prepared, lambda s: workdir_arrays(source.step_dir, prepared, where, metadata,
                                                   s or _one_device(prepared)).items(), lambda: None)
    if release is not None:
        release()  # the files mapped while checking
    return prepared, lambda s: tensor_arrays(prepared, s, on_read, after_each=release), release or (lambda: None)


def pretrained_shapes(path: PathLike | Source, *, cls: type | str | None = None, dtype: Any = None,
                      param_dtype: Any = None, scan_layers: bool | None = None, num_labels: int | None = None,
                      pad_vocab_to: int | None = None, revision: str | None = None, allow_pickle: bool = False
                      ) -> PretrainedShapes:
    """The config, class and abstract parameters of the model ``from_pretrained(path, ...)`` builds with the same
    arguments, read from the source's config and tensor names / shapes alone (no value is read; a GGUF file's
    tensors are not dequantised; a LoRA run's merge is built). Raises what ``from_pretrained`` raises for a source
    that does not match."""
    overrides = dict(dtype=dtype, param_dtype=param_dtype, scan_layers=scan_layers, num_labels=num_labels,
                     pad_vocab_to=pad_vocab_to)
    prepared, _, done = _prepare(_source(path, revision, allow_pickle), cls, overrides, 0, None, announce=False)
    done()
    return PretrainedShapes(prepared.config, prepared.model_cls, prepared.abstract.params)


def load_sharded(path: PathLike | Source, *, shardings: Any, cls: type | str | None = None, dtype: Any = None,
                 param_dtype: Any = None, scan_layers: bool | None = None, num_labels: int | None = None,
                 pad_vocab_to: int | None = None, seed: int = 0, revision: str | None = None,
                 allow_pickle: bool = False, on_read: Callable[[Read], None] | None = None) -> nnx.State:
    """The parameters of the model ``from_pretrained(path, cls=..., dtype=..., ...)`` builds, as global arrays laid
    out by ``shardings``, each shard read by the process that holds it (module docstring: what is read exactly).

    Args:
      path: what ``from_pretrained`` takes (or an opened ``Source``).
      shardings: one ``jax.sharding.NamedSharding`` per parameter: a tree shaped like
        ``nnx.to_pure_dict(params)`` (e.g. ``flaxzoo.train.sharding.param_shardings``' result), an ``nnx.State``, a
        flat ``{path tuple: sharding}``, or a callable taking the abstract parameters (``nnx.State`` of
        ``jax.ShapeDtypeStruct`` with their logical axes) and returning one of those.
      cls, dtype, param_dtype, scan_layers, num_labels, pad_vocab_to, seed, revision, allow_pickle: as for
        ``from_pretrained`` (``quantize`` is not offered: quantised kernels are made from whole projections).
      on_read: called with a ``Read(tensor, index, elements, exact)`` for every read of a stored tensor (not for
        orbax's reads of a flaxzoo checkpoint).

    Returns:
      ``nnx.State`` of ``nnx.Param`` (with their metadata), the structure of ``nnx.split(model, nnx.Param, ...)[1]``
      (stacked ``[num_layers, ...]`` blocks with ``scan_layers``), each value a ``jax.Array`` of the parameter's
      shape and dtype with the sharding asked for (``nnx.to_pure_dict`` gives the plain tree).

    Raises:
      ValueError: what ``from_pretrained`` raises for the source; shardings that miss or add parameters, are not
        ``NamedSharding``s, or do not divide a parameter (each named).
    """
    overrides = dict(dtype=dtype, param_dtype=param_dtype, scan_layers=scan_layers, num_labels=num_labels,
                     pad_vocab_to=pad_vocab_to)
    prepared, make, done = _prepare(_source(path, revision, allow_pickle), cls, overrides, seed, on_read)
    try:
        flat = check_shardings(shardings, prepared.abstract)
        values = dict(make(flat))
    finally:
        done()
    lacking = [p for p in prepared.abstract.shapes if p in prepared.lacking]
    if lacking:
        values.update(initial_state(prepared, lacking, flat, seed)[0])
    return nnx.from_flat_state([(p, var.replace(values[p])) for p, var in nnx.to_flat_state(prepared.abstract.params)])


def load_model(source: Source, *, cls: type | str | None = None, dtype: Any = None, param_dtype: Any = None,
               scan_layers: bool | None = None, num_labels: int | None = None, pad_vocab_to: int | None = None,
               seed: int = 0, quantize: str | None = None, progress: bool = False) -> nnx.Module:
    """The model (eval mode) ``source`` holds, built as ``cls`` in the stored config with the overrides of the same
    names (see ``from_pretrained``), its parameters whole on the default device (uncommitted, as ``jnp.asarray``
    leaves them; a flaxzoo work directory's: on the first local device). The head tensors the source lacks (another
    class's checkpoint) are initialised at ``seed`` and listed in one warning. ``quantize`` (``"int8"``): each
    projection is quantised as soon as it is placed, so the float projections of the whole model are never held."""
    quantize = check_quantize(quantize)
    overrides = dict(dtype=dtype, param_dtype=param_dtype, scan_layers=scan_layers, num_labels=num_labels,
                     pad_vocab_to=pad_vocab_to)
    prepared, make, done = _prepare(source, cls, overrides, seed, None, progress=progress)
    config, factory, abstract = prepared.config, prepared.plan.factory, prepared.abstract
    quantized = abstract_params(config, factory, quantize) if quantize is not None else None
    groups = layer_groups(abstract.shapes, config.num_layers) if quantize is not None else {}
    values: dict[ParamPath, Any] = {}
    try:
        for path, array in make(None):
            if quantized is None:
                values[path] = array
            else:  # per layer, the layout quantize_value takes
                for i, layer_path in enumerate(groups[path] or [path]):
                    value = array if groups[path] is None else array[i]
                    values.update(quantize_value(quantized.model, layer_path, value, stacked=config.scan_layers))
    finally:
        done()
    lacking = [p for p in abstract.shapes if p in prepared.lacking]
    if quantized is not None:
        return assemble_model(config, factory, values, abstract=quantized, fresh=lacking, seed=seed,
                              quantize=quantize)
    fresh, rest = initial_state(prepared, lacking, None, seed)
    values.update(fresh)
    params = nnx.from_flat_state([(p, var.replace(values.pop(p))) for p, var in nnx.to_flat_state(abstract.params)])
    model = nnx.merge(abstract.graphdef, params, rest)
    model.eval()
    return model


def adapted_model(source: LoraRunSource) -> nnx.Module:
    """A LoRA run's model with its adapters unmerged: its base loaded as the run's class and layer layout, then
    ``LoraRunSource.adapted``."""
    config, model_cls = source.describe()
    base = load_model(source.base_source(), cls=model_cls, scan_layers=config.scan_layers)
    return source.adapted(base)


def merged_tensors(source: LoraRunSource) -> dict[str, Any]:
    """``{dotted per-layer path: value}`` of a LoRA run's model with its adapters merged."""
    merged = merge_lora(adapted_model(source))
    values = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(merged, nnx.Param))}
    return {dotted(p): v for p, v in unstack_layer_values(values, source.describe()[0].layer_counts).items()}


def load_adapted(path: PathLike, *, base: PathLike | None = None) -> nnx.Module:
    """The model of a LoRA run's checkpoint with its adapters unmerged (see ``LoraRunSource.adapted``); ``base``:
    the base weights when they have moved from the path the run recorded."""
    source = open_source(path)
    if not isinstance(source, LoraRunSource):
        where = getattr(source, "step_dir", source.root)
        raise ValueError(f"{where} is not a LoRA run's checkpoint (its meta has no 'lora')")
    source.base = base
    return adapted_model(source)
