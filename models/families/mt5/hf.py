"""mT5 (Xue et al., 2021): T5 v1.1's layout over a 250k multilingual vocabulary, under Hugging Face ``mt5`` names.
transformers never scales mT5's decoder output, whatever ``tie_word_embeddings`` says."""

from __future__ import annotations

from typing import Any, Mapping

from flaxzoo.models.architectures.encoder_decoder.hf import (T5_LAYOUT,
                                                             head_from_tensors,
                                                             t5_architectures, t5_config_from_hf,
                                                             t5_config_to_hf, t5_save_problems, t5_weights)
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family
from flaxzoo.models.architectures.encoder_decoder.config import V1_1, t5_preset


def mt5_config(hf: Mapping[str, Any]) -> TransformerConfig:
    return t5_config_from_hf(hf, "mt5", scale_decoder_output=False)


def mt5_to_hf(config: TransformerConfig) -> dict[str, Any]:
    fields = t5_config_to_hf(config)
    del fields["scale_decoder_outputs"]
    return fields


PRESETS = {
    "mt5-small": t5_preset(model_type="mt5", vocab_size=250112, hidden_size=512, intermediate_size=1024,
                           num_layers=8, num_heads=6, **V1_1),
    "mt5-base": t5_preset(model_type="mt5", vocab_size=250112, hidden_size=768, intermediate_size=2048,
                          num_layers=12, num_heads=12, **V1_1),
}

FAMILY = Family(
    model_type="mt5", base_prefix="transformer", architectures=t5_architectures("MT5"),
    config_from_hf=mt5_config, config_to_hf=mt5_to_hf, weights=t5_weights,
    layout=dict(T5_LAYOUT, position_bias_per_layer=False, scale_decoder_output=False),
    save_problems=t5_save_problems, presets=PRESETS,
    config_from_tensors=head_from_tensors)
