"""Gemma-3-270M: the published sizes (Hugging Face's ``config.json`` values; ``tests/test_presets.py`` counts their
parameters against transformers' models built from the same configs)."""

from __future__ import annotations

from flaxzoo.models.architectures.decoder.config import decoder_preset
from flaxzoo.models.config import TransformerConfig

def gemma3_layer_types(num_layers: int, every: int = 6) -> tuple[str, ...]:
    """Gemma 3's pattern: five sliding-window layers, then one global, repeated."""
    return tuple("full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(num_layers))


PRESETS: dict[str, TransformerConfig] = {
    "gemma-3-270m": decoder_preset(
        model_type="gemma3_text", vocab_size=262144, hidden_size=640, num_layers=18, num_heads=4, num_kv_heads=1,
        head_dim=256, intermediate_size=2048, max_position_embeddings=32768, rope_theta=1_000_000.0,
        rope_local_theta=10_000.0, norm_eps=1e-6, activation="gelu_tanh", norm_placement="sandwich",
        norm_unit_offset=True, embedding_multiplier=640 ** 0.5, qk_norm="head", query_scale=256 ** -0.5,
        sliding_window=512, layer_types=gemma3_layer_types(18), tie_word_embeddings=True, pad_token_id=0,
        bos_token_id=2, eos_token_id=1),
}
