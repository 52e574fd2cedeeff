"""Phi-3-mini: the published sizes (Hugging Face's ``config.json`` values; ``tests/test_presets.py`` counts their
parameters against transformers' models built from the same configs)."""

from __future__ import annotations

from flaxzoo.models.architectures.decoder.config import decoder_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "phi-3-mini": decoder_preset(
        model_type="phi3", vocab_size=32064, hidden_size=3072, num_layers=32, num_heads=32, num_kv_heads=32,
        intermediate_size=8192, max_position_embeddings=4096, rope_theta=10_000.0, sliding_window=2047,
        tie_word_embeddings=False, pad_token_id=32000, bos_token_id=1, eos_token_id=32000),
}
