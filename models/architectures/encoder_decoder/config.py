"""The encoder-decoder architecture's base configs for the T5 layout: the mechanisms every T5-layout model has, T5's
defaults, and what v1.1 (Flan-T5, mT5, umT5) changes; a family's presets add their sizes."""

from __future__ import annotations

from typing import Any

from flaxzoo.models.config import TransformerConfig

# The mechanisms every T5-layout model has (Raffel et al., 2020): pre-norm RMSNorm without bias, no absolute
# positions (a relative bias instead), unscaled attention, no biases.
T5_LAYOUT: dict[str, Any] = dict(
    causal=True, position="none", norm="rmsnorm", norm_placement="pre", embedding_norm=False, final_norm=True,
    attention_bias=False, attention_out_bias=False, mlp_bias=False, query_scale=1.0, type_vocab_size=0,
    parallel_residual=False, qk_norm="none", norm_unit_offset=False, embedding_multiplier=1.0, relative_attention=False,
    sliding_window=None, attention_softcap=None, final_logit_softcap=None, embedding_size=None, shared_layers=False)

T5_DEFAULTS: dict[str, Any] = dict(
    T5_LAYOUT, vocab_size=32128, model_type="t5", head_dim=64, norm_eps=1e-6, activation="relu", mlp_gated=False,
    position_bias_buckets=32, position_bias_max_distance=128, tie_word_embeddings=True, scale_decoder_output=True,
    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, dropout=0.1, attention_dropout=0.1,
    initializer_range=0.05)
# T5 v1.1 / Flan-T5 / mT5 / umT5: gated GELU, untied head, unscaled decoder output
V1_1: dict[str, Any] = dict(activation="gelu_tanh", mlp_gated=True, tie_word_embeddings=False,
                            scale_decoder_output=False)


def t5_preset(**fields: Any) -> TransformerConfig:
    """:data:`T5_DEFAULTS` with ``fields`` replacing or adding to them (a decoder as deep as the encoder unless
    ``num_decoder_layers`` says otherwise)."""
    fields.setdefault("num_decoder_layers", fields["num_layers"])
    return TransformerConfig(**(T5_DEFAULTS | fields))
