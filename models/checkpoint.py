"""flaxzoo training checkpoints, read as models (and written, for conversions).

``python -m flaxzoo.train`` keeps an orbax ``CheckpointManager`` rooted at ``WORKDIR/checkpoints``; each step directory holds
the items

* ``state``: a ``StandardSave`` of a dict whose ``"params"`` is ``nnx.to_pure_dict(nnx.state(model, nnx.Param))`` (plus
  the optimizer state, step, RNG ... which only training reads),
* ``meta``: a ``JsonSave`` of ``{"format": "flaxzoo", "version": 1, "model_class": ..., "config":
  TransformerConfig.to_dict(), "train_config": {...}, "data_position": ...}`` (the data position: training only;
  checkpoints of earlier releases also hold a ``data`` item of Grain iterator state, which loading ignores).

Loading a model reads ``meta`` and only ``params`` out of ``state`` (a partial restore: the optimizer state is never
opened), onto the local devices whatever mesh wrote them, into either layer layout (blocks per
layer, or stacked ``[num_layers, ...]`` with ``scan_layers``) whichever one wrote them. ``save_checkpoint`` writes the
same layout with ``state`` holding ``params`` only, at step 0: what ``python -m flaxzoo.models.convert ... --to flaxzoo``
produces.

The vocabulary tables are stored as the model holds them, padded to ``config.pad_vocab_to`` (recorded in ``meta``'s
config with every other field); ``load_checkpoint(..., pad_vocab_to=N)`` re-pads them.
"""

from __future__ import annotations

import contextlib
import pathlib
from typing import Any, Mapping

import jax
import numpy as np
from etils import epath
from flax import nnx

from flaxzoo.models.bert import BertModel
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.stack import unstack_layer_values
from flaxzoo.models.modeling import (DECODER_CLASSES, MODEL_CLASSES, abstract_params, assemble_model, bert_without_pooler,
                             dotted, format_names, override_config, per_layer_shapes, plain_factory,
                             resize_vocab_values, vocab_axes, vocab_shapes, warn_initialised)

__all__ = ["FORMAT", "VERSION", "checkpoint_meta", "find_step_dir", "load_checkpoint", "read_meta", "save_checkpoint"]

FORMAT = "flaxzoo"
VERSION = 1
CHECKPOINT_DIR = "checkpoints"  # under the work directory
STATE, META, DATA = "state", "meta", "data"  # the orbax items of one step

ParamPath = tuple[Any, ...]


def _steps(root: pathlib.Path) -> list[int]:
    """Finished steps under a CheckpointManager root (orbax writes a step under a temporary name, then renames)."""
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / META).is_dir())


def find_step_dir(path: str | pathlib.Path) -> pathlib.Path | None:
    """The step directory to load from ``path``: ``path`` itself when it is one, else the latest step of
    ``path/checkpoints`` (a work directory) or of ``path`` (a CheckpointManager root); None when there is none.
    ``path`` may be an object-store URI (``gs://...``: read through ``etils.epath``, as orbax does)."""
    path = epath.Path(path) if "://" in str(path) else pathlib.Path(path)
    if (path / META).is_dir() and (path / STATE).is_dir():
        return path
    for root in (path / CHECKPOINT_DIR, path):
        steps = _steps(root)
        if steps:
            return root / str(steps[-1])
    return None


def _ocp():
    import orbax.checkpoint as ocp  # imported on use: orbax is heavy

    return ocp


@contextlib.contextmanager
def _quiet():
    """Silence orbax's absl warnings about reading one item directly (no manager-level metadata file there)."""
    from absl import logging as absl_logging

    level = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)
    try:
        yield
    finally:
        absl_logging.set_verbosity(level)


def read_meta(step_dir: pathlib.Path) -> dict[str, Any]:
    """The ``meta`` item of a step, checked to be a flaxzoo checkpoint of a version this code reads."""
    ocp = _ocp()
    with _quiet(), ocp.Checkpointer(ocp.JsonCheckpointHandler()) as checkpointer:
        meta = checkpointer.restore(step_dir / META, args=ocp.args.JsonRestore())
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"{step_dir / META} is not flaxzoo checkpoint metadata (format={found!r}, expected "
                         f"{FORMAT!r})")
    if int(meta.get("version", 0)) > VERSION:
        raise ValueError(f"{step_dir}: flaxzoo checkpoint version {meta['version']} is newer than this code reads "
                         f"({VERSION}); upgrade flaxzoo")
    for key in ("model_class", "config"):
        if key not in meta:
            raise ValueError(f"{step_dir / META} lacks {key!r}")
    if meta["model_class"] not in MODEL_CLASSES:
        raise ValueError(f"{step_dir}: unknown model_class {meta['model_class']!r}; expected one of "
                         f"{sorted(MODEL_CLASSES)}")
    return meta


