"""Pythia-160M: the published sizes (Hugging Face's ``config.json`` values; ``tests/test_presets.py`` counts their
parameters against transformers' models built from the same configs)."""

from __future__ import annotations

from flaxzoo.models.architectures.decoder.config import decoder_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "pythia-160m": decoder_preset(
        model_type="gpt_neox", vocab_size=50304, hidden_size=768, num_layers=12, num_heads=12,
        intermediate_size=3072, max_position_embeddings=2048, norm="layernorm", activation="gelu", mlp_gated=False,
        attention_bias=True, mlp_bias=True, rotary_fraction=0.25, parallel_residual=True,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0),
}
