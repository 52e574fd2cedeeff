"""``from_pretrained`` / ``save_pretrained``: every source through one entry point, every family through its table.

Loading: read the config and the tensors (``files``), pick the family and class (``registry``), check the tensors
against the family's table (``mapping``: names, shapes; strict), translate them, and assemble the model for the
requested config (``flaxzoo.models.modeling.assemble_model``: per-layer or stacked blocks, head tensors the checkpoint lacks
initialised). Saving walks the same table the other way.
"""

from __future__ import annotations

import pathlib
from typing import Any, Callable

import numpy as np
from flax import nnx

from flaxzoo.models.bert import BertForSequenceClassification
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.hub.fields import ACTIVATIONS_TO_HF, common_to_hf, labels_to_hf
from flaxzoo.models.hub.files import (PathLike, checkpoint_kind, read_config, read_weights, resolve_pretrained,
                              weight_files, write_hf_directory)
from flaxzoo.models.hub.llama import gguf_llama_weights
from flaxzoo.models.hub.mapping import (Family, ParamPath, WeightMap, check_coverage, expected_hf_shapes,
                                match_tensors)
from flaxzoo.models.hub.registry import family_and_class, family_of
from flaxzoo.models.layers.stack import unstack_layer_values
from flaxzoo.models.modeling import (abstract_params, assemble_model, override_config, per_layer_shapes,
                             resize_vocab_values, vocab_axes, vocab_shapes, warn_initialised)

Overrides = dict[str, Any]  # override_config's keyword arguments


def load_tensors(config: TransformerConfig, factory: Callable[..., nnx.Module], weights: WeightMap,
                 tensors: dict[str, Any], where: str, seed: int, quantize: str | None = None) -> nnx.Module:
    """Check ``tensors`` against the table ``weights`` (names, shapes), translate them, and build the model; the
    head tensors the checkpoint lacks are initialised (at ``seed``) and listed in one warning. The checkpoint holds
    ``config.vocab_size`` vocabulary rows; a padded model (``config.pad_vocab_to``) gets zero padding rows.

    ``tensors`` values are arrays or anything ``np.asarray`` turns into one (a GGUF tensor is dequantised only
    then), each read once. ``quantize`` (``flaxzoo.models.quantize``): each projection is quantised as soon as it is
    translated, so the float projections of the whole model are never held at once."""
    abstract = abstract_params(config, factory)
    shapes = per_layer_shapes(abstract[2], config.num_layers)
    vocab = vocab_axes(abstract[1])
    weights = weights.for_params(shapes)
    check_coverage(weights, shapes, where)
    hf_shapes = vocab_shapes(shapes, vocab, config.vocab_size)
    lacking = match_tensors(tensors, weights, expected_hf_shapes(weights, hf_shapes), where)
    values: dict[ParamPath, Any] = {}
    fresh: list[ParamPath] = []
    quantized = None
    if quantize is not None:
        from flaxzoo.models.quantize import QuantizedAssembly

        quantized = QuantizedAssembly(config, factory, quantize, seed=seed)
    for e in weights.entries:
        if e.hf in lacking:
            fresh += e.paths
        else:
            translated = zip(e.paths, e.transform.to_flax(np.asarray(tensors.pop(e.hf))))
            if quantized is None:
                values.update(translated)
            else:
                for path, value in translated:
                    values.update(quantized.quantize_value(path, value))
    if lacking:
        warn_initialised(where, lacking, seed)
    values = resize_vocab_values(values, vocab, config.padded_vocab_size)
    if quantized is not None:
        return quantized.assemble(values, fresh=fresh)
    return assemble_model(config, factory, values, abstract=abstract, fresh=fresh, seed=seed)


