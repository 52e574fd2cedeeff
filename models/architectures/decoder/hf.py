"""What the Llama-layout decoder families share (Llama, Qwen2, Qwen3, Mistral, Gemma 1/2/3, OLMo 2, Phi-3): the
per-layer weight table under Hugging Face's ``model.layers.i.self_attn / mlp / *_layernorm`` names, fused q/k/v and
gate/up tensors, and the RoPE / sliding-window fields of ``config.json`` (transformers v5's ``rope_parameters``, and
the ``rope_scaling`` / ``rope_theta`` / ``partial_rotary_factor`` older files write).

A family passes which Hugging Face norm fills which flaxzoo norm (``norms``) and which tensors are fused; the rest is
this table.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from flaxzoo.models.architectures.decoder.model import GPTForCausalLM, GPTForSequenceClassification, GPTModel
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import (BACKBONE, LINEAR, Array, Entry, Transform, WeightMap, causal_lm_head, entry,
                                          layout, linear, norm, outside)
from flaxzoo.models.families.fields import ACTIVATIONS_TO_HF, activation, common_from_hf
from flaxzoo.models.layers.rope_scaling import normalize_rope_scaling

# Hugging Face per-layer norm → flaxzoo block norm, per norm placement.
PRE_NORMS = {"input_layernorm": "attention_norm", "post_attention_layernorm": "mlp_norm"}
SANDWICH_NORMS = {"input_layernorm": "attention_norm", "post_attention_layernorm": "attention_post_norm",
                  "pre_feedforward_layernorm": "mlp_norm", "post_feedforward_layernorm": "mlp_post_norm"}
POST_BRANCH_NORMS = {"post_attention_layernorm": "attention_norm", "post_feedforward_layernorm": "mlp_norm"}

# The mechanism fields a family that does not use them needs at their defaults to be written back.
PLAIN_MECHANISMS: dict[str, Any] = dict(
    parallel_residual=False, qk_norm="none", norm_unit_offset=False, embedding_multiplier=1.0, rope_local_theta=None,
    attention_softcap=None, final_logit_softcap=None, query_scale=None)


def _concat(parts: Sequence[Array]) -> Array:
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts, axis=0)
    import jax.numpy as jnp  # tracers while shapes are worked out

    return jnp.concatenate(parts, axis=0)


def split_rows(sizes: Sequence[int], parts: Sequence[Transform]) -> Transform:
    """One Hugging Face tensor whose rows (axis 0) are several tensors back to back (Phi-3's ``qkv_proj`` with
    grouped-query heads: ``[q rows; k rows; v rows]``), each through its own transform."""
    bounds = np.cumsum([0, *sizes])

    def to_flax(w: Array) -> tuple[Array, ...]:
        return tuple(part.to_flax(w[bounds[i]:bounds[i + 1]])[0] for i, part in enumerate(parts))

    def to_hf(*ws: Array) -> Array:
        return _concat([part.to_hf(w) for part, w in zip(parts, ws)])

    return Transform(to_flax, to_hf)


def attention_entries(config: TransformerConfig, hf: str, fz: str, fused_qkv: str | None) -> list:
    """q/k/v/o projections (biases as the config has them) of one layer; ``fused_qkv``: the Hugging Face module
    holding q, k and v stacked by rows."""
    h, kv, hd = config.num_heads, config.num_kv_heads, config.head_dim
    heads = {"query": h, "key": kv, "value": kv}
    bias = config.attention_bias
    entries = []
    if fused_qkv is None:
        for hf_name, name in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
            entries += linear(f"{hf}.self_attn.{hf_name}", f"{fz}.attention.{name}", bias,
                              layout("(h k) d", "d h k", h=heads[name]), layout("(h k)", "h k", h=heads[name]))
    else:
        names = [f"{fz}.attention.{name}" for name in heads]
        sizes = [heads[name] * hd for name in heads]
        entries.append(entry(f"{hf}.{fused_qkv}.weight", [f"{n}.kernel" for n in names],
                             split_rows(sizes, [layout("(h k) d", "d h k", h=heads[n]) for n in heads])))
        if bias:
            entries.append(entry(f"{hf}.{fused_qkv}.bias", [f"{n}.bias" for n in names],
                                 split_rows(sizes, [layout("(h k)", "h k", h=heads[n]) for n in heads])))
    entries += linear(f"{hf}.self_attn.o_proj", f"{fz}.attention.out", config.attention_out_bias,
                      layout("d (h k)", "h k d", h=h))
    if config.qk_norm != "none":
        entries += [*norm(f"{hf}.self_attn.q_norm", f"{fz}.attention.query_norm", bias=False),
                    *norm(f"{hf}.self_attn.k_norm", f"{fz}.attention.key_norm", bias=False)]
    return entries


def mlp_entries(config: TransformerConfig, hf: str, fz: str, fused_gate_up: str | None) -> list:
    """gate / up / down of one layer; ``fused_gate_up``: the Hugging Face module holding gate then up by rows."""
    bias = config.mlp_bias
    if fused_gate_up is None:
        entries = [*linear(f"{hf}.mlp.gate_proj", f"{fz}.mlp.gate", bias),
                   *linear(f"{hf}.mlp.up_proj", f"{fz}.mlp.up", bias)]
    else:
        f = config.intermediate_size
        entries = [entry(f"{hf}.{fused_gate_up}.weight", [f"{fz}.mlp.gate.kernel", f"{fz}.mlp.up.kernel"],
                         split_rows([f, f], [layout("out inp", "inp out")] * 2))]
        if bias:
            entries.append(entry(f"{hf}.{fused_gate_up}.bias", [f"{fz}.mlp.gate.bias", f"{fz}.mlp.up.bias"],
                                 split_rows([f, f], [layout("f", "f")] * 2)))
    return entries + linear(f"{hf}.mlp.down_proj", f"{fz}.mlp.down", bias)


def decoder_architectures(prefix: str) -> dict[str, type]:
    """A Llama-layout family's Hugging Face classes → flaxzoo classes, the base model first: ``{prefix}Model``,
    ``{prefix}ForCausalLM`` and ``{prefix}ForSequenceClassification`` (``prefix``: ``"Llama"``, ``"Qwen2"`` ...)."""
    return {f"{prefix}Model": GPTModel, f"{prefix}ForCausalLM": GPTForCausalLM,
            f"{prefix}ForSequenceClassification": GPTForSequenceClassification}


# The head tensor of each decoder class outside the stack; a checkpoint of another class has its own, skipped on load.
HEAD_TENSORS = {"causal_lm": r"lm_head\.weight", "sequence_classification": r"score\.weight"}


def classification_head(cls: type) -> list[Entry]:
    """The score of a sequence-classification class (``cls.task == "sequence_classification"``; other classes get
    nothing): Hugging Face ``score.weight`` ``[num_labels, hidden]`` ↔ ``score.kernel`` ``[hidden, num_labels]``."""
    if getattr(cls, "task", None) != "sequence_classification":
        return []
    return [entry("score.weight", "score.kernel", LINEAR)]


def decoder_weights(config: TransformerConfig, cls: type, base: str, *, norms: Mapping[str, str] = PRE_NORMS,
                    fused_qkv: str | None = None, fused_gate_up: str | None = None) -> WeightMap:
    """The table of a Llama-layout decoder for ``cls`` (``base``: ``"model."``, or ``""`` for a bare base-model
    checkpoint). ``norms``: Hugging Face per-layer norm name → flaxzoo block norm."""
    stack = BACKBONE
    entries = [entry(f"{base}embed_tokens.weight", f"{stack}.embeddings.tokens.embedding"),
               *norm(f"{base}norm", f"{stack}.final_norm", bias=False)]
    for i in range(config.num_layers):
        hf, fz = f"{base}layers.{i}", f"{stack}.layers.{i}"
        entries += attention_entries(config, hf, fz, fused_qkv)
        for hf_norm, fz_norm in norms.items():
            entries += norm(f"{hf}.{hf_norm}", f"{fz}.{fz_norm}", bias=False)
        entries += mlp_entries(config, hf, fz, fused_gate_up)
    head, tied = causal_lm_head(config, cls, f"{base}embed_tokens.weight")
    entries += head + classification_head(cls)
    # Old checkpoints store the RoPE frequencies; the other classes' heads are skipped (a causal LM loaded as a
    # classifier: its lm_head; the score is initialised, being optional as every head is).
    task = getattr(cls, "task", None)
    others = tuple(pattern for name, pattern in HEAD_TENSORS.items() if name != task)
    return WeightMap(entries, tied, ignored=(rf"{re.escape(base)}layers\.\d+\.self_attn\.rotary_emb\.inv_freq",
                                             *others), optional=outside(entries))


# ---------------------------------------------------------------------------------------------- RoPE in config.json

def _rope_parameters(hf: Mapping[str, Any], layer_type: str | None) -> dict[str, Any]:
    """The RoPE settings of ``config.json`` as one flat dict (``rope_theta``, ``rope_type``, scaling keys,
    ``partial_rotary_factor``), from v5's ``rope_parameters`` (per layer type, when nested) or the older fields."""
    params = hf.get("rope_parameters")
    if isinstance(params, Mapping) and params and all(isinstance(v, Mapping) for v in params.values()):
        if layer_type not in params:
            raise ValueError(f"config.json: rope_parameters has entries for {sorted(params)}: expected one for "
                             f"{layer_type or 'full_attention'!r}")
        params = params[layer_type]
    if isinstance(params, Mapping):
        out = dict(params)
    else:
        out = dict(hf.get("rope_scaling") or {})
    out.setdefault("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", 10_000.0)))
    for key in ("partial_rotary_factor", "rotary_pct"):
        if key in hf and "partial_rotary_factor" not in out:
            out["partial_rotary_factor"] = hf[key]
    return out


