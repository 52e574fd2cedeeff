"""BART base and large (Hugging Face's ``facebook/bart-*`` ``config.json`` values), and a tiny one for tests."""

from __future__ import annotations

from flaxzoo.models.architectures.encoder_decoder.bart_layout import BART_LAYOUT, bart_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "bart-base": bart_preset(BART_LAYOUT, model_type="bart", hidden_size=768, intermediate_size=3072, num_layers=6,
                             num_heads=12),
    "bart-large": bart_preset(BART_LAYOUT, model_type="bart", hidden_size=1024, intermediate_size=4096,
                              num_layers=12, num_heads=16),
    "bart-tiny": bart_preset(BART_LAYOUT, model_type="bart", vocab_size=1000, hidden_size=64, intermediate_size=128,
                             num_layers=2, num_heads=4, max_position_embeddings=128, dropout=0.0),
}
