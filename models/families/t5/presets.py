"""T5 v1.0 (t5-small / base / large) and Flan-T5 (the v1.1 layout: gated GELU, untied head, no output scaling), and a
tiny one for tests: the published sizes (Hugging Face's ``config.json`` values)."""

from __future__ import annotations

from typing import Any

from flaxzoo.models.architectures.encoder_decoder.hf import T5_LAYOUT
from flaxzoo.models.config import TransformerConfig

T5_DEFAULTS = dict(
    T5_LAYOUT, vocab_size=32128, model_type="t5", head_dim=64, norm_eps=1e-6, activation="relu", mlp_gated=False,
    position_bias_buckets=32, position_bias_max_distance=128, tie_word_embeddings=True, scale_decoder_output=True,
    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, dropout=0.1, attention_dropout=0.1,
    initializer_range=1.0)
# T5 v1.1 / Flan-T5: gated GELU, untied head, unscaled decoder output
V1_1 = dict(activation="gelu_tanh", mlp_gated=True, tie_word_embeddings=False, scale_decoder_output=False)


def t5_preset(**fields: Any) -> TransformerConfig:
    """T5's layout and defaults (transformers' ``T5Config``) with ``fields`` replacing or adding to them."""
    fields.setdefault("num_decoder_layers", fields["num_layers"])
    return TransformerConfig(**(T5_DEFAULTS | fields))


PRESETS: dict[str, TransformerConfig] = {
    "t5-small": t5_preset(hidden_size=512, intermediate_size=2048, num_layers=6, num_heads=8),
    "t5-base": t5_preset(hidden_size=768, intermediate_size=3072, num_layers=12, num_heads=12),
    "t5-large": t5_preset(hidden_size=1024, intermediate_size=4096, num_layers=24, num_heads=16),
    "flan-t5-small": t5_preset(hidden_size=512, intermediate_size=1024, num_layers=8, num_heads=6, **V1_1),
    "flan-t5-base": t5_preset(hidden_size=768, intermediate_size=2048, num_layers=12, num_heads=12, **V1_1),
    "flan-t5-large": t5_preset(hidden_size=1024, intermediate_size=2816, num_layers=24, num_heads=16, **V1_1),
    "t5-tiny": t5_preset(vocab_size=1000, hidden_size=64, head_dim=16, intermediate_size=128, num_layers=2,
                         num_heads=4, position_bias_buckets=16, position_bias_max_distance=64, dropout=0.0,
                         attention_dropout=0.0, **V1_1),
}