def from_hf_directory(directory: pathlib.Path, cls: type | str | None, allow_pickle: bool, progress: bool,
                      overrides: Overrides, seed: int, quantize: str | None = None) -> nnx.Module:
    """A Hugging Face directory: ``config.json`` and its weights."""
    hf = read_config(directory)
    family, model_cls = family_and_class(hf, cls)
    weight_files(directory, allow_pickle)  # no weights at all: say so before judging the config's fields
    config = override_config(family.config_from_hf(hf), **overrides)
    tensors = read_weights(directory, allow_pickle, progress)
    if family.rename is not None:
        tensors = {family.rename(name): t for name, t in tensors.items()}
    prefix = family.base_prefix + "."
    prefixed = any(name.startswith(prefix) for name in tensors)
    base = prefix if prefixed else ""
    if model_cls is family.base_class and prefixed:
        # A head checkpoint loaded as the base model: keep the base model's tensors only.
        tensors = {name: t for name, t in tensors.items() if name.startswith(prefix)}
    return load_tensors(config, family.factory(model_cls, tensors.keys(), base),
                        family.weights(config, model_cls, base), tensors,
                        f"{directory} ({family.model_type}, flaxzoo {model_cls.__name__})", seed, quantize)


def from_gguf(file: pathlib.Path, cls: type | str | None, progress: bool, overrides: Overrides,
              seed: int, quantize: str | None = None) -> nnx.Module:
    """A Llama-architecture GGUF: config from its metadata, dequantised tensors through the GGUF name table, one
    tensor at a time (``GGUFFile.lazy_tensors``)."""
    from flaxzoo.models.gguf import GGUFFile, llama_hf_config

    gguf_file = GGUFFile(file)
    hf = llama_hf_config(gguf_file)
    family, model_cls = family_and_class(hf, cls)
    # llama.cpp stores Q and K rows in the interleaved RoPE pair layout: keep them, and rotate those pairs.
    config = override_config(family.config_from_hf(hf).replace(rope_layout="interleaved"), **overrides)
    tensors = gguf_file.lazy_tensors(progress=progress)
    return load_tensors(config, model_cls, gguf_llama_weights(config, model_cls), tensors,
                        f"{file} (GGUF {gguf_file.architecture}, flaxzoo {model_cls.__name__})", seed, quantize)


