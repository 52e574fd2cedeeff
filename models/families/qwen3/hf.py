"""Qwen3: the Llama layout with RMS-normalised queries and keys per head (QK-norm) before RoPE, and an explicit
``head_dim`` (often not ``hidden_size / heads``)."""

from __future__ import annotations

from typing import Any, Mapping

from flaxzoo.models.architectures.decoder.hf import (PLAIN_MECHANISMS, decoder_architectures, decoder_config_from_hf,
                                                     decoder_weights, max_window_config_to_hf, max_window_layer_types)
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family
from flaxzoo.models.families.qwen3.gguf import SPEC

QWEN3_LAYOUT = dict(causal=True, position="rope", norm="rmsnorm", norm_placement="pre", embedding_norm=False,
                    final_norm=True, mlp_gated=True, type_vocab_size=0, mlp_bias=False, rotary_fraction=1.0,
                    **(PLAIN_MECHANISMS | {"qk_norm": "head"}))
from flaxzoo.models.families.qwen3.presets import PRESETS


def qwen3_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    return decoder_config_from_hf(hf, "qwen3", QWEN3_LAYOUT, sliding_types=max_window_layer_types(hf))


def qwen3_save_problems(config: TransformerConfig) -> list[str]:
    if config.attention_out_bias != config.attention_bias:
        return [f"attention_out_bias={config.attention_out_bias} (Hugging Face qwen3 biases the output projection "
                f"as q/k/v: attention_bias={config.attention_bias})"]
    return []


FAMILY = Family(
    model_type="qwen3", base_prefix="model",
    architectures=decoder_architectures("Qwen3"),
    config_from_hf=qwen3_config_from_hf, config_to_hf=max_window_config_to_hf,
    weights=lambda config, cls, base: decoder_weights(config, cls, base), layout=QWEN3_LAYOUT,
    save_problems=qwen3_save_problems, gguf=SPEC, presets=PRESETS)
