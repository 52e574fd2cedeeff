"""Llama: Hugging Face ``llama`` names and config ↔ flaxzoo ``GPTModel`` / ``GPTForCausalLM`` (RMSNorm, SwiGLU, RoPE,
grouped-query attention). Its GGUF names and config: ``gguf.py`` beside this file.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Mapping

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import (BACKBONE, Family, WeightMap, causal_lm_head, entry, layout, linear, norm,
                                          outside)
from flaxzoo.models.families.fields import ACTIVATIONS_TO_HF, activation, common_from_hf
from flaxzoo.models.families.gpt2.model import GPTForCausalLM, GPTModel
from flaxzoo.models.families.llama.gguf import SPEC

LLAMA_LAYOUT = dict(causal=True, position="rope", norm="rmsnorm", norm_placement="pre", embedding_norm=False,
                    final_norm=True, mlp_gated=True, type_vocab_size=0)


def llama_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls`` (``base``: ``"model."``, or ``""`` for a bare ``LlamaModel`` checkpoint)."""
    h, kv, ab, mb = config.num_heads, config.num_kv_heads, config.attention_bias, config.mlp_bias
    stack = BACKBONE
    entries = [
        entry(f"{base}embed_tokens.weight", f"{stack}.embeddings.tokens.embedding"),
        *norm(f"{base}norm", f"{stack}.final_norm", bias=False),
    ]
    for i in range(config.num_layers):
        hf, fz = f"{base}layers.{i}", f"{stack}.layers.{i}"
        for hf_name, name, heads in (("q_proj", "query", h), ("k_proj", "key", kv), ("v_proj", "value", kv)):
            entries += linear(f"{hf}.self_attn.{hf_name}", f"{fz}.attention.{name}", ab,
                              layout("(h k) d", "d h k", h=heads), layout("(h k)", "h k", h=heads))
        entries += [
            *linear(f"{hf}.self_attn.o_proj", f"{fz}.attention.out", ab, layout("d (h k)", "h k d", h=h)),
            *norm(f"{hf}.input_layernorm", f"{fz}.attention_norm", bias=False),
            *norm(f"{hf}.post_attention_layernorm", f"{fz}.mlp_norm", bias=False),
            *linear(f"{hf}.mlp.gate_proj", f"{fz}.mlp.gate", mb),
            *linear(f"{hf}.mlp.up_proj", f"{fz}.mlp.up", mb),
            *linear(f"{hf}.mlp.down_proj", f"{fz}.mlp.down", mb),
        ]
    head, tied = causal_lm_head(config, cls, f"{base}embed_tokens.weight")
    entries += head
    # Old checkpoints store the RoPE frequencies.
    return WeightMap(entries, tied, ignored=(rf"{re.escape(base)}layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
                     optional=outside(entries))


def rope_theta(hf: Mapping[str, Any]) -> float:
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


def llama_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """Llama has attention-probability dropout (``attention_dropout``) and no residual dropout."""
    return TransformerConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], num_kv_heads=hf.get("num_key_value_heads"),
        head_dim=hf.get("head_dim"), intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf.get("max_position_embeddings", 2048), model_type="llama",
        rope_theta=rope_theta(hf), rope_layout="half", norm_eps=hf.get("rms_norm_eps", 1e-6),
        activation=activation(hf, "hidden_act", "silu"), attention_bias=hf.get("attention_bias", False),
        mlp_bias=hf.get("mlp_bias", False), tie_word_embeddings=hf.get("tie_word_embeddings", False), dropout=0.0,
        attention_dropout=hf.get("attention_dropout", 0.0), **LLAMA_LAYOUT, **common_from_hf(hf))


def llama_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The Llama fields; a residual ``dropout`` (which Hugging Face's Llama lacks) is not written, with a warning."""
    if config.dropout:
        warnings.warn(f"dropout={config.dropout} is not written: Hugging Face llama has no residual dropout (only "
                      "attention_dropout); the saved model trains without it", stacklevel=3)
    return {
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings, "rms_norm_eps": config.norm_eps,
        # transformers v5 reads rope_parameters, v4 the top-level rope_theta.
        "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"}, "rope_theta": config.rope_theta,
        "hidden_act": ACTIVATIONS_TO_HF[config.activation], "attention_bias": config.attention_bias,
        "mlp_bias": config.mlp_bias, "attention_dropout": config.attention_dropout, "pretraining_tp": 1,
    }


FAMILY = Family(
    model_type="llama", base_prefix="model",
    architectures={"LlamaModel": GPTModel, "LlamaForCausalLM": GPTForCausalLM},
    config_from_hf=llama_config_from_hf, config_to_hf=llama_config_to_hf, weights=llama_weights,
    layout=LLAMA_LAYOUT, gguf=SPEC)
