"""mBART: Hugging Face ``mbart`` names and config ↔ flaxzoo's encoder-decoder classes (the BART layout of
``architectures/encoder_decoder/bart_layout.py``, pre-norm with each stack's final LayerNorm, the embeddings scaled
by √d_model where ``scale_embedding`` says; the classifier's decoder starts from the source's language id)."""

from __future__ import annotations

from typing import Any, Mapping

from flaxzoo.models.architectures.encoder_decoder.bart_layout import (MBART_LAYOUT, bart_architectures,
                                                                      bart_config_from_hf, bart_config_to_hf,
                                                                      bart_save_problems, bart_weights)
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family
from flaxzoo.models.families.mbart.presets import PRESETS



def mbart_config(hf: Mapping[str, Any]) -> TransformerConfig:
    return bart_config_from_hf(hf, "mbart", MBART_LAYOUT)


FAMILY = Family(
    model_type="mbart", base_prefix="model", architectures=bart_architectures("MBart"),
    config_from_hf=mbart_config, config_to_hf=bart_config_to_hf, weights=bart_weights, layout=MBART_LAYOUT,
    save_problems=bart_save_problems, presets=PRESETS)
