"""BERT base and large, all-MiniLM-L6-v2 (a six-layer BERT) and a tiny one for tests: the published sizes (Hugging
Face's ``config.json`` values; ``tests/test_presets.py`` counts their parameters against transformers' models built
from the same configs)."""

from __future__ import annotations

from flaxzoo.models.architectures.encoder.config import encoder_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "bert-base-uncased": encoder_preset(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072),
    "bert-large-uncased": encoder_preset(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
    "all-minilm-l6-v2": encoder_preset(hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536),
    "bert-tiny": encoder_preset(vocab_size=1000, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                                max_position_embeddings=128, dropout=0.0, attention_dropout=0.0),
}
