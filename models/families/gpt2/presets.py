"""GPT-2 small, medium, large and XL, and a tiny one for tests: the published sizes (Hugging Face's ``config.json``
values; ``tests/test_presets.py`` counts their parameters against transformers' models built from the same configs)."""

from __future__ import annotations

from typing import Any

from flaxzoo.models.config import TransformerConfig

GPT2_DEFAULTS = dict(
    vocab_size=50257, max_position_embeddings=1024, model_type="gpt2", causal=True, position="learned",
    norm="layernorm", norm_eps=1e-5, norm_placement="pre", final_norm=True, activation="gelu_tanh",
    bos_token_id=50256, eos_token_id=50256, dropout=0.1, attention_dropout=0.1,
)


def gpt2_preset(**fields: Any) -> TransformerConfig:
    """GPT-2's layout and defaults (Hugging Face's ``GPT2Config``) with ``fields`` replacing or adding to them."""
    return TransformerConfig(**(GPT2_DEFAULTS | fields))


PRESETS: dict[str, TransformerConfig] = {
    "gpt2": gpt2_preset(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072),
    "gpt2-medium": gpt2_preset(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
    "gpt2-large": gpt2_preset(hidden_size=1280, num_layers=36, num_heads=20, intermediate_size=5120),
    "gpt2-xl": gpt2_preset(hidden_size=1600, num_layers=48, num_heads=25, intermediate_size=6400),
    "gpt2-tiny": gpt2_preset(vocab_size=1000, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256,
                             max_position_embeddings=128, bos_token_id=0, eos_token_id=0, dropout=0.0,
                             attention_dropout=0.0),
}
