"""GPT-2: Hugging Face ``gpt2`` names and config ↔ flaxzoo ``GPTModel`` / ``GPTForCausalLM``.

GPT-2 uses ``Conv1D`` (weights ``[in, out]``, no transpose) and fuses query, key and value in ``c_attn``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from flaxzoo.models.architectures.decoder.model import GPTForCausalLM, GPTModel
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import (BACKBONE, IDENTITY, Family, WeightMap, causal_lm_head, entry, layout, linear,
                                          norm, outside)
from flaxzoo.models.families.fields import ACTIVATIONS_TO_HF, activation, common_from_hf, full_width_heads, refuse

GPT2_LAYOUT = dict(causal=True, position="learned", norm="layernorm", norm_placement="pre", embedding_norm=False,
                   final_norm=True, mlp_gated=False, attention_bias=True, mlp_bias=True, type_vocab_size=0,
                   position_offset=0)
from flaxzoo.models.families.gpt2.presets import PRESETS


def gpt2_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls`` (``base``: ``"transformer."``, or ``""`` for a bare ``GPT2Model`` checkpoint)."""
    h, stack = config.num_heads, BACKBONE
    entries = [
        entry(f"{base}wte.weight", f"{stack}.embeddings.tokens.embedding"),
        entry(f"{base}wpe.weight", f"{stack}.embeddings.positions.embedding"),
        *norm(f"{base}ln_f", f"{stack}.final_norm"),
    ]
    for i in range(config.num_layers):
        hf, fz = f"{base}h.{i}", f"{stack}.layers.{i}"
        qkv = [f"{fz}.attention.{name}" for name in ("query", "key", "value")]
        entries += [
            *norm(f"{hf}.ln_1", f"{fz}.attention_norm"),
            entry(f"{hf}.attn.c_attn.weight", [f"{p}.kernel" for p in qkv],
                  layout("d (parts h k)", "parts d h k", parts=3, h=h)),
            entry(f"{hf}.attn.c_attn.bias", [f"{p}.bias" for p in qkv],
                  layout("(parts h k)", "parts h k", parts=3, h=h)),
            *linear(f"{hf}.attn.c_proj", f"{fz}.attention.out", True, layout("(h k) d", "h k d", h=h)),
            *norm(f"{hf}.ln_2", f"{fz}.mlp_norm"),
            *linear(f"{hf}.mlp.c_fc", f"{fz}.mlp.up", True, IDENTITY),
            *linear(f"{hf}.mlp.c_proj", f"{fz}.mlp.down", True, IDENTITY),
        ]
    head, tied = causal_lm_head(config, cls, f"{base}wte.weight")
    entries += head
    # Old checkpoints store the causal-mask buffers.
    return WeightMap(entries, tied, ignored=(rf"{re.escape(base)}h\.\d+\.attn\.(bias|masked_bias)",),
                     optional=outside(entries))


def gpt2_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """Residual and embedding dropout are one rate in flaxzoo: ``resid_pdrop``; ``attn_pdrop`` is the attention's."""
    refuse(hf, "scale_attn_weights", [True], True)
    refuse(hf, "scale_attn_by_inverse_layer_idx", [False], False)
    refuse(hf, "reorder_and_upcast_attn", [False], False)
    refuse(hf, "add_cross_attention", [False], False)
    width = hf["n_embd"]
    return TransformerConfig(
        vocab_size=hf["vocab_size"], hidden_size=width, num_layers=hf["n_layer"], num_heads=hf["n_head"],
        intermediate_size=hf.get("n_inner") or 4 * width, max_position_embeddings=hf.get("n_positions", 1024),
        model_type="gpt2", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        activation=activation(hf, "activation_function", "gelu_new"),
        tie_word_embeddings=hf.get("tie_word_embeddings", True), dropout=hf.get("resid_pdrop", 0.1),
        attention_dropout=hf.get("attn_pdrop", 0.1), **GPT2_LAYOUT, **common_from_hf(hf))


def gpt2_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    return {
        "vocab_size": config.vocab_size, "n_embd": config.hidden_size, "n_layer": config.num_layers,
        "n_head": config.num_heads, "n_inner": config.intermediate_size,
        "n_positions": config.max_position_embeddings, "layer_norm_epsilon": config.norm_eps,
        "activation_function": ACTIVATIONS_TO_HF[config.activation], "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout, "attn_pdrop": config.attention_dropout, "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False, "add_cross_attention": False,
    }


FAMILY = Family(
    model_type="gpt2", base_prefix="transformer",
    architectures={"GPT2Model": GPTModel, "GPT2LMHeadModel": GPTForCausalLM},
    config_from_hf=gpt2_config_from_hf, config_to_hf=gpt2_config_to_hf, weights=gpt2_weights, layout=GPT2_LAYOUT,
    save_problems=lambda config: full_width_heads(config, "gpt2"), presets=PRESETS)
