"""ModernBERT (Warner et al., 2024): a pre-LN encoder with RoPE, GeGLU, bias-free LayerNorms and alternating
global / bidirectional sliding-window layers, assembled from ``flaxzoo.models.layers``.

What the config cannot say lives here: the first layer has no attention norm (:class:`ModernBertBlock`), and the
heads read the encoder through ModernBERT's prediction head ``norm(act(dense(h)))`` (:class:`PredictionHead`). Every
class keeps its ``TransformerStack`` at ``backbone``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxzoo.models.architectures.encoder.model import EncoderOutput, EncoderWithHead, SpanLogits
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.attention import KVCache
from flaxzoo.models.layers.block import TransformerBlock
from flaxzoo.models.layers.embeddings import LMHead, is_concrete
from flaxzoo.models.layers.feedforward import ACTIVATION_FUNCTIONS
from flaxzoo.models.layers.linear import Dense
from flaxzoo.models.layers.masking import AttentionLayout
from flaxzoo.models.layers.model import LanguageModel, StackModel
from flaxzoo.models.layers.norms import make_norm


class FirstLayer(nnx.Variable):
    """A block's constant flag (not a parameter): whether it is the stack's first layer."""


class ModernBertBlock(TransformerBlock):
    """Pre-LN ``x + attention(attention_norm(x))``, then ``x + mlp(mlp_norm(x))``, except that the first layer
    attends to ``x`` itself (Hugging Face's ``attn_norm = Identity`` on layer 0).

    Every block holds an attention norm, so that all layers have one structure and stack for ``scan_layers``; the
    flag ``first_layer`` (set by :func:`mark_first_layer`, stacked ``[num_layers]`` with the layers) skips it."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        if config.norm_placement != "pre" or config.parallel_residual:
            raise ValueError(f"norm_placement={config.norm_placement!r}, parallel_residual="
                             f"{config.parallel_residual}: ModernBERT's block is pre-LN and sequential")
        super().__init__(config, rngs=rngs)
        self.first_layer = FirstLayer(jnp.asarray(False))

    def __call__(self, x: jax.Array, layout: AttentionLayout, *, cache: KVCache | None = None,
                 return_weights: bool = False, sliding: bool | jax.Array = False
                 ) -> tuple[jax.Array, KVCache | None, jax.Array | None]:
        """``x: [batch, seq, hidden]`` → ``(x, cache, attention weights or None)``, as ``TransformerBlock``."""
        h = jnp.where(self.first_layer[...], x, self.attention_norm(x))
        attended, cache, weights = self.attention(h, layout, cache=cache, return_weights=return_weights,
                                                  sliding=sliding)
        x = x + self.dropout(attended)
        x = x + self.dropout(self.mlp(self.mlp_norm(x)))
        return x, cache, weights


def mark_first_layer(layers: nnx.Module) -> None:
    """Set the ``first_layer`` flag of the first of ``layers`` (an ``nnx.List`` of blocks, or one stacked block)."""
    if isinstance(layers, nnx.List):
        layers[0].first_layer.set_value(jnp.asarray(True))
    else:
        flags = layers.first_layer.get_value()
        layers.first_layer.set_value(jnp.arange(flags.shape[0]) == 0)


def _dense(config: TransformerConfig, out_features: int, use_bias: bool, rngs: nnx.Rngs) -> Dense:
    return Dense((config.hidden_size,), (out_features,), axes=("embed", None), use_bias=use_bias, rngs=rngs,
                 init_std=config.initializer_range, dtype=jnp.dtype(config.dtype),
                 param_dtype=jnp.dtype(config.param_dtype))


class PredictionHead(nnx.Module):
    """``norm(act(dense(h)))`` (``[..., hidden]`` in and out): ``dense`` biased with ``config.head_bias``, ``act``
    ``config.pooler_activation``, ``norm`` the config's LayerNorm (Hugging Face's ``ModernBertPredictionHead``)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.dense = _dense(config, config.hidden_size, config.head_bias, rngs)
        self.norm = make_norm(config, rngs)
        name = config.pooler_activation
        self.activation = jnp.tanh if name == "tanh" else ACTIVATION_FUNCTIONS[name]

    def __call__(self, hidden: jax.Array) -> jax.Array:
        return self.norm(self.activation(self.dense(hidden)))


def no_token_types(token_type_ids: jax.Array | None) -> None:
    """ModernBERT has no token types: all-zero ``token_type_ids`` (what BERT-style batches, masked-LM pre-training's
    among them, carry) are dropped; ValueError for other known values."""
    if token_type_ids is not None and is_concrete(token_type_ids) and np.any(np.asarray(token_type_ids) != 0):
        raise ValueError("token_type_ids holds non-zero types: ModernBERT has no token-type embeddings (expected "
                         "None or zeros)")
    return None


class _ModernBert(StackModel):
    causal = False
    block = ModernBertBlock

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        mark_first_layer(self.backbone.layers)

    def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                      token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, *,
                      segment_ids: jax.Array | None = None) -> jax.Array:
        """The final states ``[batch, seq, hidden]`` (zero ``token_type_ids`` are dropped: :func:`no_token_types`)."""
        return super().hidden_states(input_ids, attention_mask, no_token_types(token_type_ids), position_ids,
                                     segment_ids=segment_ids)


class ModernBertModel(_ModernBert):
    """The encoder: embeddings (token table + LayerNorm), the layers, the final norm; no pooler."""

    task = "base"

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, *,
                 segment_ids: jax.Array | None = None, return_attention_weights: bool = False) -> EncoderOutput:
        """``[batch, seq]`` ids → :class:`EncoderOutput` (``pooler_output`` None)."""
        out = self.backbone(input_ids, attention_mask, no_token_types(token_type_ids), position_ids,
                            segment_ids=segment_ids,
                            return_attention_weights=return_attention_weights)
        return EncoderOutput(out.hidden, None, out.attention_weights)


class ModernBertForMaskedLM(_ModernBert, LanguageModel):
    """Encoder + prediction head (``transform``: dense → act → ``transform_norm``) + decoder tied to the token
    table, with a vocabulary bias when ``config.decoder_bias``."""

    task = "masked_lm"

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.transform = _dense(config, config.hidden_size, config.head_bias, rngs)
        self.transform_norm = make_norm(config, rngs)
        self.decoder = LMHead(config, use_bias=config.decoder_bias, rngs=rngs)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """``[batch, n, hidden]`` encoder states → ``[batch, n, vocab]`` logits (the compute dtype)."""
        name = self.config.pooler_activation
        act = jnp.tanh if name == "tanh" else ACTIVATION_FUNCTIONS[name]
        return self.decoder(self.transform_norm(act(self.transform(hidden))), self.backbone.embeddings.tokens)


def mean_pool(hidden: jax.Array, attention_mask: jax.Array | None) -> jax.Array:
    """The mean of ``hidden: [batch, seq, hidden]`` over each row's real tokens (``attention_mask: [batch, seq]``,
    1 = token; None: all) → ``[batch, hidden]``."""
    if attention_mask is None:
        return hidden.mean(axis=1)
    weights = attention_mask.astype(hidden.dtype)[..., None]
    return (hidden * weights).sum(axis=1) / jnp.maximum(weights.sum(axis=1), 1)


class _ModernBertWithHead(_ModernBert, EncoderWithHead):
    """A task head on the encoder: ModernBERT's prediction head → dropout → a linear ``classifier`` (with bias) of
    :meth:`classifier_width` outputs."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.head = PredictionHead(config, rngs=rngs)
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
        self.classifier = _dense(config, self.classifier_width(config), True, rngs)

    def classifier_width(self, config: TransformerConfig) -> int:
        """The classifier's outputs: ``num_labels`` (a span head: 2)."""
        return config.num_labels


