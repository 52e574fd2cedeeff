"""Encoder-only models (Devlin et al., 2019), assembled from ``flaxzoo.models.layers``."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.embeddings import LMHead
from flaxzoo.models.layers.feedforward import ACTIVATION_FUNCTIONS
from flaxzoo.models.layers.linear import Dense
from flaxzoo.models.layers.norms import make_norm
from flaxzoo.models.layers.stack import TransformerStack


class EncoderOutput(NamedTuple):
    """``last_hidden_state: [batch, seq, hidden]``, ``pooler_output: [batch, hidden]`` (None without a pooler),
    ``attention_weights``: per layer ``[batch, heads, seq, seq]`` when asked for."""

    last_hidden_state: jax.Array
    pooler_output: jax.Array | None
    attention_weights: tuple[jax.Array, ...] | None = None


def _dense(config: TransformerConfig, out_features: int, axes, rngs: nnx.Rngs) -> Dense:
    return Dense((config.hidden_size,), (out_features,), axes=axes, use_bias=True, rngs=rngs,
                 init_std=config.initializer_range, dtype=jnp.dtype(config.dtype),
                 param_dtype=jnp.dtype(config.param_dtype))


class BertModel(nnx.Module):
    """The bidirectional encoder; the pooler is ``tanh(dense(hidden[:, 0]))``, the [CLS] summary."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, add_pooler: bool = True):
        if config.causal:
            raise ValueError("BertModel needs an encoder config (causal=False); got causal=True")
        self.config = config
        self.encoder = TransformerStack(config, rngs=rngs)
        self.pooler = _dense(config, config.hidden_size, ("embed", None), rngs) if add_pooler else None

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, *,
                 segment_ids: jax.Array | None = None, return_attention_weights: bool = False) -> EncoderOutput:
        out = self.encoder(input_ids, attention_mask, token_type_ids, position_ids, segment_ids=segment_ids,
                           return_attention_weights=return_attention_weights)
        pooled = jnp.tanh(self.pooler(out.hidden[:, 0])) if self.pooler is not None else None
        return EncoderOutput(out.hidden, pooled, out.attention_weights)


class BertForMaskedLM(nnx.Module):
    """Encoder + transform (dense, activation, norm) + decoder tied to the token table, with a vocabulary bias."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.bert = BertModel(config, rngs=rngs, add_pooler=False)
        self.transform = _dense(config, config.hidden_size, ("embed", None), rngs)
        self.transform_norm = make_norm(config, rngs)
        self.decoder = LMHead(config, use_bias=True, rngs=rngs)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, *,
                 segment_ids: jax.Array | None = None) -> jax.Array:
        """``[batch, seq]`` → logits ``[batch, seq, vocab]`` (float32)."""
        return self.logits(self.hidden_states(input_ids, attention_mask, token_type_ids, position_ids,
                                              segment_ids=segment_ids))

    def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                      token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, *,
                      segment_ids: jax.Array | None = None) -> jax.Array:
        """The encoder's final states ``[batch, seq, hidden]``, before the MLM head."""
        return self.bert(input_ids, attention_mask, token_type_ids, position_ids,
                         segment_ids=segment_ids).last_hidden_state

    def logits(self, hidden: jax.Array) -> jax.Array:
        """The MLM head alone: ``[batch, n, hidden]`` encoder states → ``[batch, n, vocab]`` logits (float32), e.g. for
        the scored positions only (BERT's pre-training gathers them first)."""
        hidden = self.transform_norm(ACTIVATION_FUNCTIONS[self.config.activation](self.transform(hidden)))
        return self.decoder(hidden, self.bert.encoder.embeddings.tokens)



class BertForSequenceClassification(nnx.Module):
    """Encoder + pooler + dropout + a linear classifier over ``num_labels``."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.bert = BertModel(config, rngs=rngs, add_pooler=True)
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
        self.classifier = _dense(config, config.num_labels, ("embed", None), rngs)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, *,
                 segment_ids: jax.Array | None = None) -> jax.Array:
        """``[batch, seq]`` → logits ``[batch, num_labels]`` (float32)."""
        pooled = self.bert(input_ids, attention_mask, token_type_ids, position_ids,
                           segment_ids=segment_ids).pooler_output
        return self.classifier(self.dropout(pooled)).astype(jnp.float32)


class BertForTokenClassification(nnx.Module):
    """Encoder (no pooler) + dropout + a linear classifier over ``num_labels`` applied to every token (tagging, NER)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.bert = BertModel(config, rngs=rngs, add_pooler=False)
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
        self.classifier = _dense(config, config.num_labels, ("embed", None), rngs)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, *,
                 segment_ids: jax.Array | None = None) -> jax.Array:
        """``[batch, seq]`` → per-token logits ``[batch, seq, num_labels]`` (float32)."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids, position_ids,
                           segment_ids=segment_ids).last_hidden_state
        return self.classifier(self.dropout(hidden)).astype(jnp.float32)
