"""ModernBERT base, and a tiny one for tests: the published sizes (Hugging Face's ``config.json`` values;
``tests/test_presets.py`` counts their parameters against transformers' models built from the same configs)."""

from __future__ import annotations

from typing import Any

from flaxzoo.models.config import TransformerConfig

MODERNBERT_DEFAULTS = dict(
    vocab_size=50368, max_position_embeddings=8192, model_type="modernbert", causal=False, position="rope",
    rope_theta=160_000.0, rope_local_theta=10_000.0, norm="layernorm", norm_eps=1e-5, norm_bias=False,
    norm_placement="pre", embedding_norm=True, final_norm=True, activation="gelu", mlp_gated=True,
    attention_bias=False, mlp_bias=False, head_bias=False, decoder_bias=True, pooler_activation="gelu",
    type_vocab_size=0, sliding_window=65, pad_token_id=50283, bos_token_id=50281, eos_token_id=50282,
)


def modernbert_preset(global_every: int = 3, **fields: Any) -> TransformerConfig:
    """ModernBERT's layout (``transformers.ModernBertConfig``'s defaults are ModernBERT-base): pre-LN, bias-free
    LayerNorms and projections, GeGLU, RoPE (θ 160,000 global, 10,000 local), every ``global_every``-th layer global
    (layer 0 first), the others a bidirectional window of ``local_attention`` 128: ``sliding_window`` = 128 // 2 + 1.
    ``fields`` replace or add to the defaults."""
    values = MODERNBERT_DEFAULTS | fields
    values["layer_types"] = tuple("sliding_attention" if i % global_every else "full_attention"
                                  for i in range(values["num_layers"]))
    return TransformerConfig(**values)


PRESETS: dict[str, TransformerConfig] = {
    "modernbert-base": modernbert_preset(hidden_size=768, num_layers=22, num_heads=12, intermediate_size=1152),
    "modernbert-tiny": modernbert_preset(
        vocab_size=1000, hidden_size=64, num_layers=3, num_heads=4, intermediate_size=96, max_position_embeddings=128,
        sliding_window=9, pad_token_id=0, bos_token_id=None, eos_token_id=None),
}