def rope_from_hf(hf: Mapping[str, Any], head_dim: int, max_positions: int,
                 layer_type: str | None = None) -> dict[str, Any]:
    """``rope_theta``, ``rope_scaling`` (normalised) and ``rotary_fraction`` for ``TransformerConfig``, from the
    RoPE fields of ``config.json`` (of ``layer_type``'s entry when ``rope_parameters`` is per layer type)."""
    params = _rope_parameters(hf, layer_type)
    fraction = float(params.pop("partial_rotary_factor", 1.0) or 1.0)
    theta = float(params.pop("rope_theta"))
    rotary_dim = int(head_dim * fraction)
    scaling = normalize_rope_scaling(params or None, max_position_embeddings=max_positions, rotary_dim=rotary_dim,
                                     original_max_position_embeddings=hf.get("original_max_position_embeddings"))
    return dict(rope_theta=theta, rope_scaling=scaling, rotary_fraction=fraction)


def rope_parameters_to_hf(theta: float, scaling: tuple | None, fraction: float = 1.0) -> dict[str, Any]:
    """One ``rope_parameters`` entry (transformers v5)."""
    out = {"rope_theta": theta, "rope_type": "default"}
    if scaling is not None:
        out |= {k: list(v) if isinstance(v, tuple) else v for k, v in scaling}
    if fraction != 1.0:
        out["partial_rotary_factor"] = fraction
    return out


