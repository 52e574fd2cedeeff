"""ALBERT base v2: factorised embeddings (embedding_size 128), one block shared across its 12 layers: the published
sizes (Hugging Face's ``config.json`` values; ``tests/test_presets.py`` counts their parameters against transformers'
models built from the same configs)."""

from __future__ import annotations

from flaxzoo.models.architectures.encoder.config import encoder_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    # Factorised embeddings (embedding_size 128); ALBERT shares one block across its 12 layers.
    "albert-base-v2": encoder_preset(
        model_type="albert", vocab_size=30000, hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072,
        embedding_size=128, shared_layers=True, activation="gelu_tanh", dropout=0.0, attention_dropout=0.0,
        bos_token_id=2, eos_token_id=3),
}
