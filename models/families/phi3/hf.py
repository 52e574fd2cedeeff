"""Phi-3 / Phi-3.5 / Phi-4-mini: the Llama layout with q, k and v fused by rows in ``self_attn.qkv_proj``
(``[q rows; k rows; v rows]``: uneven parts with grouped-query heads) and gate and up fused in ``mlp.gate_up_proj``
(gate rows first), no biases. Long-context checkpoints scale RoPE with LongRoPE (short factors up to
``original_max_position_embeddings``, long factors past it, chosen per call by the largest position); Phi-3 keeps
that length at the top level of ``config.json``, where it wins over the scaling dict's (Phi3Config's default, 4096,
when the file has none). With ``sliding_window`` every layer attends through it.

Residual dropout is ``resid_pdrop`` (flaxzoo's ``dropout``, which also drops the embeddings: transformers' class
reads no ``embd_pdrop``).
"""

from __future__ import annotations

from typing import Any, Mapping

from flaxzoo.models.architectures.decoder.hf import (PLAIN_MECHANISMS, decoder_config_from_hf, decoder_config_to_hf,
                                                     decoder_weights)
from flaxzoo.models.architectures.decoder.model import GPTForCausalLM, GPTForSequenceClassification, GPTModel
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family, WeightMap
from flaxzoo.models.families.phi3.gguf import SPEC

PHI3_LAYOUT = dict(causal=True, position="rope", norm="rmsnorm", norm_placement="pre", embedding_norm=False,
                   final_norm=True, mlp_gated=True, type_vocab_size=0, attention_bias=False,
                   attention_out_bias=False, mlp_bias=False, layer_types=None, **PLAIN_MECHANISMS)
from flaxzoo.models.families.phi3.presets import PRESETS

# The RoPE types Hugging Face's Phi-3 reads, and the older names of LongRoPE its config maps to "longrope".
PHI3_ROPE_TYPES = ("default", "longrope")
LEGACY_LONGROPE = ("su", "yarn")
# Phi3Config's ``original_max_position_embeddings`` when config.json has none (it always overrides the dict's).
DEFAULT_ORIGINAL_MAX_POSITIONS = 4096


def phi3_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls`` (``base``: ``"model."``, or ``""`` for a bare ``Phi3Model`` checkpoint): ``qkv_proj``
    ``[(heads + 2 · kv_heads) · head_dim, hidden]`` and ``gate_up_proj`` ``[2 · intermediate, hidden]`` split by
    rows."""
    return decoder_weights(config, cls, base, fused_qkv="self_attn.qkv_proj", fused_gate_up="mlp.gate_up_proj")


def _rope_type(params: Mapping[str, Any]) -> str:
    return params.get("rope_type", params.get("type")) or "default"


def _phi3_rope_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
    """``config.json`` with LongRoPE's older names (``su``, ``yarn``) read as ``longrope`` and the top-level
    ``original_max_position_embeddings`` Phi3Config would use; ValueError for a RoPE type Phi-3 does not read."""
    out = dict(hf)
    for key in ("rope_parameters", "rope_scaling"):
        params = out.get(key)
        if not isinstance(params, Mapping) or not params:
            continue
        kind = _rope_type(params)
        if kind in LEGACY_LONGROPE:
            kind = "longrope"
            out[key] = {k: v for k, v in params.items() if k != "type"} | {"rope_type": kind}
        if kind not in PHI3_ROPE_TYPES:
            raise ValueError(f"config.json: {key} has rope_type={kind!r}: Hugging Face phi3 reads only "
                             f"{list(PHI3_ROPE_TYPES)} (and {list(LEGACY_LONGROPE)} as 'longrope')")
        if key == "rope_parameters":
            break  # v5's dict is the one read; an older rope_scaling beside it is not
    if out.get("original_max_position_embeddings") is None:
        out["original_max_position_embeddings"] = DEFAULT_ORIGINAL_MAX_POSITIONS
    return out


def phi3_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """Phi-3's ``config.json`` (v5 ``rope_parameters``, or the older ``rope_scaling`` / ``rope_theta`` /
    ``partial_rotary_factor``); ``layer_types`` is not read (the window, when set, covers every layer)."""
    fields = {k: v for k, v in _phi3_rope_fields(hf).items() if k != "layer_types"}
    return decoder_config_from_hf(fields, "phi3", PHI3_LAYOUT, dropout=fields.get("resid_pdrop", 0.0))


def phi3_save_problems(config: TransformerConfig) -> list[str]:
    problems = []
    scaling = config.rope_scaling_dict or {}
    kind = scaling.get("rope_type", "default")
    if kind not in PHI3_ROPE_TYPES:
        problems.append(f"rope_scaling of rope_type {kind!r} (Hugging Face phi3 reads only {list(PHI3_ROPE_TYPES)})")
    if kind == "longrope" and config.head_dim * config.num_heads != config.hidden_size:
        problems.append(f"head_dim={config.head_dim} with LongRoPE (Hugging Face phi3 checks the factors against "
                        f"hidden_size / num_heads = {config.hidden_size / config.num_heads:g})")
    return problems


def phi3_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """v5's ``rope_parameters`` and the older fields; ``original_max_position_embeddings`` at the top level (where
    Phi3Config reads it), ``partial_rotary_factor`` there too (an older ``rope_scaling`` replaces the v5 dict)."""
    out = decoder_config_to_hf(config.replace(dropout=0.0))
    del out["layer_types"], out["use_sliding_window"], out["attention_bias"], out["mlp_bias"]
    scaling = config.rope_scaling_dict or {}
    out["original_max_position_embeddings"] = scaling.get("original_max_position_embeddings",
                                                          config.max_position_embeddings)
    out["partial_rotary_factor"] = config.rotary_fraction
    out["resid_pdrop"] = out["embd_pdrop"] = config.dropout
    return out


FAMILY = Family(
    model_type="phi3", base_prefix="model",
    architectures={"Phi3Model": GPTModel, "Phi3ForCausalLM": GPTForCausalLM,
                   "Phi3ForSequenceClassification": GPTForSequenceClassification},
    config_from_hf=phi3_config_from_hf, config_to_hf=phi3_config_to_hf, weights=phi3_weights, layout=PHI3_LAYOUT,
    save_problems=phi3_save_problems, gguf=SPEC, presets=PRESETS)
