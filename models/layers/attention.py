"""Multi-head attention with grouped-query heads, the call's attention layout, ALiBi biases and a KV cache."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.attention_core import attend, attention_with_weights
from flaxzoo.models.layers.linear import Dense
from flaxzoo.models.layers.masking import AttentionLayout
from flaxzoo.models.layers.partitioning import (ACTIVATION_BATCH, ACTIVATION_HEADS, ACTIVATION_KV_HEADS, ACTIVATION_LENGTH,
                                        constrain)
from flaxzoo.models.layers.positions import alibi_bias, apply_rope


QUERY_HEADS = (ACTIVATION_BATCH, ACTIVATION_LENGTH, ACTIVATION_HEADS, None)  # [batch, seq, heads, head_dim]
KV_HEADS = (ACTIVATION_BATCH, ACTIVATION_LENGTH, ACTIVATION_KV_HEADS, None)


class KVCache(NamedTuple):
    """One layer's cached keys and values, each ``[batch, max_len, kv_heads, head_dim]``."""

    key: jax.Array
    value: jax.Array


class Attention(nnx.Module):
    """Multi-head / grouped-query / multi-query self-attention.

    ``num_kv_heads`` key/value heads are shared by groups of ``num_heads // num_kv_heads`` query heads. RoPE, when the
    config uses it, rotates queries and keys here. Which query sees which key comes from the call's
    ``AttentionLayout`` (``models/layers/masking.py``); the softmax core is ``attention_core.attend`` (cuDNN, XLA or
    the closed-form-backward kernel: ``attention_core.choose_backend``). ``attention_dropout`` drops attention
    probabilities in training mode.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        d, h, kv, hd = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        common = dict(use_bias=config.attention_bias, rngs=rngs, dtype=jnp.dtype(config.dtype),
                      param_dtype=jnp.dtype(config.param_dtype))
        std = config.initializer_range
        self.query = Dense((d,), (h, hd), axes=("embed", "heads", "head_dim"), init_std=std, **common)
        self.key = Dense((d,), (kv, hd), axes=("embed", "kv_heads", "head_dim"), init_std=std, **common)
        self.value = Dense((d,), (kv, hd), axes=("embed", "kv_heads", "head_dim"), init_std=std, **common)
        out_std = std / (math.sqrt(2 * config.num_layers) if config.causal else 1.0)
        self.out = Dense((h, hd), (d,), axes=("heads", "head_dim", "embed"), init_std=out_std, **common)
        self.probs_dropout = nnx.Dropout(config.attention_dropout, rngs=rngs)

    def _dropout_multiplier(self, batch: int, q_len: int, k_len: int) -> jax.Array | None:
        """``[batch, heads, q, k]``: 0 for a dropped probability, ``1 / (1 - rate)`` for a kept one; None in eval mode
        or at rate 0."""
        if self.probs_dropout.deterministic or not self.config.attention_dropout:
            return None
        return self.probs_dropout(jnp.ones((batch, self.config.num_heads, q_len, k_len), jnp.float32))

    def __call__(self, x: jax.Array, layout: AttentionLayout, *, cache: KVCache | None = None,
                 return_weights: bool = False) -> tuple[jax.Array, KVCache | None, jax.Array | None]:
        """Attend ``x: [batch, seq, hidden]``.

        Args:
          layout: segments, positions and causal alignment of the queries and keys (``masking.AttentionLayout``).
          cache: when given, this step's keys/values are written at slot ``layout.query_offset`` and the queries
            attend over the whole cache (``k = max_len``; the layout covers the cache slots).
          return_weights: also return the softmax weights ``[batch, heads, q, k]`` (autodiff path).

        Returns ``(output [batch, seq, hidden], updated cache or None, weights or None)``.
        """
        config = self.config
        query = constrain(self.query(x), QUERY_HEADS)  # [batch, seq, heads, head_dim]
        key, value = constrain(self.key(x), KV_HEADS), constrain(self.value(x), KV_HEADS)
        if config.position == "rope":
            query = apply_rope(query, layout.query_positions, theta=config.rope_theta, layout=config.rope_layout)
            key = apply_rope(key, layout.query_positions, theta=config.rope_theta, layout=config.rope_layout)
        if cache is not None:
            start = (0, layout.query_offset, 0, 0)
            cache = KVCache(jax.lax.dynamic_update_slice(cache.key, key.astype(cache.key.dtype), start),
                            jax.lax.dynamic_update_slice(cache.value, value.astype(cache.value.dtype), start))
            key, value = cache.key, cache.value
        mask = layout.mask(config.causal)
        is_causal = config.causal and mask is None
        bias = (alibi_bias(config.num_heads, layout.query_positions, layout.key_positions, causal=config.causal)
                if config.position == "alibi" else None)
        dropout = self._dropout_multiplier(x.shape[0], x.shape[1], key.shape[1])
        if return_weights:
            context, weights = attention_with_weights(query, key, value, mask, bias, is_causal, dropout)
        else:
            segments = None if layout.query_segments is None else (layout.query_segments, layout.key_segments)
            context = attend(query, key, value, mask=mask, bias=bias, is_causal=is_causal,
                             impl=config.attention_impl, dropout=dropout, segments=segments,
                             causal_segments=config.causal and mask is not None)
            weights = None
        return self.out(constrain(context, QUERY_HEADS)), cache, weights
