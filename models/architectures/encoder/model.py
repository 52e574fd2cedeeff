"""Encoder-only models (Devlin et al., 2019), assembled from ``flaxzoo.models.layers``; RoBERTa reuses them.

Every class keeps its ``TransformerStack`` at ``backbone`` and its pooler / head modules beside it, so a parameter
path means the same in every class (``backbone.layers.3.mlp.up.kernel``, ``pooler.kernel``).
"""

from __future__ import annotations

import functools
from typing import Callable, Collection, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.embeddings import LMHead
from flaxzoo.models.layers.feedforward import ACTIVATION_FUNCTIONS
from flaxzoo.models.layers.linear import Dense
from flaxzoo.models.layers.model import LanguageModel, StackModel
from flaxzoo.models.layers.norms import make_norm


class SpanLogits(NamedTuple):
    """A question-answering head's scores: ``start_logits``, ``end_logits``, each ``[batch, seq]`` (float32), the
    logit of each token being the first / last of the answer span."""

    start_logits: jax.Array
    end_logits: jax.Array


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


def pool(pooler: Dense, hidden: jax.Array, activation: str = "tanh") -> jax.Array:
    """The [CLS] pooler ``act(dense(hidden[:, 0]))`` (BERT: tanh; the config's ``pooler_activation``);
    ``[batch, seq, hidden]`` → ``[batch, hidden]``."""
    act = jnp.tanh if activation == "tanh" else ACTIVATION_FUNCTIONS[activation]
    return act(pooler(hidden[:, 0]))


class BertModel(StackModel):
    """The bidirectional encoder and, with ``add_pooler``, the pooler (:func:`pool`)."""

    task = "base"
    causal = False

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, add_pooler: bool = True):
        super().__init__(config, rngs=rngs)
        self.pooler = _dense(config, config.hidden_size, ("embed", None), rngs) if add_pooler else None

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, *,
                 segment_ids: jax.Array | None = None, return_attention_weights: bool = False) -> EncoderOutput:
        out = self.backbone(input_ids, attention_mask, token_type_ids, position_ids, segment_ids=segment_ids,
                            return_attention_weights=return_attention_weights)
        pooled = (pool(self.pooler, out.hidden, self.config.pooler_activation) if self.pooler is not None
                  else None)
        return EncoderOutput(out.hidden, pooled, out.attention_weights)


def encoder_factory(cls: type, params: Collection[tuple]) -> Callable[..., nnx.Module]:
    """What builds ``cls`` for a checkpoint filling the flaxzoo parameters ``params``: a ``BertModel`` gets a pooler
    only if the checkpoint has one (all-MiniLM-L6-v2 has none); the other classes are built as they are. The one
    place that knows a BERT may lack its pooler."""
    if cls is BertModel and ("pooler", "kernel") not in set(params):
        return functools.partial(BertModel, add_pooler=False)
    return cls


class BertForMaskedLM(LanguageModel):
    """Encoder + transform (dense, activation, norm) + decoder tied to the token table, with a vocabulary bias.

    The transform maps hidden → ``config.embedding_width`` (the token table's width: ``hidden_size`` unless the
    embeddings are factorised, as ALBERT's and ELECTRA's generator's are)."""

    task = "masked_lm"
    causal = False

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        width = config.embedding_width
        self.transform = _dense(config, width, ("embed", None), rngs)
        self.transform_norm = make_norm(config, rngs, width)
        self.decoder = LMHead(config, use_bias=True, rngs=rngs, features=width)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """The MLM head alone: ``[batch, n, hidden]`` encoder states → ``[batch, n, vocab]`` logits (the compute
        dtype), e.g. for the scored positions only (BERT's pre-training gathers them first)."""
        hidden = self.transform_norm(ACTIVATION_FUNCTIONS[self.config.activation](self.transform(hidden)))
        return self.decoder(hidden, self.backbone.embeddings.tokens)


class EncoderWithHead(StackModel):
    """An encoder and a task head: ``model(input_ids, attention_mask, token_type_ids, position_ids, *,
    segment_ids)`` (each ``[batch, seq]``) runs the encoder and gives its final states, with ``attention_mask`` for a
    head that pools over the real tokens, to :meth:`head_outputs`, which each task's class defines."""

    causal = False

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, *,
                 segment_ids: jax.Array | None = None):
        hidden = self.hidden_states(input_ids, attention_mask, token_type_ids, position_ids, segment_ids=segment_ids)
        return self.head_outputs(hidden, attention_mask)

    def head_outputs(self, hidden: jax.Array, attention_mask: jax.Array | None):
        raise NotImplementedError(f"{type(self).__name__} defines no head_outputs")


class BertForSequenceClassification(EncoderWithHead):
    """Encoder + pooler + dropout + a linear classifier over ``num_labels``."""

    task = "sequence_classification"

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.pooler = _dense(config, config.hidden_size, ("embed", None), rngs)
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
        self.classifier = _dense(config, config.num_labels, ("embed", None), rngs)

    def head_outputs(self, hidden: jax.Array, attention_mask: jax.Array | None) -> jax.Array:
        """Encoder states ``[batch, seq, hidden]`` → logits ``[batch, num_labels]`` (float32)."""
        pooled = pool(self.pooler, hidden, self.config.pooler_activation)
        return self.classifier(self.dropout(pooled)).astype(jnp.float32)


class BertForTokenClassification(EncoderWithHead):
    """Encoder (no pooler) + dropout + a linear classifier over ``num_labels`` applied to every token (tagging, NER)."""

    task = "token_classification"

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
        self.classifier = _dense(config, config.num_labels, ("embed", None), rngs)

    def head_outputs(self, hidden: jax.Array, attention_mask: jax.Array | None) -> jax.Array:
        """Encoder states ``[batch, seq, hidden]`` → per-token logits ``[batch, seq, num_labels]`` (float32)."""
        return self.classifier(self.dropout(hidden)).astype(jnp.float32)


class BertForQuestionAnswering(EncoderWithHead):
    """Encoder (no pooler) + a linear layer giving each token two scores, the answer span's start and end
    (extractive question answering, SQuAD: Devlin et al., 2019, section 4.2)."""

    task = "question_answering"

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.qa_outputs = _dense(config, 2, ("embed", None), rngs)

    def head_outputs(self, hidden: jax.Array, attention_mask: jax.Array | None) -> SpanLogits:
        """Encoder states ``[batch, seq, hidden]`` → :class:`SpanLogits` (``[batch, seq]`` each, float32)."""
        scores = self.qa_outputs(hidden).astype(jnp.float32)
        return SpanLogits(scores[..., 0], scores[..., 1])