def checkpoint_meta(model: nnx.Module, train_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``meta`` item describing ``model`` (the training code adds its own ``train_config``)."""
    return {"format": FORMAT, "version": VERSION, "model_class": type(model).__name__,
            "config": model.config.to_dict(), "train_config": dict(train_config or {})}


def _stored_params(step_dir: pathlib.Path) -> dict[ParamPath, Any]:
    """``{path: metadata (shape, dtype)}`` of the stored parameters, read from the ``state`` item's metadata."""
    ocp = _ocp()
    with _quiet(), ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as checkpointer:
        tree = checkpointer.metadata(step_dir / STATE)
    tree = getattr(tree, "item_metadata", tree)
    tree = getattr(tree, "tree", tree)
    if not isinstance(tree, Mapping) or "params" not in tree:
        raise ValueError(f"{step_dir / STATE} holds no 'params' entry")
    flat = jax.tree_util.tree_flatten_with_path(tree["params"], is_leaf=lambda x: hasattr(x, "shape"))[0]
    return {tuple(_key(k) for k in path): leaf for path, leaf in flat}


def _key(entry: Any) -> Any:
    key = getattr(entry, "key", getattr(entry, "idx", getattr(entry, "name", entry)))
    return int(key) if isinstance(key, str) and key.isdigit() else key


def _stack_prefix(paths: Any) -> ParamPath:
    """Where the layer stack sits in a model's parameter tree: the path above its ``embeddings``
    (``("bert", "encoder")`` in a ``BertForMaskedLM``, ``("decoder",)`` in a ``GPTModel``; ``()`` without one)."""
    return next((p[:p.index("embeddings")] for p in paths if p[-3:] == ("embeddings", "tokens", "embedding")), ())


def _rebased(paths: Any, stored_base: ParamPath, base: ParamPath) -> dict[ParamPath, ParamPath]:
    """``{stored path: path in the model}``: the stored base model's parameters moved from ``stored_base`` to
    ``base`` (``("bert",)`` in the head classes, ``()`` in ``BertModel``); head parameters keep their paths."""
    return {p: base + p[len(stored_base):] if p[:len(stored_base)] == stored_base else p for p in paths}


def _compare(expected: dict[ParamPath, tuple], stored: dict[ParamPath, tuple], stack: ParamPath, same_class: bool
             ) -> tuple[list[str], list[ParamPath]]:
    """(problems, parameters to initialise). Another class may lack the stored head's parameters (skipped) and
    lack its own head's (initialised); inside the layer stack, and for the stored class itself, all must match."""
    inside = lambda p: p[:len(stack)] == stack  # noqa: E731
    missing = set(expected) - set(stored)
    fresh = [] if same_class else sorted((p for p in missing if not inside(p)), key=str)
    unexpected = {p for p in set(stored) - set(expected) if same_class or inside(p)}
    names = lambda paths: format_names([dotted(p) for p in paths])  # noqa: E731
    problems = ([f"missing parameters: {names(missing - set(fresh))}"] if missing - set(fresh) else []) + \
               ([f"unexpected parameters: {names(unexpected)}"] if unexpected else [])
    problems += [f"{dotted(p)}: expected shape {expected[p]}, found {stored[p]}"
                 for p in sorted(set(expected) & set(stored), key=str) if stored[p] != expected[p]]
    return problems, fresh


def load_checkpoint(path: str | pathlib.Path, *, cls: type | str | None = None, dtype: Any = None,
                    scan_layers: bool | None = None, num_labels: int | None = None, pad_vocab_to: int | None = None,
                    seed: int = 0) -> nnx.Module:
    """The model of a flaxzoo training checkpoint (latest step), in eval mode; only its parameters are read.

    ``cls``: the stored class (default) or another one of the same kind (encoder / decoder): a base class takes the
    stored base model (``BertModel`` gets a pooler only if there is one); a head class started from another class's
    checkpoint (``BertForSequenceClassification`` from a ``BertForMaskedLM`` or ``BertModel`` one) initialises what
    the checkpoint lacks outside the layer stack (classifier, pooler) at ``seed``, listed in one warning, and skips
    the stored head. ``dtype`` overrides the stored config's dtypes, ``num_labels`` its number of labels;
    ``scan_layers`` the layer layout (None: the stored config's), whatever the layout the checkpoint was written in.
    The vocabulary tables are stored padded as the stored config's ``pad_vocab_to`` says; ``pad_vocab_to`` pads them
    to another multiple (padding rows trimmed or added as zeros; the real rows are unchanged).
    """
    step_dir = find_step_dir(path)
    if step_dir is None:
        raise ValueError(f"{path} holds no flaxzoo checkpoint step (expected checkpoints/<step>/{{state,meta}})")
    meta = read_meta(step_dir)
    if "lora" in meta:  # adapters and a reference to the base: merged into a plain model, then loaded as one
        from flaxzoo.models.lora import merge_lora

        merged = merge_lora(load_adapted(step_dir))
        values = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(merged, nnx.Param))}
        stored_config = merged.config
        config = override_config(stored_config, dtype=dtype, scan_layers=scan_layers, num_labels=num_labels,
                                 pad_vocab_to=pad_vocab_to)
        if (cls is not None and _target_class(cls, type(merged), config, step_dir) is not type(merged)) \
                or config.num_labels != stored_config.num_labels or config.pad_vocab_to != stored_config.pad_vocab_to:
            raise ValueError(f"{step_dir}: a LoRA run loads as the class and heads it was trained with "
                             f"({type(merged).__name__}); save it (models.save_checkpoint) to change them")
        return assemble_model(config, plain_factory(merged), values)
    stored_cls = MODEL_CLASSES[meta["model_class"]]
    stored_config = TransformerConfig.from_dict(meta["config"])
    config = override_config(stored_config, dtype=dtype, scan_layers=scan_layers, num_labels=num_labels,
                             pad_vocab_to=pad_vocab_to)
    model_cls = _target_class(cls, stored_cls, config, step_dir)
    stored = _stored_params(step_dir)
    layers = config.num_layers
    stored_shapes = per_layer_shapes(stored, layers)
    abstract = abstract_params(config, model_cls)
    moved = _rebased(stored_shapes, _stack_prefix(stored_shapes)[:-1], _stack_prefix(abstract[2])[:-1])
    factory = model_cls
    if model_cls is BertModel and ("pooler", "kernel") not in moved.values():
        factory = bert_without_pooler
        abstract = abstract_params(config, factory)
    expected = per_layer_shapes(abstract[2], layers)
    vocab = vocab_axes(abstract[1])  # stored with stored_config.padded_vocab_size rows: compared as the model's
    found = {moved[p]: s for p, s in stored_shapes.items()}
    padded_as_stored = {p: a for p, a in vocab.items() if p in found and found[p][a] == stored_config.padded_vocab_size}
    found |= vocab_shapes({p: found[p] for p in padded_as_stored}, padded_as_stored, config.padded_vocab_size)
    problems, fresh = _compare(expected, found, _stack_prefix(expected), model_cls is stored_cls)
    if problems:
        raise ValueError(f"{step_dir}: the checkpoint does not match its {model_cls.__name__} config; "
                         + "; ".join(problems))

    values = unstack_layer_values(_restore_params(step_dir, stored), layers)
    values = {moved[p]: v for p, v in values.items() if moved[p] in expected}
    values = resize_vocab_values(values, vocab, config.padded_vocab_size)
    if fresh:
        warn_initialised(f"{step_dir} ({stored_cls.__name__} loaded as {model_cls.__name__})",
                         [dotted(p) for p in fresh], seed)
    return assemble_model(config, factory, values, abstract=abstract, fresh=fresh, seed=seed)


