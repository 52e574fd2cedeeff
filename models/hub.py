"""Pretrained weights in and out: ``from_pretrained`` / ``save_pretrained``.

``from_pretrained`` is the one entry point for every source: a Hugging Face model directory (``config.json`` plus
weights in ``model.safetensors`` or shards listed by ``model.safetensors.index.json``), a GGUF file (llama.cpp; read
by ``models/gguf.py``), a flaxzoo training checkpoint (``models/checkpoint.py``) or a Hugging Face Hub id (fetched
into the standard cache, then loaded as a directory). Weights are read with the safetensors numpy API: no torch at
run time, except for the opt-in ``allow_pickle=True`` path that reads legacy ``pytorch_model.bin`` files.
``save_pretrained`` writes Hugging Face directories.

The translation is table-driven. For each supported ``model_type`` there is

* a config reader and writer (``_bert_config_from_hf`` / ``_bert_config_to_hf`` ...), and
* one weight-map function (``_bert_weights`` ...) listing, per Hugging Face tensor, the flaxzoo parameter path(s) it
  fills and a ``Transform`` whose two directions are written once as a pair of einops patterns.

Loading and saving both walk the same table (``Transform.to_flax`` one way, ``Transform.to_hf`` the other), so the two
directions cannot drift apart. A GGUF file walks the Llama table too, its tensor names translated by
``GGUF_LLAMA_NAMES``. Loading is strict: a tensor the table does not expect, a tensor it expects and does not find, or
a tensor of the wrong shape is a ``ValueError`` that names it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from typing import Any, Callable, Mapping, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from einops import rearrange
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from models.bert import BertForMaskedLM, BertForSequenceClassification, BertModel
from models.config import TransformerConfig
from models.gpt import GPTForCausalLM, GPTModel
from models.modeling import abstract_model

__all__ = ["from_pretrained", "save_pretrained", "SUPPORTED_ARCHITECTURES", "assemble_model", "checkpoint_kind",
           "resolve_pretrained"]

PathLike = Union[str, pathlib.Path]
ParamPath = tuple[Union[str, int], ...]
Array = Any  # np.ndarray, or a jax array / tracer while shapes are being worked out

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"


# --------------------------------------------------------------------------------------------------------------------
# Transforms: one Hugging Face tensor <-> one or more flaxzoo parameters.
# --------------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Transform:
    """Both directions of a layout change. ``to_flax`` returns a tuple (one array per flaxzoo path)."""

    to_flax: Callable[[Array], tuple[Array, ...]]
    to_hf: Callable[..., Array]


def layout(hf: str, flax: str, **sizes: int) -> Transform:
    """A transform given by two einops patterns, the Hugging Face side and the flaxzoo side.

    A flaxzoo pattern that starts with the axis ``parts`` splits one Hugging Face tensor into several flaxzoo
    parameters (GPT-2's fused ``c_attn``: ``layout("d (parts h k)", "parts d h k", parts=3, h=heads)``).
    """
    fused = flax.split()[0] == "parts"

    def to_flax(w: Array) -> tuple[Array, ...]:
        out = rearrange(w, f"{hf} -> {flax}", **sizes)
        return tuple(out[i] for i in range(out.shape[0])) if fused else (out,)

    def to_hf(*ws: Array) -> Array:
        return rearrange(list(ws) if fused else ws[0], f"{flax} -> {hf}", **sizes)

    return Transform(to_flax, to_hf)


IDENTITY = layout("...", "...")
LINEAR = layout("out inp", "inp out")  # torch nn.Linear weight [out, in] <-> Dense kernel [in, out]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One Hugging Face tensor ``hf`` and the flaxzoo parameter ``paths`` it fills through ``transform``."""

    hf: str
    paths: tuple[ParamPath, ...]
    transform: Transform = IDENTITY


def _path(dotted: str) -> ParamPath:
    """``"decoder.layers.3.mlp.up.kernel"`` → ``("decoder", "layers", 3, "mlp", "up", "kernel")``."""
    return tuple(int(part) if part.isdigit() else part for part in dotted.split("."))


def _entry(hf: str, paths: str | Sequence[str], transform: Transform = IDENTITY) -> Entry:
    paths = [paths] if isinstance(paths, str) else paths
    return Entry(hf, tuple(_path(p) for p in paths), transform)


def _linear(hf: str, flax: str, bias: bool, transform: Transform = LINEAR,
            bias_transform: Transform = IDENTITY) -> list[Entry]:
    """``{hf}.weight`` → ``{flax}.kernel`` and, with ``bias``, ``{hf}.bias`` → ``{flax}.bias``."""
    entries = [_entry(f"{hf}.weight", f"{flax}.kernel", transform)]
    if bias:
        entries.append(_entry(f"{hf}.bias", f"{flax}.bias", bias_transform))
    return entries


def _causal_lm_head(config: TransformerConfig, cls: type, embedding: str) -> tuple[list[Entry], dict[str, str]]:
    """``GPTForCausalLM``'s head: tied to the Hugging Face tensor ``embedding``, or its own ``lm_head.weight``.

    Returns (entries to add, tied names ``{hf duplicate: hf source}``)."""
    if cls is not GPTForCausalLM:
        return [], {}
    if config.tie_word_embeddings:
        return [], {"lm_head.weight": embedding}
    return [_entry("lm_head.weight", "lm_head.kernel", LINEAR)], {}


def _norm(hf: str, flax: str, bias: bool = True) -> list[Entry]:
    """A Hugging Face LayerNorm / RMSNorm (``weight``, ``bias``) → flaxzoo norm (``scale``, ``bias``)."""
    entries = [_entry(f"{hf}.weight", f"{flax}.scale")]
    if bias:
        entries.append(_entry(f"{hf}.bias", f"{flax}.bias"))
    return entries


@dataclasses.dataclass
class WeightMap:
    """Everything needed to move one model's weights between the two naming schemes.

    ``entries``: the parameters. ``tied``: Hugging Face names that duplicate another tensor in a tied model (e.g.
    ``lm_head.weight`` = ``transformer.wte.weight``); not written on save, accepted on load only if equal.
    ``unused``: names Hugging Face's class holds but never reads; written on save as copies of the named tensor,
    skipped on load. ``ignored``: regular expressions of non-parameter buffers (and parts of other checkpoint kinds)
    skipped on load.
    """

    entries: list[Entry]
    tied: dict[str, str] = dataclasses.field(default_factory=dict)
    unused: dict[str, str] = dataclasses.field(default_factory=dict)
    ignored: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------------------------------
# BERT
# --------------------------------------------------------------------------------------------------------------------

def _bert_weights(config: TransformerConfig, cls: type, base: str, *, pooler: bool = True) -> WeightMap:
    """Hugging Face BERT names ↔ flaxzoo ``BertModel`` / ``BertForMaskedLM`` / ``BertForSequenceClassification``.

    ``base`` is the Hugging Face prefix of the encoder (``"bert."`` or ``""`` for a bare ``BertModel`` checkpoint).
    """
    h = config.num_heads
    root = "" if cls is BertModel else "bert."
    enc = f"{root}encoder"
    entries = [
        _entry(f"{base}embeddings.word_embeddings.weight", f"{enc}.embeddings.tokens.embedding"),
        _entry(f"{base}embeddings.position_embeddings.weight", f"{enc}.embeddings.positions.embedding"),
        _entry(f"{base}embeddings.token_type_embeddings.weight", f"{enc}.embeddings.token_types"),
        *_norm(f"{base}embeddings.LayerNorm", f"{enc}.embeddings.norm"),
    ]
    for i in range(config.num_layers):
        hf, fz = f"{base}encoder.layer.{i}", f"{enc}.layers.{i}"
        for name in ("query", "key", "value"):
            entries += _linear(f"{hf}.attention.self.{name}", f"{fz}.attention.{name}", True,
                               layout("(h k) d", "d h k", h=h), layout("(h k)", "h k", h=h))
        entries += [
            *_linear(f"{hf}.attention.output.dense", f"{fz}.attention.out", True, layout("d (h k)", "h k d", h=h)),
            *_norm(f"{hf}.attention.output.LayerNorm", f"{fz}.attention_norm"),
            *_linear(f"{hf}.intermediate.dense", f"{fz}.mlp.up", True),
            *_linear(f"{hf}.output.dense", f"{fz}.mlp.down", True),
            *_norm(f"{hf}.output.LayerNorm", f"{fz}.mlp_norm"),
        ]
    tied: dict[str, str] = {}
    unused: dict[str, str] = {}
    ignored = [rf"{re.escape(base)}embeddings\.position_ids"]
    if (cls is BertModel and pooler) or cls is BertForSequenceClassification:
        entries += _linear(f"{base}pooler.dense", f"{root}pooler", True)
    if cls is BertForSequenceClassification:
        entries += _linear("classifier", "classifier", True)
    if cls is BertForMaskedLM:
        entries += [*_linear("cls.predictions.transform.dense", "transform", True),
                    *_norm("cls.predictions.transform.LayerNorm", "transform_norm")]
        # HF's decoder reads ``cls.predictions.decoder.{weight,bias}``. Tied, they are the word embeddings and
        # ``cls.predictions.bias``, and only those are stored; untied, ``cls.predictions.bias`` is a dead copy.
        if config.tie_word_embeddings:
            entries.append(_entry("cls.predictions.bias", "decoder.bias"))
            tied = {"cls.predictions.decoder.weight": f"{base}embeddings.word_embeddings.weight",
                    "cls.predictions.decoder.bias": "cls.predictions.bias"}
        else:
            entries += _linear("cls.predictions.decoder", "decoder", True)
            unused = {"cls.predictions.bias": "cls.predictions.decoder.bias"}
        # A pre-training checkpoint (bert-base-uncased) also holds the pooler and the next-sentence head, which
        # HF's BertForMaskedLM does not have either.
        ignored += [rf"{re.escape(base)}pooler\.dense\.(weight|bias)", r"cls\.seq_relationship\.(weight|bias)"]
    return WeightMap(entries, tied, unused, tuple(ignored))


_ACTIVATIONS_FROM_HF = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                        "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}
_ACTIVATIONS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def _activation(hf: Mapping[str, Any], field: str, default: str) -> str:
    name = hf.get(field, default)
    if name not in _ACTIVATIONS_FROM_HF:
        raise ValueError(f"config.json: {field}={name!r} is not supported; expected one of "
                         f"{sorted(_ACTIVATIONS_FROM_HF)}")
    return _ACTIVATIONS_FROM_HF[name]


def _refuse(hf: Mapping[str, Any], field: str, allowed: Sequence[Any], default: Any) -> None:
    """ValueError naming ``field`` when config.json sets it to a value flaxzoo cannot represent."""
    value = hf.get(field, default)
    if value not in allowed:
        raise ValueError(f"config.json: {field}={value!r} is not supported by flaxzoo (supported: {list(allowed)})")


def _num_labels(hf: Mapping[str, Any]) -> int:
    if hf.get("id2label"):
        return len(hf["id2label"])
    return int(hf.get("num_labels", 2))


def _token_id(hf: Mapping[str, Any], field: str) -> int | None:
    """A special-token id; lists (several EOS ids) keep their first entry."""
    value = hf.get(field)
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return value


def _common_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    return dict(num_labels=_num_labels(hf), initializer_range=hf.get("initializer_range", 0.02),
                pad_token_id=_token_id(hf, "pad_token_id"), bos_token_id=_token_id(hf, "bos_token_id"),
                eos_token_id=_token_id(hf, "eos_token_id"))


def _bert_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    _refuse(hf, "position_embedding_type", ["absolute"], "absolute")
    _refuse(hf, "is_decoder", [False], False)
    _refuse(hf, "add_cross_attention", [False], False)
    return TransformerConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf.get("max_position_embeddings", 512), model_type="bert", causal=False,
        position="learned", norm="layernorm", norm_eps=hf.get("layer_norm_eps", 1e-12), norm_placement="post",
        embedding_norm=True, final_norm=False, activation=_activation(hf, "hidden_act", "gelu"), mlp_gated=False,
        attention_bias=True, mlp_bias=True, tie_word_embeddings=hf.get("tie_word_embeddings", True),
        type_vocab_size=hf.get("type_vocab_size", 2), dropout=hf.get("hidden_dropout_prob", 0.1),
        **(_common_from_hf(hf) | {"pad_token_id": hf.get("pad_token_id", 0)}))


