"""mBART (Hugging Face's ``facebook/mbart-large-cc25`` ``config.json`` values), and a tiny one for tests."""

from __future__ import annotations

import math

from flaxzoo.models.architectures.encoder_decoder.bart_layout import MBART_LAYOUT, bart_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "mbart-large-cc25": bart_preset(MBART_LAYOUT, model_type="mbart", vocab_size=250027, hidden_size=1024,
                                    intermediate_size=4096, num_layers=12, num_heads=16,
                                    embedding_multiplier=math.sqrt(1024), attention_dropout=0.1,
                                    decoder_start_token_id=0),
    "mbart-tiny": bart_preset(MBART_LAYOUT, model_type="mbart", vocab_size=1000, hidden_size=64,
                              intermediate_size=128, num_layers=2, num_heads=4, max_position_embeddings=128,
                              embedding_multiplier=8.0, dropout=0.0, decoder_start_token_id=0),
}