def _restore_params(step_dir: pathlib.Path, stored: Mapping[ParamPath, Any]) -> dict[ParamPath, Any]:
    """The stored parameters ``{path: array}`` (``stored``: their metadata), on one local device whatever mesh
    wrote them, in the stored dtype."""
    ocp = _ocp()
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target: dict[Any, Any] = {}
    for p, leaf in stored.items():
        node = target
        for k in p[:-1]:
            node = node.setdefault(k, {})
        node[p[-1]] = jax.ShapeDtypeStruct(tuple(leaf.shape), np.dtype(leaf.dtype), sharding=device)
    item = {"params": target}
    with _quiet(), ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as checkpointer:
        restored = checkpointer.restore(step_dir / STATE, args=ocp.args.PyTreeRestore(
            item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True))
    return {tuple(_key(k) for k in p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(restored["params"])[0]}


def load_adapted(path: str | pathlib.Path, *, base: str | pathlib.Path | None = None) -> nnx.Module:
    """The model of a LoRA run's checkpoint with its adapters unmerged (qwix-intercepted projections, in the
    stored config): the base weights (``meta["base"]``, or ``base`` when they have moved; their fingerprint must
    match), ``apply_lora`` with the stored settings, then the stored adapters and fully trained parameters."""
    from flaxzoo.models.hub import from_pretrained
    from flaxzoo.models.hub.files import is_hub_id
    from flaxzoo.models.hub.source import fingerprint
    from flaxzoo.models.lora import LoraConfig, apply_lora

    step_dir = find_step_dir(path)
    if step_dir is None:
        raise ValueError(f"{path} holds no flaxzoo checkpoint step (expected checkpoints/<step>/{{state,meta}})")
    meta = read_meta(step_dir)
    if "lora" not in meta:
        raise ValueError(f"{step_dir} is not a LoRA run's checkpoint (its meta has no 'lora')")
    stored_base = meta.get("base") or {}
    source = str(base) if base is not None else stored_base.get("path")
    if not source or not (pathlib.Path(source).exists() or is_hub_id(source)):
        raise FileNotFoundError(f"{step_dir}: the LoRA base {source!r} is not there; pass base= (the same weights "
                                f"elsewhere: fingerprint {stored_base.get('fingerprint')})")
    found = fingerprint(source)
    if found != stored_base.get("fingerprint"):
        raise ValueError(f"{step_dir}: the adapters were trained on {stored_base.get('path')} "
                         f"({stored_base.get('fingerprint')}), but {source} is {found}: other base weights")
    config = TransformerConfig.from_dict(meta["config"])
    model_cls = MODEL_CLASSES[meta["model_class"]]
    loaded = from_pretrained(source, cls=model_cls, scan_layers=config.scan_layers)
    values = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(loaded, nnx.Param))}
    model = assemble_model(config, model_cls, values)
    lora = meta["lora"]
    apply_lora(model, LoraConfig.from_dict(lora), seed=0)
    trained = _restore_params(step_dir, _stored_params(step_dir))
    state = nnx.state(model, nnx.Param)
    flat = dict(nnx.to_flat_state(state))
    missing = sorted(dotted(p) for p in trained if p not in flat)
    if missing:
        raise ValueError(f"{step_dir}: stored parameters {format_names(missing)} are not in the adapted model")
    nnx.update(model, nnx.from_flat_state([(p, flat[p].replace(jax.numpy.asarray(v, flat[p].get_value().dtype)))
                                           for p, v in trained.items()]))
    model.eval()
    return model