def _bert_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    return {
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "intermediate_size": config.intermediate_size,
        "hidden_act": _ACTIVATIONS_TO_HF[config.activation], "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.dropout, "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size, "layer_norm_eps": config.norm_eps,
        "position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False,
    }


_BERT_LAYOUT = dict(causal=False, position="learned", norm="layernorm", norm_placement="post", embedding_norm=True,
                    final_norm=False, mlp_gated=False, attention_bias=True, mlp_bias=True)


# --------------------------------------------------------------------------------------------------------------------
# GPT-2
# --------------------------------------------------------------------------------------------------------------------

def _gpt2_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """Hugging Face GPT-2 names ↔ flaxzoo ``GPTModel`` / ``GPTForCausalLM``.

    GPT-2 uses ``Conv1D`` (weights ``[in, out]``, no transpose) and fuses query, key and value in ``c_attn``.
    """
    h = config.num_heads
    stack = "decoder" if cls is GPTModel else "transformer.decoder"
    entries = [
        _entry(f"{base}wte.weight", f"{stack}.embeddings.tokens.embedding"),
        _entry(f"{base}wpe.weight", f"{stack}.embeddings.positions.embedding"),
        *_norm(f"{base}ln_f", f"{stack}.final_norm"),
    ]
    for i in range(config.num_layers):
        hf, fz = f"{base}h.{i}", f"{stack}.layers.{i}"
        qkv = [f"{fz}.attention.{name}" for name in ("query", "key", "value")]
        entries += [
            *_norm(f"{hf}.ln_1", f"{fz}.attention_norm"),
            _entry(f"{hf}.attn.c_attn.weight", [f"{p}.kernel" for p in qkv],
                   layout("d (parts h k)", "parts d h k", parts=3, h=h)),
            _entry(f"{hf}.attn.c_attn.bias", [f"{p}.bias" for p in qkv],
                   layout("(parts h k)", "parts h k", parts=3, h=h)),
            *_linear(f"{hf}.attn.c_proj", f"{fz}.attention.out", True, layout("(h k) d", "h k d", h=h)),
            *_norm(f"{hf}.ln_2", f"{fz}.mlp_norm"),
            *_linear(f"{hf}.mlp.c_fc", f"{fz}.mlp.up", True, IDENTITY),
            *_linear(f"{hf}.mlp.c_proj", f"{fz}.mlp.down", True, IDENTITY),
        ]
    head, tied = _causal_lm_head(config, cls, f"{base}wte.weight")
    entries += head
    # Old checkpoints store the causal-mask buffers.
    return WeightMap(entries, tied, ignored=(rf"{re.escape(base)}h\.\d+\.attn\.(bias|masked_bias)",))


