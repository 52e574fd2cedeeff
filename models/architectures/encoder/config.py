"""The encoder architecture's base config: BERT-base's published defaults (Devlin et al., 2019; Hugging Face's
``BertConfig``), which every BERT-layout family's presets override."""

from __future__ import annotations

from typing import Any

from flaxzoo.models.config import TransformerConfig

BERT_DEFAULTS: dict[str, Any] = dict(
    vocab_size=30522, max_position_embeddings=512, model_type="bert", causal=False, position="learned",
    norm="layernorm", norm_eps=1e-12, norm_placement="post", embedding_norm=True, final_norm=False,
    activation="gelu", type_vocab_size=2, pad_token_id=0, dropout=0.1, attention_dropout=0.1,
)


def encoder_preset(**fields: Any) -> TransformerConfig:
    """:data:`BERT_DEFAULTS` with ``fields`` replacing or adding to them (sizes, ``model_type``, mechanisms)."""
    return TransformerConfig(**(BERT_DEFAULTS | fields))
