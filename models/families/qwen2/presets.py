"""Qwen2.5-0.5B: the published sizes (Hugging Face's ``config.json`` values; ``tests/test_presets.py`` counts their
parameters against transformers' models built from the same configs)."""

from __future__ import annotations

from flaxzoo.models.architectures.decoder.config import decoder_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "qwen2.5-0.5b": decoder_preset(
        model_type="qwen2", vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
        intermediate_size=4864, max_position_embeddings=32768, rope_theta=1_000_000.0, norm_eps=1e-6,
        attention_bias=True, attention_out_bias=False, tie_word_embeddings=True, bos_token_id=151643,
        eos_token_id=151643),
}
