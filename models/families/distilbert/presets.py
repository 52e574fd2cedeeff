"""DistilBERT base (uncased): the published sizes (Hugging Face's ``config.json`` values; ``tests/test_presets.py``
counts their parameters against transformers' models built from the same configs)."""

from __future__ import annotations

from flaxzoo.models.architectures.encoder.config import encoder_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "distilbert-base-uncased": encoder_preset(model_type="distilbert", hidden_size=768, num_layers=6, num_heads=12,
                                              intermediate_size=3072, type_vocab_size=0, pooler_activation="relu"),
}
