"""Qwen3-0.6B: the published sizes (Hugging Face's ``config.json`` values; ``tests/test_presets.py`` counts their
parameters against transformers' models built from the same configs)."""

from __future__ import annotations

from flaxzoo.models.architectures.decoder.config import decoder_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "qwen3-0.6b": decoder_preset(
        model_type="qwen3", vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8,
        head_dim=128, intermediate_size=3072, max_position_embeddings=40960, rope_theta=1_000_000.0, norm_eps=1e-6,
        qk_norm="head", tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645),
}