def _target_class(cls: type | str | None, stored_cls: type, config: TransformerConfig, step_dir: pathlib.Path
                  ) -> type:
    """The class to build: ``cls`` (a class or its name) when it is of the stored config's kind, else ValueError."""
    if cls is None:
        return stored_cls
    kind = "decoder" if config.causal else "encoder"
    allowed = {name: c for name, c in MODEL_CLASSES.items() if (c in DECODER_CLASSES) == config.causal}
    name = cls if isinstance(cls, str) else getattr(cls, "__name__", repr(cls))
    if name not in allowed or (not isinstance(cls, str) and allowed[name] is not cls):
        raise ValueError(f"{step_dir} holds a {stored_cls.__name__} ({kind}); cls={name!r} does not match: it loads "
                         f"as one of {sorted(allowed)}")
    return allowed[name]


def save_checkpoint(model: nnx.Module, workdir: str | pathlib.Path, *, step: int = 0,
                    train_config: Mapping[str, Any] | None = None) -> pathlib.Path:
    """Write ``model`` as a flaxzoo checkpoint under ``workdir/checkpoints/<step>`` (items ``state`` with ``params``
    only, and ``meta``); returns the step directory. Refuses a step that already exists."""
    ocp = _ocp()
    root = pathlib.Path(workdir).expanduser().absolute() / CHECKPOINT_DIR
    if (root / str(step)).exists():
        raise FileExistsError(f"{root / str(step)} already exists; choose another directory")
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    with ocp.CheckpointManager(root) as manager:
        manager.save(step, args=ocp.args.Composite(**{
            STATE: ocp.args.StandardSave({"params": params}),
            META: ocp.args.JsonSave(checkpoint_meta(model, train_config))}))
        manager.wait_until_finished()
    return root / str(step)
