"""T5 (v1.0, v1.1, Flan-T5): Hugging Face ``t5`` names and config ↔ flaxzoo's encoder-decoder classes
(``architectures/encoder_decoder``): one relative-bias table per stack, ReLU or gated-GELU feed-forward, the decoder
output scaled by ``d_model ** -0.5`` where ``scale_decoder_outputs`` says (v1.0)."""

from __future__ import annotations

from typing import Any, Mapping

from flaxzoo.models.architectures.encoder_decoder.hf import (T5_LAYOUT,
                                                             head_from_tensors,
                                                             t5_architectures, t5_config_from_hf,
                                                             t5_config_to_hf, t5_save_problems, t5_weights)
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family
from flaxzoo.models.families.t5.gguf import SPEC
from flaxzoo.models.families.t5.presets import PRESETS


def t5_config(hf: Mapping[str, Any]) -> TransformerConfig:
    return t5_config_from_hf(hf, "t5")


FAMILY = Family(
    model_type="t5", base_prefix="transformer", architectures=t5_architectures("T5"),
    config_from_hf=t5_config, config_to_hf=t5_config_to_hf, weights=t5_weights,
    layout=dict(T5_LAYOUT, position_bias_per_layer=False), save_problems=t5_save_problems, presets=PRESETS,
    config_from_tensors=head_from_tensors, gguf=SPEC)