def from_pretrained(path: PathLike, *, cls: type | str | None = None, allow_pickle: bool = False,
                    dtype: Any = None, revision: str | None = None, progress: bool = False,
                    scan_layers: bool | None = None, num_labels: int | None = None, pad_vocab_to: int | None = None,
                    seed: int = 0, quantize: str | None = None) -> nnx.Module:
    """Load a pretrained model (in eval mode) from a Hugging Face directory, a GGUF file, a flaxzoo training
    checkpoint, or a Hugging Face Hub id.

    Args:
      path: one of
        * a Hugging Face model directory: ``config.json`` and ``model.safetensors`` (or
          ``model.safetensors.index.json`` and its shards). Supported: ``bert`` and ``roberta`` (Model, ForMaskedLM,
          ForSequenceClassification, ForTokenClassification), ``gpt2`` (GPT2Model, GPT2LMHeadModel), ``llama``
          (LlamaModel, LlamaForCausalLM);
        * a ``.gguf`` file (llama.cpp) of the Llama architecture, dequantised from any type the ``gguf`` package
          reads (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, K-quants ...), or a directory holding one;
        * a flaxzoo training checkpoint: a ``python -m flaxzoo.train`` work directory, its ``checkpoints/`` folder or one
          step folder (the latest step is taken; only the parameters are read);
        * a Hub id such as ``"openai-community/gpt2"`` (any string that is not an existing local path): its config,
          safetensors and tokenizer files (never pickles) are fetched into the standard Hugging Face cache, or
          found there when offline (``HF_HUB_OFFLINE=1``).
      cls: the flaxzoo class (or its name) to build; default: the counterpart of ``architectures[0]`` (a flaxzoo
        checkpoint: the class it was trained as). Another class of the same family takes what it shares with the
        checkpoint: a base class (``BertModel``, ``GPTModel``) skips the head's tensors (a ``BertModel`` gets a
        pooler only if the checkpoint has one); a head the checkpoint lacks (an encoder checkpoint loaded as
        ``BertForSequenceClassification``: its classifier, and the pooler if absent) is initialised with the
        model's initialisers at ``seed`` and listed in one warning. Everything else loads strictly.
      allow_pickle: read a legacy ``pytorch_model.bin`` with ``torch.load(weights_only=True)`` (needs torch). Off by
        default: a pickle can run code when loaded.
      dtype: parameter and compute dtype (e.g. ``"bfloat16"``); default float32 whatever the checkpoint stores (a
        flaxzoo checkpoint: its config's dtypes).
      revision: the Hub branch, tag or commit for a Hub id.
      progress: show progress bars while reading large files.
      scan_layers: the layer layout to build (``config.scan_layers``: blocks stacked ``[num_layers, ...]`` and run
        as one scan); None: per layer for Hugging Face / GGUF sources, the stored config's for a flaxzoo checkpoint.
      num_labels: the number of labels of a classifier head (default: the checkpoint's). The checkpoint's class
        names (``id2label`` names other than ``LABEL_i``: ``config.label_names``) are kept when they still fit, and
        dropped (None) for another number of labels.
      pad_vocab_to: pad the vocabulary tables' rows to a multiple of this (``config.pad_vocab_to``; e.g. 128 so
        that GPT-2's 50,257 rows split over an FSDP axis). Hugging Face / GGUF tables get zero padding rows; a
        flaxzoo checkpoint's padding rows are trimmed or extended. The logits keep the padded width with the padding
        ids masked; ``save_pretrained`` drops the padding again. None: the checkpoint's (1 = no padding for Hugging
        Face / GGUF sources).
      seed: the seed of the initialisers for head tensors the checkpoint lacks.
      quantize: ``"int8"``: weight-only int8 inference through qwix (``models/quantize.py``). Every attention
        query / key / value / out and MLP gate / up / down projection holds int8 weights with one float scale per
        output channel (symmetric absmax); the activations stay float and each projection's int8 kernel is
        dequantised inside its matmul. The embeddings, norms, biases, BERT's pooler and classifier / MLM heads and
        the LM head stay float (a tied LM head reads the float embedding table, as the float model does). A GGUF
        or Hugging Face source is quantised projection by projection as it is read (the float projections of the
        whole model are never held); a flaxzoo checkpoint is loaded, then quantised. ``generate``, ``embed`` and
        ``classify`` take the result as they take a float model; ``save_pretrained`` and training do not. None:
        float weights.

    Raises:
      FileNotFoundError: a local path that does not exist; a Hub id neither downloadable nor in the cache.
      ValueError: unsupported model type / architecture / config feature / GGUF architecture or tensor type;
        missing, unexpected or mis-shaped tensors (each named); a pickle without ``allow_pickle``; a directory
        holding no model (its contents are listed); a bad ``scan_layers`` / ``num_labels`` / ``quantize`` (another
        value than ``"int8"`` or None).

    Special-token ids outside the vocabulary (``GPT2Config(vocab_size=1000)`` keeps GPT-2's 50256) are dropped with a
    warning: only generation uses them.
    """
    from flaxzoo.models.quantize import check_quantize, quantize_model

    quantize = check_quantize(quantize)  # before anything is read
    source = resolve_pretrained(path, revision=revision)
    kind, source = checkpoint_kind(source)
    if kind == "flaxzoo":
        from flaxzoo.models.checkpoint import load_checkpoint

        model = load_checkpoint(source, cls=cls, dtype=dtype, scan_layers=scan_layers, num_labels=num_labels,
                                pad_vocab_to=pad_vocab_to, seed=seed)
        return model if quantize is None else quantize_model(model, quantize)
    overrides = dict(dtype=dtype, scan_layers=False if scan_layers is None else scan_layers, num_labels=num_labels,
                     pad_vocab_to=pad_vocab_to)
    if kind == "gguf":
        return from_gguf(source, cls, progress, overrides, seed, quantize)
    return from_hf_directory(source, cls, allow_pickle, progress, overrides, seed, quantize)


# --------------------------------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------------------------------

def check_saveable(config: TransformerConfig, family: Family) -> None:
    """ValueError naming every field Hugging Face's ``family`` classes cannot express."""
    problems = [f"{field}={getattr(config, field)!r} (Hugging Face {family.model_type} needs {want!r})"
                for field, want in family.layout.items() if getattr(config, field) != want]
    problems += family.save_problems(config)
    if config.activation not in ACTIVATIONS_TO_HF:
        problems.append(f"activation={config.activation!r} (no Hugging Face name)")
    if problems:
        raise ValueError(f"cannot write this model as a Hugging Face {family.model_type} checkpoint: "
                         + "; ".join(problems) + " (config.model_type selects the Hugging Face layout)")