def _gpt2_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    _refuse(hf, "scale_attn_weights", [True], True)
    _refuse(hf, "scale_attn_by_inverse_layer_idx", [False], False)
    _refuse(hf, "reorder_and_upcast_attn", [False], False)
    _refuse(hf, "add_cross_attention", [False], False)
    width = hf["n_embd"]
    return TransformerConfig(
        vocab_size=hf["vocab_size"], hidden_size=width, num_layers=hf["n_layer"], num_heads=hf["n_head"],
        intermediate_size=hf.get("n_inner") or 4 * width, max_position_embeddings=hf.get("n_positions", 1024),
        model_type="gpt2", causal=True, position="learned", norm="layernorm",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), norm_placement="pre", embedding_norm=False, final_norm=True,
        activation=_activation(hf, "activation_function", "gelu_new"), mlp_gated=False, attention_bias=True,
        mlp_bias=True, tie_word_embeddings=hf.get("tie_word_embeddings", True), type_vocab_size=0,
        dropout=hf.get("resid_pdrop", 0.1), **_common_from_hf(hf))


def _gpt2_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    return {
        "vocab_size": config.vocab_size, "n_embd": config.hidden_size, "n_layer": config.num_layers,
        "n_head": config.num_heads, "n_inner": config.intermediate_size,
        "n_positions": config.max_position_embeddings, "layer_norm_epsilon": config.norm_eps,
        "activation_function": _ACTIVATIONS_TO_HF[config.activation], "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout, "attn_pdrop": config.dropout, "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False, "add_cross_attention": False,
    }


_GPT2_LAYOUT = dict(causal=True, position="learned", norm="layernorm", norm_placement="pre", embedding_norm=False,
                    final_norm=True, mlp_gated=False, attention_bias=True, mlp_bias=True, type_vocab_size=0)


# --------------------------------------------------------------------------------------------------------------------
# Llama
# --------------------------------------------------------------------------------------------------------------------

def _llama_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """Hugging Face Llama names ↔ flaxzoo ``GPTModel`` / ``GPTForCausalLM`` (RMSNorm, SwiGLU, RoPE, GQA)."""
    h, kv, ab, mb = config.num_heads, config.num_kv_heads, config.attention_bias, config.mlp_bias
    stack = "decoder" if cls is GPTModel else "transformer.decoder"
    entries = [
        _entry(f"{base}embed_tokens.weight", f"{stack}.embeddings.tokens.embedding"),
        *_norm(f"{base}norm", f"{stack}.final_norm", bias=False),
    ]
    for i in range(config.num_layers):
        hf, fz = f"{base}layers.{i}", f"{stack}.layers.{i}"
        for hf_name, name, heads in (("q_proj", "query", h), ("k_proj", "key", kv), ("v_proj", "value", kv)):
            entries += _linear(f"{hf}.self_attn.{hf_name}", f"{fz}.attention.{name}", ab,
                               layout("(h k) d", "d h k", h=heads), layout("(h k)", "h k", h=heads))
        entries += [
            *_linear(f"{hf}.self_attn.o_proj", f"{fz}.attention.out", ab, layout("d (h k)", "h k d", h=h)),
            *_norm(f"{hf}.input_layernorm", f"{fz}.attention_norm", bias=False),
            *_norm(f"{hf}.post_attention_layernorm", f"{fz}.mlp_norm", bias=False),
            *_linear(f"{hf}.mlp.gate_proj", f"{fz}.mlp.gate", mb),
            *_linear(f"{hf}.mlp.up_proj", f"{fz}.mlp.up", mb),
            *_linear(f"{hf}.mlp.down_proj", f"{fz}.mlp.down", mb),
        ]
    head, tied = _causal_lm_head(config, cls, f"{base}embed_tokens.weight")
    entries += head
    # Old checkpoints store the RoPE frequencies.
    return WeightMap(entries, tied, ignored=(rf"{re.escape(base)}layers\.\d+\.self_attn\.rotary_emb\.inv_freq",))


def _rope_theta(hf: Mapping[str, Any]) -> float:
    """RoPE θ from ``rope_parameters`` (transformers v5) or top-level ``rope_theta`` (older); only plain RoPE."""
    params = hf.get("rope_parameters")
    if params is not None:
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"config.json: rope_parameters.rope_type={rope_type!r} is not supported by flaxzoo "
                             "(supported: ['default'], plain RoPE without scaling)")
        return float(params.get("rope_theta", hf.get("rope_theta", 10_000.0)))
    scaling = hf.get("rope_scaling")
    if scaling is not None:
        rope_type = scaling.get("rope_type", scaling.get("type"))
        if rope_type != "default":
            raise ValueError(f"config.json: rope_scaling={scaling!r} is not supported by flaxzoo "
                             "(supported: null or rope_type 'default')")
    return float(hf.get("rope_theta", 10_000.0))