def rope_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The RoPE fields of ``config.json``: v5's ``rope_parameters`` and the older ``rope_theta`` / ``rope_scaling``."""
    params = rope_parameters_to_hf(config.rope_theta, config.rope_scaling, config.rotary_fraction)
    scaling = None
    if config.rope_scaling is not None:
        scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
    return {"rope_parameters": params, "rope_theta": config.rope_theta, "rope_scaling": scaling}


# ---------------------------------------------------------------------------------------- sliding windows in config

def sliding_from_hf(hf: Mapping[str, Any], num_layers: int, *, default_types: Sequence[str] | None = None
                    ) -> dict[str, Any]:
    """``sliding_window`` and ``layer_types`` from ``config.json``: its ``layer_types`` when written (transformers
    v5), else ``default_types`` (the family's rule), else every layer through the window when there is one."""
    window = hf.get("sliding_window")
    if hf.get("use_sliding_window") is False:
        window = None
    types = hf.get("layer_types") or default_types
    if window is None:
        if types and "sliding_attention" in types:
            raise ValueError(f"config.json: layer_types has sliding_attention layers but sliding_window={window!r}")
        return dict(sliding_window=None, layer_types=None)
    if types is not None and len(types) != num_layers:
        raise ValueError(f"config.json: layer_types has {len(types)} entries: expected num_hidden_layers="
                         f"{num_layers}")
    if types is not None and all(t == "sliding_attention" for t in types):
        types = None
    return dict(sliding_window=int(window), layer_types=None if types is None else tuple(types))


