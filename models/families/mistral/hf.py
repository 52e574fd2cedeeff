"""Mistral: the Llama layout where every layer attends through one sliding window (``sliding_window``; None in
v0.2 and later)."""

from __future__ import annotations

from typing import Any, Mapping

from flaxzoo.models.architectures.decoder.hf import (PLAIN_MECHANISMS, decoder_architectures, decoder_config_from_hf,
                                                     decoder_config_to_hf, decoder_weights)
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family

MISTRAL_LAYOUT = dict(causal=True, position="rope", norm="rmsnorm", norm_placement="pre", embedding_norm=False,
                      final_norm=True, mlp_gated=True, type_vocab_size=0, attention_bias=False,
                      attention_out_bias=False, mlp_bias=False, rotary_fraction=1.0, layer_types=None,
                      **PLAIN_MECHANISMS)
from flaxzoo.models.families.mistral.presets import PRESETS


def mistral_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    return decoder_config_from_hf({k: v for k, v in hf.items() if k != "layer_types"}, "mistral", MISTRAL_LAYOUT)


def mistral_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    out = decoder_config_to_hf(config)
    del out["layer_types"], out["use_sliding_window"]  # Mistral's window covers every layer
    return out


FAMILY = Family(
    model_type="mistral", base_prefix="model",
    architectures=decoder_architectures("Mistral"),
    config_from_hf=mistral_config_from_hf, config_to_hf=mistral_config_to_hf,
    weights=lambda config, cls, base: decoder_weights(config, cls, base), layout=MISTRAL_LAYOUT, presets=PRESETS)
