"""The decoder architecture's base config for the Llama layout (Touvron et al., 2023): RMSNorm before each branch,
SwiGLU, rotate-half RoPE, no biases, no dropout; a family's presets add their sizes and what differs."""

from __future__ import annotations

from typing import Any

from flaxzoo.models.config import TransformerConfig

LLAMA_DEFAULTS: dict[str, Any] = dict(
    model_type="llama", causal=True, position="rope", rope_layout="half", norm="rmsnorm", norm_eps=1e-5,
    norm_placement="pre", final_norm=True, activation="silu", mlp_gated=True, attention_bias=False,
    mlp_bias=False, dropout=0.0,
)


def decoder_preset(**fields: Any) -> TransformerConfig:
    """:data:`LLAMA_DEFAULTS` with ``fields`` replacing or adding to them (sizes, ``model_type``, mechanisms)."""
    return TransformerConfig(**(LLAMA_DEFAULTS | fields))