def _llama_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], num_kv_heads=hf.get("num_key_value_heads"),
        head_dim=hf.get("head_dim"), intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf.get("max_position_embeddings", 2048), model_type="llama", causal=True,
        position="rope", rope_theta=_rope_theta(hf), rope_layout="half", norm="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6), norm_placement="pre", embedding_norm=False, final_norm=True,
        activation=_activation(hf, "hidden_act", "silu"), mlp_gated=True,
        attention_bias=hf.get("attention_bias", False), mlp_bias=hf.get("mlp_bias", False),
        tie_word_embeddings=hf.get("tie_word_embeddings", False), type_vocab_size=0, dropout=0.0,
        **_common_from_hf(hf))


def _llama_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    return {
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings, "rms_norm_eps": config.norm_eps,
        # transformers v5 reads rope_parameters, v4 the top-level rope_theta.
        "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"}, "rope_theta": config.rope_theta,
        "hidden_act": _ACTIVATIONS_TO_HF[config.activation], "attention_bias": config.attention_bias,
        "mlp_bias": config.mlp_bias, "attention_dropout": 0.0, "pretraining_tp": 1,
    }


_LLAMA_LAYOUT = dict(causal=True, position="rope", norm="rmsnorm", norm_placement="pre", embedding_norm=False,
                     final_norm=True, mlp_gated=True, type_vocab_size=0)


# --------------------------------------------------------------------------------------------------------------------
# GGUF (llama.cpp) names of the Llama tensors
# --------------------------------------------------------------------------------------------------------------------

