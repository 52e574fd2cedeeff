"""ELECTRA small's discriminator: the published sizes (Hugging Face's ``config.json`` values; ``tests/test_presets.py``
counts their parameters against transformers' models built from the same configs)."""

from __future__ import annotations

from flaxzoo.models.architectures.encoder.config import encoder_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "electra-small-discriminator": encoder_preset(model_type="electra", hidden_size=256, num_layers=12, num_heads=4,
                                                  intermediate_size=1024, embedding_size=128, pooler_activation="gelu"),
}
