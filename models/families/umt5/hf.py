"""umT5 (Chung et al., 2023): T5 v1.1's layout with a relative-bias table in every layer of both stacks, under
Hugging Face ``umt5`` names."""

from __future__ import annotations

from typing import Any, Mapping

from flaxzoo.models.architectures.encoder_decoder.hf import (T5_LAYOUT,
                                                             head_from_tensors,
                                                             t5_architectures, t5_config_from_hf,
                                                             t5_config_to_hf, t5_save_problems, t5_weights)
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family
from flaxzoo.models.architectures.encoder_decoder.config import V1_1, t5_preset


def umt5_config(hf: Mapping[str, Any]) -> TransformerConfig:
    return t5_config_from_hf(hf, "umt5", per_layer_bias=True)


PRESETS = {
    "umt5-small": t5_preset(model_type="umt5", vocab_size=256384, hidden_size=512, intermediate_size=1024,
                            num_layers=8, num_heads=6, position_bias_per_layer=True, **V1_1),
    "umt5-base": t5_preset(model_type="umt5", vocab_size=256384, hidden_size=768, intermediate_size=2048,
                           num_layers=12, num_heads=12, position_bias_per_layer=True, **V1_1),
}

FAMILY = Family(
    model_type="umt5", base_prefix="transformer", architectures=t5_architectures("UMT5"),
    config_from_hf=umt5_config, config_to_hf=t5_config_to_hf, weights=t5_weights,
    layout=dict(T5_LAYOUT, position_bias_per_layer=True), save_problems=t5_save_problems, presets=PRESETS,
    config_from_tensors=head_from_tensors)
