"""SmolLM2-135M and Llama-3.2-1B (Llama layouts), and a tiny one for tests: the published sizes (Hugging Face's
``config.json`` values; ``tests/test_presets.py`` counts their parameters against transformers' models built from the
same configs)."""

from __future__ import annotations

from flaxzoo.models.architectures.decoder.config import decoder_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "smollm2-135m": decoder_preset(
        vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, intermediate_size=1536,
        max_position_embeddings=8192, rope_theta=100_000.0, tie_word_embeddings=True, bos_token_id=1,
        eos_token_id=2,
    ),
    "llama-3.2-1b": decoder_preset(
        vocab_size=128256, hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8, intermediate_size=8192,
        max_position_embeddings=131072, rope_theta=500_000.0,
        rope_scaling=(("factor", 32.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
                      ("original_max_position_embeddings", 8192), ("rope_type", "llama3")),
        tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001),
    "llama-tiny": decoder_preset(vocab_size=1000, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                 intermediate_size=128, max_position_embeddings=128, tie_word_embeddings=False,
                                 bos_token_id=1, eos_token_id=2),
}