def interleaved_to_half(values: dict[ParamPath, np.ndarray], config: TransformerConfig) -> None:
    """Permute query/key output features from the interleaved RoPE pair layout to Hugging Face's rotate-half.

    Pairs ``(2i, 2i+1)`` become ``(i, i + head_dim/2)``; the same permutation of queries and keys leaves every score
    unchanged.
    """
    perm = np.concatenate([np.arange(0, config.head_dim, 2), np.arange(1, config.head_dim, 2)])
    for path in list(values):
        if len(path) >= 3 and path[-3] == "attention" and path[-2] in ("query", "key"):
            values[path] = np.take(values[path], perm, axis=-1)


def save_pretrained(model: nnx.Module, path: PathLike) -> pathlib.Path:
    """Write ``model`` as a Hugging Face directory: ``config.json`` and ``model.safetensors`` (float32).

    The result loads with ``transformers.AutoModelFor...from_pretrained(path)`` with no missing or unexpected
    weights (a ``BertModel`` built without a pooler is the exception: Hugging Face's has one and initialises it).
    Stacked layers (``scan_layers``) are written per layer; tied tables once, as Hugging Face does. A Llama model in
    the interleaved RoPE layout is written in Hugging Face's rotate-half layout (queries and keys permuted, same
    outputs). A padded vocabulary (``config.pad_vocab_to``) is written without its padding rows (``vocab_size`` rows,
    as ``config.json`` says). One EOS id is written as an int, several as a list. ``id2label`` / ``label2id`` come from
    ``config.label_names`` (``LABEL_i`` without them). Features Hugging Face's class for
    ``config.model_type`` cannot express (ALiBi, sinusoidal positions, a different norm placement ...) raise
    ``ValueError`` naming them. Returns the directory.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, TransformerConfig):
        raise ValueError(f"save_pretrained expects a flaxzoo model (with a TransformerConfig .config); got "
                         f"{type(model).__name__}")
    from flaxzoo.models.quantize import is_quantized, module_at, projection_paths

    quantized = [".".join(map(str, p)) for p in projection_paths(model) if is_quantized(module_at(model, p))]
    if quantized:
        raise ValueError(f"save_pretrained writes float weights; this model's projections are quantised "
                         f"({len(quantized)} of them, e.g. {quantized[0]}): save the float model it came from")
    family = family_of(config.model_type)
    cls = type(model)
    architecture = family.hf_architecture(cls)
    check_saveable(config, family)

    params = nnx.state(model, nnx.Param)
    values = {p: np.asarray(var.get_value(), dtype=np.float32) for p, var in nnx.to_flat_state(params)}
    values = resize_vocab_values(values, vocab_axes(params), config.vocab_size)  # padding rows are not written
    values = unstack_layer_values(values, config.num_layers)
    if config.position == "rope" and config.rope_layout == "interleaved":
        interleaved_to_half(values, config)
        config = config.replace(rope_layout="half")
    base = "" if cls is family.base_class else family.base_prefix + "."  # HF's base classes save unprefixed
    weights = family.weights(config, cls, base).for_params(values)
    check_coverage(weights, values, f"save_pretrained({cls.__name__}, {family.model_type})")

    tensors = {e.hf: np.ascontiguousarray(e.transform.to_hf(*(values[p] for p in e.paths)))
               for e in weights.entries}
    for name, source in weights.unused.items():
        tensors[name] = tensors[source].copy()
    hf = {"architectures": [architecture], "model_type": family.model_type, **family.config_to_hf(config),
          **common_to_hf(config), "dtype": "float32", "torch_dtype": "float32"}
    if cls is BertForSequenceClassification or config.num_labels != 2 or config.label_names is not None:
        hf.update(labels_to_hf(config))
    return write_hf_directory(path, hf, tensors)