# Hugging Face name (a regular expression) -> llama.cpp's name, as llama.cpp's convert_hf_to_gguf.py writes them.
# Dequantised GGUF projections are [out, in] like torch's, so the Llama table's transforms apply unchanged; only the
# names differ (and Q/K rows are in the interleaved RoPE layout, which the config records: see models/gguf.py).
GGUF_LLAMA_NAMES: tuple[tuple[str, str], ...] = (
    (r"model\.embed_tokens\.weight", "token_embd.weight"),
    (r"model\.norm\.weight", "output_norm.weight"),
    (r"lm_head\.weight", "output.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"blk.\1.attn_norm.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"blk.\1.ffn_norm.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)", r"blk.\1.attn_q.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.(weight|bias)", r"blk.\1.attn_k.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.(weight|bias)", r"blk.\1.attn_v.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.(weight|bias)", r"blk.\1.attn_output.\2"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.(weight|bias)", r"blk.\1.ffn_gate.\2"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.(weight|bias)", r"blk.\1.ffn_up.\2"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.(weight|bias)", r"blk.\1.ffn_down.\2"),
)


def gguf_name(hf_name: str) -> str:
    """``"model.layers.3.self_attn.q_proj.weight"`` → ``"blk.3.attn_q.weight"``."""
    for pattern, replacement in GGUF_LLAMA_NAMES:
        if re.fullmatch(pattern, hf_name):
            return re.sub(pattern, replacement, hf_name)
    raise KeyError(f"no GGUF name for the Hugging Face tensor {hf_name}")


def _gguf_llama_weights(config: TransformerConfig, cls: type) -> WeightMap:
    """The Llama table with llama.cpp's names. A GGUF has no base-model prefix; loading only the base model
    (``cls=GPTModel``) skips the output projection."""
    hf = _llama_weights(config, cls, "model.")
    entries = [dataclasses.replace(e, hf=gguf_name(e.hf)) for e in hf.entries]
    tied = {gguf_name(dup): gguf_name(source) for dup, source in hf.tied.items()}
    return WeightMap(entries, tied, ignored=() if cls is GPTForCausalLM else (r"output\.weight",))


# --------------------------------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Family:
    """One Hugging Face ``model_type``: its architectures, config translation and weight map."""

    model_type: str
    base_prefix: str  # the attribute holding the base model in HF's head classes ("bert", "transformer", "model")
    architectures: dict[str, type]  # HF class name -> flaxzoo class
    config_from_hf: Callable[[Mapping[str, Any]], TransformerConfig]
    config_to_hf: Callable[[TransformerConfig], dict[str, Any]]
    weights: Callable[..., WeightMap]  # (config, flaxzoo class, HF base prefix) -> WeightMap
    layout: dict[str, Any]  # TransformerConfig fields this family fixes (checked before saving)
    base_class: type

    def hf_architecture(self, cls: type) -> str:
        for name, flax_cls in self.architectures.items():
            if flax_cls is cls:
                return name
        raise ValueError(f"flaxzoo {cls.__name__} has no Hugging Face {self.model_type} counterpart; supported: "
                         f"{sorted(c.__name__ for c in self.architectures.values())}")


FAMILIES: dict[str, Family] = {
    "bert": Family("bert", "bert", {"BertModel": BertModel, "BertForMaskedLM": BertForMaskedLM,
                                    "BertForSequenceClassification": BertForSequenceClassification},
                   _bert_config_from_hf, _bert_config_to_hf, _bert_weights, _BERT_LAYOUT, BertModel),
    "gpt2": Family("gpt2", "transformer", {"GPT2Model": GPTModel, "GPT2LMHeadModel": GPTForCausalLM},
                   _gpt2_config_from_hf, _gpt2_config_to_hf, _gpt2_weights, _GPT2_LAYOUT, GPTModel),
    "llama": Family("llama", "model", {"LlamaModel": GPTModel, "LlamaForCausalLM": GPTForCausalLM},
                    _llama_config_from_hf, _llama_config_to_hf, _llama_weights, _LLAMA_LAYOUT, GPTModel),
}

SUPPORTED_ARCHITECTURES: dict[str, list[str]] = {k: list(f.architectures) for k, f in FAMILIES.items()}


def _supported() -> str:
    return "; ".join(f"{k}: {', '.join(v)}" for k, v in SUPPORTED_ARCHITECTURES.items())


def _names(names: Sequence[str], limit: int = 20) -> str:
    names = sorted(names)
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


# --------------------------------------------------------------------------------------------------------------------
# Reading checkpoints
# --------------------------------------------------------------------------------------------------------------------

_ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def _read_safetensors(file: pathlib.Path) -> dict[str, np.ndarray]:
    """All tensors of one safetensors file as numpy arrays.

    The safetensors numpy API has no bfloat16 (nor float8); such tensors are read at the offsets the file's header
    gives, as ``ml_dtypes`` arrays (the types JAX uses).
    """
    with open(file, "rb") as raw:
        header_size = int.from_bytes(raw.read(8), "little")
        header = json.loads(raw.read(header_size))
    tensors: dict[str, np.ndarray] = {}
    with safe_open(file, framework="np") as f:
        for name in f.keys():
            info = header[name]
            if info["dtype"] in _ML_DTYPES:
                import ml_dtypes  # a JAX dependency

                begin, end = info["data_offsets"]
                data = np.fromfile(file, dtype=np.uint8, count=end - begin, offset=8 + header_size + begin)
                tensors[name] = data.view(getattr(ml_dtypes, _ML_DTYPES[info["dtype"]])).reshape(info["shape"])
            else:
                tensors[name] = f.get_tensor(name)
    return tensors


def _read_pickle(file: pathlib.Path) -> dict[str, np.ndarray]:
    import torch  # only on the opt-in legacy path

    state = torch.load(file, map_location="cpu", weights_only=True)
    return {name: (t.float() if t.dtype == torch.bfloat16 else t).numpy() for name, t in state.items()}


def _shards(directory: pathlib.Path, index_name: str) -> list[pathlib.Path]:
    index = json.loads((directory / index_name).read_text())
    files = sorted(set(index["weight_map"].values()))
    missing = [f for f in files if not (directory / f).is_file()]
    if missing:
        raise ValueError(f"{directory / index_name} lists shard files that are not in the directory: "
                         f"{_names(missing)}")
    return [directory / f for f in files]


def _weight_files(directory: pathlib.Path, allow_pickle: bool
                  ) -> tuple[list[pathlib.Path], Callable[[pathlib.Path], dict[str, np.ndarray]]]:
    """The weight files of the checkpoint in ``directory`` and their reader: safetensors (single or sharded), or
    opt-in pickles. Raises ValueError (listing the directory) when there are none."""
    if (directory / SAFETENSORS).is_file():
        files, reader = [directory / SAFETENSORS], _read_safetensors
    elif (directory / SAFETENSORS_INDEX).is_file():
        files, reader = _shards(directory, SAFETENSORS_INDEX), _read_safetensors
    elif (directory / PICKLE).is_file() or (directory / PICKLE_INDEX).is_file():
        name = PICKLE if (directory / PICKLE).is_file() else PICKLE_INDEX
        if not allow_pickle:
            raise ValueError(
                f"{directory} holds {name}, a Python pickle (loading one can run arbitrary code) and no "
                f"{SAFETENSORS}; pass allow_pickle=True to read it with torch.load(weights_only=True) (needs torch), "
                "or convert it to safetensors")
        files = [directory / PICKLE] if name == PICKLE else _shards(directory, PICKLE_INDEX)
        reader = _read_pickle
    else:
        raise ValueError(f"{directory} holds no model weights: expected {SAFETENSORS} or {SAFETENSORS_INDEX} "
                         f"(or {PICKLE} with allow_pickle=True) beside config.json, or a .gguf file; the directory "
                         f"holds {_listing(directory)}")
    return files, reader


def _read_weights(directory: pathlib.Path, allow_pickle: bool, progress: bool = False) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint in ``directory``."""
    files, reader = _weight_files(directory, allow_pickle)
    tensors: dict[str, np.ndarray] = {}
    for file in _progress(files, progress and len(files) > 1, "reading shards"):
        tensors.update(reader(file))
    return tensors


def _progress(items: Sequence[Any], enabled: bool, desc: str, unit: str = "file"):
    """``items`` wrapped in a tqdm progress bar when ``enabled``."""
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit=unit)


def _listing(directory: pathlib.Path) -> str:
    contents = sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir())
    return _names(contents) if contents else "nothing (it is empty)"


def _read_config(directory: pathlib.Path) -> dict[str, Any]:
    file = directory / "config.json"
    if not file.is_file():
        raise ValueError(f"{directory} has no config.json; the directory holds {_listing(directory)}")
    return json.loads(file.read_text())


def _family_and_class(hf: Mapping[str, Any], cls: type | str | None) -> tuple[Family, type]:
    architectures = hf.get("architectures") or []
    model_type = hf.get("model_type")
    if model_type is None and architectures:  # an old config.json: recognise the architecture
        model_type = next((k for k, f in FAMILIES.items() if architectures[0] in f.architectures), None)
    if model_type not in FAMILIES:
        raise ValueError(f"unsupported model_type {model_type!r} (architectures {architectures}); flaxzoo loads "
                         f"{_supported()}")
    family = FAMILIES[model_type]
    if cls is None:
        if not architectures:
            return family, family.base_class
        if architectures[0] not in family.architectures:
            raise ValueError(f"unsupported architecture {architectures[0]!r} for model_type {model_type!r}; "
                             f"flaxzoo loads {_supported()} (or pass cls= to choose a flaxzoo class)")
        return family, family.architectures[architectures[0]]
    classes = {c.__name__: c for c in family.architectures.values()}
    name = cls if isinstance(cls, str) else getattr(cls, "__name__", repr(cls))
    if name not in classes or (not isinstance(cls, str) and classes[name] is not cls):
        raise ValueError(f"cls={name} cannot hold a {model_type} checkpoint; expected one of {sorted(classes)}")
    return family, classes[name]


# --------------------------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------------------------

AbstractParams = tuple[nnx.GraphDef, nnx.State, dict[ParamPath, jax.ShapeDtypeStruct]]


def _param_shapes(config: TransformerConfig, factory: Callable[..., nnx.Module]) -> AbstractParams:
    """The model's graph, its abstract parameters and their shapes (``eval_shape``: nothing is allocated)."""
    abstract = abstract_model(config, factory)
    graphdef, params, _ = nnx.split(abstract, nnx.Param, ...)
    shapes = {path: var.get_value() for path, var in nnx.to_flat_state(params)}
    return graphdef, params, shapes


def _check_coverage(weights: WeightMap, shapes: Mapping[ParamPath, Any], what: str) -> None:
    covered = [p for e in weights.entries for p in e.paths]
    orphans = set(shapes) - set(covered)
    strays = set(covered) - set(shapes)
    if orphans or strays:  # a config this mapping does not cover
        dotted = lambda paths: _names([".".join(map(str, p)) for p in paths]) or "none"  # noqa: E731
        raise ValueError(f"{what}: flaxzoo parameters with no Hugging Face tensor: {dotted(orphans)}; mapped "
                         f"parameters the model lacks: {dotted(strays)}")


def _expected_hf_shapes(weights: WeightMap, shapes: Mapping[ParamPath, Any]) -> dict[str, tuple[int, ...]]:
    """The shape each Hugging Face tensor must have, from the flaxzoo shapes through ``to_hf`` (no memory used)."""
    def to_hf(params):
        return {e.hf: e.transform.to_hf(*(params[p] for p in e.paths)) for e in weights.entries}
    out = jax.eval_shape(to_hf, {p: jax.ShapeDtypeStruct(s.shape, jnp.float32) for p, s in shapes.items()})
    return {name: tuple(s.shape) for name, s in out.items()}


def _match_tensors(tensors: dict[str, np.ndarray], weights: WeightMap, expected: Mapping[str, tuple[int, ...]],
                   where: str) -> None:
    """Drop ignored / unused / tied duplicates, then require exactly the expected names and shapes."""
    ignored = [re.compile(p) for p in weights.ignored]
    for name in [n for n in tensors if any(p.fullmatch(n) for p in ignored) or n in weights.unused]:
        del tensors[name]
    for dup, source in weights.tied.items():
        if dup in tensors and source in tensors:
            if tensors[dup].shape != tensors[source].shape or not np.array_equal(tensors[dup], tensors[source]):
                raise ValueError(f"{where}: {dup} differs from {source}, but the config ties them "
                                 "(tie_word_embeddings=True); set tie_word_embeddings=false in config.json to keep "
                                 "both")
            del tensors[dup]
    missing = set(expected) - set(tensors)
    unexpected = set(tensors) - set(expected)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors: {_names(missing)}")
        if unexpected:
            parts.append(f"unexpected tensors: {_names(unexpected)}")
        raise ValueError(f"{where}: the checkpoint does not match the model; " + "; ".join(parts))
    wrong = [f"{name}: expected shape {expected[name]}, found {tuple(tensors[name].shape)}"
             for name in sorted(expected) if tuple(tensors[name].shape) != expected[name]]
    if wrong:
        raise ValueError(f"{where}: tensors of the wrong shape: " + "; ".join(wrong))


def _with_dtype(config: TransformerConfig, dtype: Any) -> TransformerConfig:
    if dtype is None:
        return config
    name = jnp.dtype(dtype).name
    return config.replace(dtype=name, param_dtype=name)


def assemble_model(config: TransformerConfig, factory: Callable[..., nnx.Module], values: Mapping[ParamPath, Any],
                   *, abstract: AbstractParams | None = None) -> nnx.Module:
    """A model (in eval mode) whose parameters are ``values`` (flaxzoo path → array), built without random init.

    Every parameter of ``factory(config)`` must be in ``values`` with its shape; values are cast to
    ``config.param_dtype``. ``abstract``: ``_param_shapes(config, factory)`` when the caller already has it (tracing
    a 30-layer model's construction takes about a second).
    """
    graphdef, abstract_params, shapes = abstract or _param_shapes(config, factory)
    param_dtype = jnp.dtype(config.param_dtype)
    missing = sorted(".".join(map(str, p)) for p in set(shapes) - set(values))
    if missing:
        raise ValueError(f"no value for the parameters {_names(missing)}")
    flat = []
    for path, var in nnx.to_flat_state(abstract_params):
        value = values[path]
        if tuple(value.shape) != tuple(shapes[path].shape):
            raise ValueError(f"parameter {'.'.join(map(str, path))}: expected shape {tuple(shapes[path].shape)}, "
                             f"got {tuple(value.shape)}")
        flat.append((path, var.replace(jnp.asarray(value, dtype=param_dtype))))
    params = nnx.from_flat_state(flat)
    # Non-parameter state (dropout RNG streams, fixed tables): built under jit, where the unused random
    # initialisation of the parameters is compiled away.
    rest = jax.jit(lambda: nnx.split(factory(config, rngs=nnx.Rngs(0)), nnx.Param, ...)[2])()
    model = nnx.merge(graphdef, params, rest)
    model.eval()
    return model


def _load_tensors(config: TransformerConfig, factory: Callable[..., nnx.Module], weights: WeightMap,
                  tensors: dict[str, np.ndarray], where: str) -> nnx.Module:
    """Check ``tensors`` against the table ``weights`` (names, shapes), translate them, and build the model."""
    abstract = _param_shapes(config, factory)
    shapes = abstract[2]
    _check_coverage(weights, shapes, where)
    _match_tensors(tensors, weights, _expected_hf_shapes(weights, shapes), where)
    values: dict[ParamPath, Any] = {}
    for entry in weights.entries:
        values.update(zip(entry.paths, entry.transform.to_flax(tensors.pop(entry.hf))))
    return assemble_model(config, factory, values, abstract=abstract)


def _from_hf_directory(directory: pathlib.Path, cls: type | str | None, allow_pickle: bool, dtype: Any,
                       progress: bool) -> nnx.Module:
    hf = _read_config(directory)
    family, model_cls = _family_and_class(hf, cls)
    _weight_files(directory, allow_pickle)  # no weights at all: say so before judging the config's fields
    config = _with_dtype(family.config_from_hf(hf), dtype)
    tensors = _read_weights(directory, allow_pickle, progress)
    if family.model_type == "bert":  # TF-era LayerNorm names
        tensors = {re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", k)):
                   v for k, v in tensors.items()}

    prefix = family.base_prefix + "."
    prefixed = any(name.startswith(prefix) for name in tensors)
    base = prefix if prefixed else ""
    if model_cls is family.base_class and prefixed:
        # A head checkpoint loaded as the base model: keep the base model's tensors only.
        tensors = {name: t for name, t in tensors.items() if name.startswith(prefix)}
    factory: Callable[..., nnx.Module] = model_cls
    extra: dict[str, Any] = {}
    if model_cls is BertModel:
        extra["pooler"] = f"{base}pooler.dense.weight" in tensors
        if not extra["pooler"]:
            factory = bert_without_pooler
    weights = family.weights(config, model_cls, base, **extra)
    return _load_tensors(config, factory, weights, tensors,
                         f"{directory} ({family.model_type}, flaxzoo {model_cls.__name__})")


def bert_without_pooler(config: TransformerConfig, rngs: nnx.Rngs) -> BertModel:
    """A ``BertModel`` factory without the pooler (checkpoints such as all-MiniLM-L6-v2 may lack one)."""
    return BertModel(config, rngs=rngs, add_pooler=False)


def _from_gguf(file: pathlib.Path, cls: type | str | None, dtype: Any, progress: bool) -> nnx.Module:
    """A Llama-architecture GGUF: config from its metadata, dequantised tensors through the GGUF name table."""
    from models.gguf import GGUFFile, llama_hf_config

    gguf_file = GGUFFile(file)
    hf = llama_hf_config(gguf_file)
    family, model_cls = _family_and_class(hf, cls)
    # llama.cpp stores Q and K rows in the interleaved RoPE pair layout: keep them, and rotate those pairs.
    config = _with_dtype(family.config_from_hf(hf).replace(rope_layout="interleaved"), dtype)
    tensors = dict(gguf_file.tensors(progress=progress))
    return _load_tensors(config, model_cls, _gguf_llama_weights(config, model_cls), tensors,
                         f"{file} (GGUF {gguf_file.architecture}, flaxzoo {model_cls.__name__})")


def checkpoint_kind(path: pathlib.Path) -> tuple[str, pathlib.Path]:
    """What ``path`` holds: ``("gguf", file)``, ``("flaxzoo", directory)`` or ``("hf", directory)``.

    A directory is a flaxzoo training checkpoint when it (or its ``checkpoints/``) holds orbax step directories; a
    Hugging Face directory when it has ``config.json`` and weights; otherwise a directory holding exactly one
    ``.gguf`` file stands for that file. Raises ValueError (listing what the directory holds) for anything else.
    """
    from models.checkpoint import find_step_dir
    from models.gguf import is_gguf

    if path.is_file():
        if path.suffix == ".gguf" or is_gguf(path):
            return "gguf", path
        raise ValueError(f"{path} is a file but not a GGUF file: from_pretrained expects a directory (Hugging Face: "
                         f"config.json + {SAFETENSORS}; a flaxzoo checkpoint) or a .gguf file")
    if find_step_dir(path) is not None:
        return "flaxzoo", path
    weight_files = (SAFETENSORS, SAFETENSORS_INDEX, PICKLE, PICKLE_INDEX)
    has_weights = any((path / name).is_file() for name in weight_files)
    if (path / "config.json").is_file() and has_weights:
        return "hf", path
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return "gguf", ggufs[0]
    if len(ggufs) > 1:
        raise ValueError(f"{path} holds several GGUF files ({_names([g.name for g in ggufs])}): pass the path of "
                         "the one to load")
    if (path / "config.json").is_file():
        return "hf", path  # reading its weights reports what is missing
    raise ValueError(f"{path} holds no model: no config.json with {SAFETENSORS}, no .gguf file and no flaxzoo "
                     f"checkpoint (checkpoints/<step>/); the directory holds {_listing(path)}")


def from_pretrained(path: PathLike, *, cls: type | str | None = None, allow_pickle: bool = False,
                    dtype: Any = None, revision: str | None = None, progress: bool = False) -> nnx.Module:
    """Load a pretrained model (in eval mode) from a Hugging Face directory, a GGUF file, a flaxzoo training
    checkpoint, or a Hugging Face Hub id.

    Args:
      path: one of
        * a Hugging Face model directory: ``config.json`` and ``model.safetensors`` (or
          ``model.safetensors.index.json`` and its shards). Supported: ``bert`` (BertModel, BertForMaskedLM,
          BertForSequenceClassification), ``gpt2`` (GPT2Model, GPT2LMHeadModel), ``llama`` (LlamaModel,
          LlamaForCausalLM);
        * a ``.gguf`` file (llama.cpp) of the Llama architecture, dequantised from any type the ``gguf`` package
          reads (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, K-quants ...), or a directory holding one;
        * a flaxzoo training checkpoint: a ``python -m train`` work directory, its ``checkpoints/`` folder or one
          step folder (the latest step is taken; only the parameters are read);
        * a Hub id such as ``"openai-community/gpt2"`` (any string that is not an existing local path): its config,
          safetensors and tokenizer files (never pickles) are fetched into the standard Hugging Face cache, or
          found there when offline (``HF_HUB_OFFLINE=1``).
      cls: the flaxzoo class (or its name) to build; default: the counterpart of ``architectures[0]``. A base class
        (``BertModel``, ``GPTModel``) may be loaded from a head checkpoint: the head's tensors are skipped, and a
        ``BertModel`` gets a pooler only if the checkpoint has one.
      allow_pickle: read a legacy ``pytorch_model.bin`` with ``torch.load(weights_only=True)`` (needs torch). Off by
        default: a pickle can run code when loaded.
      dtype: parameter and compute dtype (e.g. ``"bfloat16"``); default float32 whatever the checkpoint stores (a
        flaxzoo checkpoint: its config's dtypes).
      revision: the Hub branch, tag or commit for a Hub id.
      progress: show progress bars while reading large files.

    Raises:
      FileNotFoundError: a local path that does not exist; a Hub id neither downloadable nor in the cache.
      ValueError: unsupported model type / architecture / config feature / GGUF architecture or tensor type;
        missing, unexpected or mis-shaped tensors (each named); a pickle without ``allow_pickle``; a directory
        holding no model (its contents are listed).
    """
    source = resolve_pretrained(path, revision=revision)
    kind, source = checkpoint_kind(source)
    if kind == "gguf":
        return _from_gguf(source, cls, dtype, progress)
    if kind == "flaxzoo":
        from models.checkpoint import load_checkpoint

        return load_checkpoint(source, cls=cls, dtype=dtype)
    return _from_hf_directory(source, cls, allow_pickle, dtype, progress)


# --------------------------------------------------------------------------------------------------------------------
# Hugging Face Hub ids
# --------------------------------------------------------------------------------------------------------------------

# What a Hub download fetches: configuration, safetensors weights and tokenizer files. Never pickles (*.bin, *.pt,
# *.pth, *.ckpt), which can run code when loaded, nor the ONNX / TF / Flax copies many repositories also hold.
HUB_ALLOW_PATTERNS = (
    "config.json", SAFETENSORS, "model-*.safetensors", SAFETENSORS_INDEX, "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt", "generation_config.json",
)
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?")


def is_hub_id(path: PathLike) -> bool:
    """True for a string that is not an existing local path and is shaped like ``name`` or ``org/name``."""
    if not isinstance(path, str) or os.path.exists(os.path.expanduser(path)):
        return False
    return bool(_HUB_ID.fullmatch(path)) and not path.endswith((".gguf", ".json", ".safetensors"))


def resolve_pretrained(path: PathLike, *, revision: str | None = None) -> pathlib.Path:
    """The local path ``path`` names: itself, or for a Hub id its snapshot folder in the Hugging Face cache."""
    if is_hub_id(path):
        return download_from_hub(str(path), revision=revision)
    local = pathlib.Path(path).expanduser()
    if not local.exists():
        raise FileNotFoundError(
            f"{local} does not exist: from_pretrained expects a local directory (Hugging Face: config.json + "
            f"{SAFETENSORS}; a flaxzoo checkpoint), a .gguf file, or a Hugging Face Hub id such as "
            "'openai-community/gpt2'")
    return local


def download_from_hub(repo_id: str, *, revision: str | None = None) -> pathlib.Path:
    """Fetch ``repo_id``'s config, safetensors and tokenizer files into the Hugging Face cache (``HF_HOME``) and
    return the snapshot folder. Offline (``HF_HUB_OFFLINE=1``, or no network) a cached snapshot is used.

    Raises FileNotFoundError, saying how to pass a local path instead, when the repository can be neither fetched
    nor found in the cache; ValueError when it holds no safetensors weights.
    """
    try:
        import huggingface_hub
    except ImportError as exc:
        raise ImportError(f"{repo_id!r} is not a local path; fetching it from the Hugging Face Hub needs "
                          "huggingface_hub (pip install huggingface_hub), or pass a local directory") from exc
    try:
        folder = pathlib.Path(huggingface_hub.snapshot_download(
            repo_id, revision=revision, allow_patterns=list(HUB_ALLOW_PATTERNS)))
    except Exception as exc:  # offline and not cached, unknown / gated repository, invalid id, network failure
        offline = huggingface_hub.constants.HF_HUB_OFFLINE
        why = ("offline mode is on (HF_HUB_OFFLINE=1) and it is not in the Hugging Face cache "
               f"{huggingface_hub.constants.HF_HUB_CACHE}" if offline else
               "the Hugging Face Hub could not provide it and it is not in the cache "
               f"{huggingface_hub.constants.HF_HUB_CACHE}")
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise FileNotFoundError(
            f"{repo_id!r} is not a local path, and {why} ({type(exc).__name__}: {detail}). To load files you "
            "already have, pass their local path: from_pretrained('/path/to/model_dir') (config.json + "
            "model.safetensors) or from_pretrained('/path/to/model.gguf'); to fetch from the Hub, run once with "
            "network access and without HF_HUB_OFFLINE") from exc
    if not any(folder.glob("*.safetensors")):
        raise ValueError(f"Hugging Face Hub repository {repo_id!r} has no safetensors weights (flaxzoo never "
                         f"downloads pickled .bin/.pt files); its snapshot {folder} holds {_listing(folder)}. "
                         "Convert the weights to safetensors and pass the local directory")
    return folder


# --------------------------------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------------------------------

def _check_saveable(config: TransformerConfig, family: Family) -> None:
    problems = [f"{field}={getattr(config, field)!r} (Hugging Face {family.model_type} needs {want!r})"
                for field, want in family.layout.items() if getattr(config, field) != want]
    if family.model_type in ("bert", "gpt2"):
        if config.num_kv_heads != config.num_heads:
            problems.append(f"num_kv_heads={config.num_kv_heads} (Hugging Face {family.model_type} needs "
                            f"num_kv_heads == num_heads = {config.num_heads})")
        if config.head_dim * config.num_heads != config.hidden_size:
            problems.append(f"head_dim={config.head_dim} (Hugging Face {family.model_type} needs "
                            f"hidden_size / num_heads = {config.hidden_size / config.num_heads:g})")
    if family.model_type == "bert" and config.type_vocab_size < 1:
        problems.append("type_vocab_size=0 (Hugging Face bert always has token-type embeddings: needs >= 1)")
    if problems:
        raise ValueError(f"cannot write this model as a Hugging Face {family.model_type} checkpoint: "
                         + "; ".join(problems) + " (config.model_type selects the Hugging Face layout)")


def _interleaved_to_half(values: dict[ParamPath, np.ndarray], config: TransformerConfig) -> None:
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
    Tied tables are written once, as Hugging Face does. A Llama model in the interleaved RoPE layout is written in
    Hugging Face's rotate-half layout (queries and keys permuted, same outputs). Features Hugging Face's class for
    ``config.model_type`` cannot express (ALiBi, sinusoidal positions, a different norm placement ...) raise
    ``ValueError`` naming them. Returns the directory.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, TransformerConfig):
        raise ValueError(f"save_pretrained expects a flaxzoo model (with a TransformerConfig .config); got "
                         f"{type(model).__name__}")
    if config.model_type not in FAMILIES:
        raise ValueError(f"model_type={config.model_type!r}: expected one of {sorted(FAMILIES)}")
    family = FAMILIES[config.model_type]
    cls = type(model)
    architecture = family.hf_architecture(cls)
    _check_saveable(config, family)
    if config.activation not in _ACTIVATIONS_TO_HF:
        raise ValueError(f"activation={config.activation!r} has no Hugging Face name")

    values = {p: np.asarray(var.get_value(), dtype=np.float32)
              for p, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    if config.position == "rope" and config.rope_layout == "interleaved":
        _interleaved_to_half(values, config)
        config = config.replace(rope_layout="half")
    extra = {"pooler": model.pooler is not None} if cls is BertModel else {}
    base = "" if cls is family.base_class else family.base_prefix + "."  # HF's base classes save unprefixed
    weights = family.weights(config, cls, base, **extra)
    _check_coverage(weights, values, f"save_pretrained({cls.__name__}, {family.model_type})")

    tensors = {e.hf: np.ascontiguousarray(e.transform.to_hf(*(values[p] for p in e.paths)))
               for e in weights.entries}
    for name, source in weights.unused.items():
        tensors[name] = tensors[source].copy()

    hf = {"architectures": [architecture], "model_type": family.model_type, **family.config_to_hf(config),
          "initializer_range": config.initializer_range, "tie_word_embeddings": config.tie_word_embeddings,
          "pad_token_id": config.pad_token_id, "bos_token_id": config.bos_token_id,
          "eos_token_id": config.eos_token_id, "dtype": "float32", "torch_dtype": "float32"}
    if cls is BertForSequenceClassification or config.num_labels != 2:
        hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(config.num_labels)}
        hf["label2id"] = {f"LABEL_{i}": i for i in range(config.num_labels)}

    directory = pathlib.Path(path).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    save_file(tensors, directory / SAFETENSORS, metadata={"format": "pt"})
    return directory
