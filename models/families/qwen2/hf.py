"""Qwen2 / Qwen2.5: the Llama layout with biased q/k/v projections and an unbiased output projection; long-context
checkpoints scale RoPE with YaRN; layers from ``max_window_layers`` on may attend through a sliding window."""

from __future__ import annotations

from typing import Any, Mapping

from flaxzoo.models.architectures.decoder.hf import (PLAIN_MECHANISMS, decoder_architectures, decoder_config_from_hf,
                                                     decoder_weights, max_window_config_to_hf, max_window_layer_types)
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family
from flaxzoo.models.families.qwen2.gguf import SPEC

QWEN2_LAYOUT = dict(causal=True, position="rope", norm="rmsnorm", norm_placement="pre", embedding_norm=False,
                    final_norm=True, mlp_gated=True, type_vocab_size=0, attention_bias=True,
                    attention_out_bias=False, mlp_bias=False, rotary_fraction=1.0, **PLAIN_MECHANISMS)
from flaxzoo.models.families.qwen2.presets import PRESETS


def qwen2_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    return decoder_config_from_hf(hf, "qwen2", QWEN2_LAYOUT, sliding_types=max_window_layer_types(hf))


FAMILY = Family(
    model_type="qwen2", base_prefix="model",
    architectures=decoder_architectures("Qwen2"),
    config_from_hf=qwen2_config_from_hf, config_to_hf=max_window_config_to_hf,
    weights=lambda config, cls, base: decoder_weights(config, cls, base), layout=QWEN2_LAYOUT,
    gguf=SPEC, presets=PRESETS)