def layer_types_to_hf(config: TransformerConfig) -> list[str]:
    """Every layer's type, as transformers v5 writes ``layer_types``."""
    return ["sliding_attention" if s else "full_attention" for s in config.sliding_layers]


# ------------------------------------------------------------------------------------------------ config.json fields

def head_dim_of(hf: Mapping[str, Any]) -> int:
    """``head_dim`` of ``config.json``, else ``hidden_size / num_attention_heads``."""
    return int(hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"])


def decoder_config_from_hf(hf: Mapping[str, Any], model_type: str, layout: Mapping[str, Any], *,
                           sliding_types: Sequence[str] | None = None, default_activation: str = "silu",
                           **fields: Any) -> TransformerConfig:
    """A Llama-layout decoder's ``TransformerConfig`` from its ``config.json``: the shared fields, RoPE (scaling,
    partial rotary), the sliding window (``sliding_types``: the family's per-layer rule when the file has no
    ``layer_types``), then the family's ``layout`` and ``fields`` (which win)."""
    max_positions = hf.get("max_position_embeddings", 2048)
    values: dict[str, Any] = dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], num_kv_heads=hf.get("num_key_value_heads"),
        head_dim=hf.get("head_dim"), intermediate_size=hf["intermediate_size"],
        max_position_embeddings=max_positions, model_type=model_type, rope_layout="half",
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        activation=activation(hf, "hidden_activation" if "hidden_activation" in hf else "hidden_act",
                              default_activation),
        attention_bias=hf.get("attention_bias", False), mlp_bias=hf.get("mlp_bias", False),
        tie_word_embeddings=hf.get("tie_word_embeddings", False), dropout=0.0,
        attention_dropout=hf.get("attention_dropout", 0.0), **common_from_hf(hf))
    values |= rope_from_hf(hf, head_dim_of(hf), max_positions)
    if "sliding_window" in layout:
        values.pop("sliding_window", None)
    else:
        values |= sliding_from_hf(hf, hf["num_hidden_layers"], default_types=sliding_types)
    return TransformerConfig(**(values | dict(layout) | fields))


def decoder_config_to_hf(config: TransformerConfig, *, sliding: bool = True) -> dict[str, Any]:
    """The ``config.json`` fields every Llama-layout decoder writes alike (``sliding``: with the window fields);
    a residual ``dropout`` (which these Hugging Face classes lack) is not written, with a warning."""
    if config.dropout:
        warnings.warn(f"dropout={config.dropout} is not written: Hugging Face {config.model_type} has no residual "
                      "dropout (only attention_dropout); the saved model trains without it", stacklevel=3)
    out = {
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings, "rms_norm_eps": config.norm_eps,
        "hidden_act": ACTIVATIONS_TO_HF[config.activation], "attention_bias": config.attention_bias,
        "mlp_bias": config.mlp_bias, "attention_dropout": config.attention_dropout, **rope_to_hf(config)}
    if sliding:
        out |= {"sliding_window": config.sliding_window, "use_sliding_window": config.sliding_window is not None,
                "layer_types": layer_types_to_hf(config)}
    return out


def max_window_layer_types(hf: Mapping[str, Any]) -> list[str]:
    """The layer kinds of Qwen's ``config.json`` convention when it has no ``layer_types``: the layers from
    ``max_window_layers`` on slide (Qwen2, Qwen3)."""
    first = hf.get("max_window_layers", hf["num_hidden_layers"])
    return ["sliding_attention" if i >= first else "full_attention" for i in range(hf["num_hidden_layers"])]


def max_window_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """:func:`decoder_config_to_hf` plus ``max_window_layers`` (the first sliding layer, else the layer count), the
    field Qwen's configs read the window layers from."""
    out = decoder_config_to_hf(config)
    out["max_window_layers"] = next((i for i, s in enumerate(config.sliding_layers) if s), config.num_layers)
    return out
