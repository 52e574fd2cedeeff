"""Mistral-7B: the published sizes (Hugging Face's ``config.json`` values; ``tests/test_presets.py`` counts their
parameters against transformers' models built from the same configs)."""

from __future__ import annotations

from flaxzoo.models.architectures.decoder.config import decoder_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "mistral-7b": decoder_preset(
        model_type="mistral", vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
        intermediate_size=14336, max_position_embeddings=32768, rope_theta=10_000.0, sliding_window=4096,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
}