class ModernBertForSequenceClassification(_ModernBertWithHead):
    """Encoder → pooling (``config.classifier_pooling``: the first token, or the mean of the real tokens) →
    prediction head → dropout → linear classifier over ``num_labels``."""

    task = "sequence_classification"

    def head_outputs(self, hidden: jax.Array, attention_mask: jax.Array | None) -> jax.Array:
        """Encoder states ``[batch, seq, hidden]`` → logits ``[batch, num_labels]`` (float32)."""
        if self.config.classifier_pooling == "mean":
            pooled = mean_pool(hidden, None if attention_mask is None else jnp.asarray(attention_mask))
        else:
            pooled = hidden[:, 0]
        return self.classifier(self.dropout(self.head(pooled))).astype(jnp.float32)


class ModernBertForTokenClassification(_ModernBertWithHead):
    """Encoder → prediction head → dropout → a linear classifier over ``num_labels`` on every token."""

    task = "token_classification"

    def head_outputs(self, hidden: jax.Array, attention_mask: jax.Array | None) -> jax.Array:
        """Encoder states ``[batch, seq, hidden]`` → per-token logits ``[batch, seq, num_labels]`` (float32)."""
        return self.classifier(self.dropout(self.head(hidden))).astype(jnp.float32)


class ModernBertForQuestionAnswering(_ModernBertWithHead):
    """Encoder → prediction head → dropout → a linear layer giving each token the answer span's start and end
    scores (Hugging Face's ``classifier`` with two outputs)."""

    task = "question_answering"

    def classifier_width(self, config: TransformerConfig) -> int:
        return 2

    def head_outputs(self, hidden: jax.Array, attention_mask: jax.Array | None) -> SpanLogits:
        """Encoder states ``[batch, seq, hidden]`` → :class:`SpanLogits` (``[batch, seq]`` each, float32)."""
        scores = self.classifier(self.dropout(self.head(hidden))).astype(jnp.float32)
        return SpanLogits(scores[..., 0], scores[..., 1])
