"""BART: Hugging Face ``bart`` names and config ↔ flaxzoo's encoder-decoder classes (``architectures/encoder_decoder``,
the BART layout of ``bart_layout.py``): post-norm blocks, learned positions offset by 2, a LayerNorm after the
embeddings, the LM head's ``final_logits_bias``, and the classifier read at each row's last EOS token."""

from __future__ import annotations

from typing import Any, Mapping

from flaxzoo.models.architectures.encoder_decoder.bart_layout import (BART_LAYOUT, bart_architectures,
                                                                      bart_config_from_hf, bart_config_to_hf,
                                                                      bart_save_problems, bart_weights)
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family
from flaxzoo.models.families.bart.presets import PRESETS



def bart_config(hf: Mapping[str, Any]) -> TransformerConfig:
    return bart_config_from_hf(hf, "bart", BART_LAYOUT)


FAMILY = Family(
    model_type="bart", base_prefix="model", architectures=bart_architectures("Bart"),
    config_from_hf=bart_config, config_to_hf=bart_config_to_hf, weights=bart_weights, layout=BART_LAYOUT,
    save_problems=bart_save_problems, presets=PRESETS)
