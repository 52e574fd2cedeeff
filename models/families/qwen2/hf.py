"""Qwen2 / Qwen2.5: the Llama layout with biased q/k/v projections and an unbiased output projection; long-context
checkpoints scale RoPE with YaRN; layers from ``max_window_layers`` on may attend through a sliding window."""

from __future__ import annotations

from typing import Any, Mapping

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family
from flaxzoo.models.families.decoder import (PLAIN_MECHANISMS, decoder_architectures, decoder_config_from_hf,
                                             decoder_config_to_hf, decoder_weights)
from flaxzoo.models.families.qwen2.gguf import SPEC

QWEN2_LAYOUT = dict(causal=True, position="rope", norm="rmsnorm", norm_placement="pre", embedding_norm=False,
                    final_norm=True, mlp_gated=True, type_vocab_size=0, attention_bias=True,
                    attention_out_bias=False, mlp_bias=False, rotary_fraction=1.0, **PLAIN_MECHANISMS)


def window_layer_types(hf: Mapping[str, Any]) -> list[str]:
    """Qwen2's rule when ``config.json`` has no ``layer_types``: the layers from ``max_window_layers`` on slide."""
    first = hf.get("max_window_layers", hf["num_hidden_layers"])
    return ["sliding_attention" if i >= first else "full_attention" for i in range(hf["num_hidden_layers"])]


def qwen2_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    return decoder_config_from_hf(hf, "qwen2", QWEN2_LAYOUT, sliding_types=window_layer_types(hf))


def qwen2_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    out = decoder_config_to_hf(config)
    out["max_window_layers"] = next((i for i, s in enumerate(config.sliding_layers) if s), config.num_layers)
    return out


FAMILY = Family(
    model_type="qwen2", base_prefix="model",
    architectures=decoder_architectures("Qwen2"),
    config_from_hf=qwen2_config_from_hf, config_to_hf=qwen2_config_to_hf,
    weights=lambda config, cls, base: decoder_weights(config, cls, base), layout=QWEN2_LAYOUT,
    gguf=SPEC)
