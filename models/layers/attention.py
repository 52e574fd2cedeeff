"""Multi-head attention with grouped-query heads, the call's attention layout, RoPE (scaled, partial, per-layer θ),
QK-norm, sliding windows, soft-capping, ALiBi biases and a KV cache; cross-attention over an encoder's output."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.attention_core import attend, attention_with_weights, cached_attention
from flaxzoo.models.layers.linear import Dense
from flaxzoo.models.layers.masking import AttentionLayout
from flaxzoo.models.layers.partitioning import (ACTIVATION_BATCH, ACTIVATION_HEADS, ACTIVATION_KV_HEADS, ACTIVATION_LENGTH,
                                        constrain)
from flaxzoo.models.layers.norms import make_norm
from flaxzoo.models.layers.positions import alibi_bias, rotate
from flaxzoo.models.layers.relative_attention import disentangled_bias, positional_projections, relative_indices
from flaxzoo.models.layers.relative_bias import position_bias_table
from flaxzoo.models.layers.rope_scaling import rope_angles_scaled


QUERY_HEADS = (ACTIVATION_BATCH, ACTIVATION_LENGTH, ACTIVATION_HEADS, None)  # [batch, seq, heads, head_dim]
KV_HEADS = (ACTIVATION_BATCH, ACTIVATION_LENGTH, ACTIVATION_KV_HEADS, None)


class KVCache(NamedTuple):
    """One layer's cached keys and values, each ``[batch · kv_heads, max_len, head_dim]``: heads-major, the layout
    the attention's score and context matmuls read, with batch and heads as one axis (see :func:`_cached`)."""

    key: jax.Array
    value: jax.Array


def heads_major(key: jax.Array, value: jax.Array) -> KVCache:
    """``key`` / ``value`` ``[batch, k, kv_heads, head_dim]`` as the cache's ``[batch · kv_heads, k, head_dim]``
    buffers (an encoder output's keys and values, kept for a decode loop)."""
    batch, length, kv_heads, head_dim = key.shape

    def lay_out(x: jax.Array) -> jax.Array:
        return x.transpose(0, 2, 1, 3).reshape(batch * kv_heads, length, head_dim)

    return KVCache(lay_out(key), lay_out(value))


def sequence_major(buffer: jax.Array, batch: int) -> jax.Array:
    """A ``[batch · kv_heads, k, head_dim]`` buffer as ``[batch, k, kv_heads, head_dim]`` (a view for the paths
    that take that layout)."""
    return buffer.reshape(batch, -1, *buffer.shape[1:]).transpose(0, 2, 1, 3)


def _cached(cache: KVCache, key: jax.Array, value: jax.Array, offset: jax.Array
            ) -> tuple[KVCache, jax.Array, jax.Array]:
    """``cache`` with this step's ``key`` / ``value`` (``[batch, q, kv_heads, head_dim]``) written at slot ``offset``,
    and the whole cache's keys and values as ``[batch, max_len, kv_heads, head_dim]`` for the cores.

    Why this layout (``models/layers/DECODING.md``): a sequence-major cache was relaid out (a copy of the whole
    cache) by every decode step. The decode step's core (``attention_core.cached_attention``) reads the buffers
    themselves; the views serve the paths that take ``[batch, k, kv_heads, head_dim]`` (attention weights)."""
    batch, q_len, kv_heads, head_dim = key.shape

    def write(buffer: jax.Array, new: jax.Array) -> jax.Array:
        rows = new.transpose(0, 2, 1, 3).reshape(batch * kv_heads, q_len, head_dim).astype(buffer.dtype)
        return jax.lax.dynamic_update_slice(buffer, rows, (0, offset, 0))

    cache = KVCache(write(cache.key, key), write(cache.value, value))
    return cache, sequence_major(cache.key, batch), sequence_major(cache.value, batch)


class Attention(nnx.Module):
    """Multi-head / grouped-query / multi-query self-attention, or cross-attention (``memory_kv``).

    ``num_kv_heads`` key/value heads are shared by groups of ``num_heads // num_kv_heads`` query heads. RoPE, when the
    config uses it, rotates queries and keys here. Which query sees which key comes from the call's
    ``AttentionLayout`` (``models/layers/masking.py``); the softmax core is ``attention_core.attend`` (cuDNN, XLA or
    the closed-form-backward kernel: ``attention_core.choose_backend``). ``attention_dropout`` drops attention
    probabilities in training mode.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, cross: bool = False):
        """``cross``: a cross-attention layer (an encoder-decoder's decoder), which has no position terms of its
        own."""
        self.config = config
        d, h, kv, hd = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        common = dict(use_bias=config.attention_bias, rngs=rngs, dtype=jnp.dtype(config.dtype),
                      param_dtype=jnp.dtype(config.param_dtype))
        std = config.initializer_range
        self.query = Dense((d,), (h, hd), axes=("embed", "heads", "head_dim"), init_std=std, **common)
        self.key = Dense((d,), (kv, hd), axes=("embed", "kv_heads", "head_dim"), init_std=std, **common)
        self.value = Dense((d,), (kv, hd), axes=("embed", "kv_heads", "head_dim"), init_std=std, **common)
        out_std = std / (math.sqrt(2 * config.num_layers) if config.causal else 1.0)
        self.out = Dense((h, hd), (d,), axes=("heads", "head_dim", "embed"), init_std=out_std,
                         **(common | dict(use_bias=config.attention_out_bias)))
        # QK-norm: per head over head_dim (Qwen3, Gemma 3), or over all heads' features at once (OLMo 2).
        full = config.qk_norm == "full"
        self.query_norm = (make_norm(config, rngs, h * hd if full else hd) if config.qk_norm != "none" else None)
        self.key_norm = (make_norm(config, rngs, kv * hd if full else hd) if config.qk_norm != "none" else None)
        self.probs_dropout = nnx.Dropout(config.attention_dropout, rngs=rngs)
        # DeBERTa's disentangled relative attention: this layer's projections of the shared relative table
        self.pos_key, self.pos_query = positional_projections(config, rngs)
        self.relative_dropout = nnx.Dropout(config.dropout, rngs=rngs) if config.relative_attention else None
        # umT5: each layer's own T5 bias table (T5 and mT5 share one per stack: TransformerStack's, in the layout)
        self.position_bias = (position_bias_table(config, rngs) if config.position_bias_per_layer and not cross
                              else None)

    def _dropout_multiplier(self, batch: int, q_len: int, k_len: int) -> jax.Array | None:
        """``[batch, heads, q, k]``: 0 for a dropped probability, ``1 / (1 - rate)`` for a kept one; None in eval mode
        or at rate 0."""
        if self.probs_dropout.deterministic or not self.config.attention_dropout:
            return None
        return self.probs_dropout(jnp.ones((batch, self.config.num_heads, q_len, k_len), jnp.float32))

    def _norm_heads(self, norm: nnx.Module | None, x: jax.Array) -> jax.Array:
        """QK-norm of ``x: [batch, seq, heads, head_dim]`` (the same shape back)."""
        if norm is None:
            return x
        if self.config.qk_norm == "head":
            return norm(x)
        return norm(x.reshape(*x.shape[:2], -1)).reshape(x.shape)

    def _scaled(self, query: jax.Array) -> jax.Array:
        """``query`` times ``config.query_scale · √head_dim`` when the config sets ``query_scale``: the cores scale by
        ``1 / √head_dim``, so the product is ``query_scale`` (T5's unscaled attention: 1.0)."""
        if self.config.query_scale is None:
            return query
        return query * jnp.asarray(self.config.query_scale * math.sqrt(self.config.head_dim), query.dtype)

    def _rotary(self, positions: jax.Array, sliding: bool | jax.Array) -> tuple[jax.Array, jax.Array]:
        """``cos``, ``sin`` ``[batch, seq, rotary_dim // 2]`` of ``positions: [batch, seq]``, times the RoPE scaling's
        attention factor. Sliding-window layers of a config with ``rope_local_theta`` use that θ, unscaled."""
        config = self.config

        def tables(theta: float, scaling) -> tuple[jax.Array, jax.Array]:
            angles, factor = rope_angles_scaled(positions, config.rotary_dim, theta, scaling,
                                                config.max_position_embeddings)
            return jnp.cos(angles) * factor, jnp.sin(angles) * factor

        global_tables = tables(config.rope_theta, config.rope_scaling)
        if config.rope_local_theta is None or sliding is False:
            return global_tables
        local_tables = tables(config.rope_local_theta, None)
        if sliding is True:
            return local_tables
        return tuple(jnp.where(sliding, local, full) for local, full in zip(local_tables, global_tables))

    def _relative_bias(self, query: jax.Array, key: jax.Array, layout: AttentionLayout) -> jax.Array:
        """DeBERTa's c2p + p2c scores ``[batch, heads, q, k]`` (``relative_attention.disentangled_bias``) from the
        layout's shared table; with ``share_att_key`` the layer's own key / query projections make the positional
        keys / queries."""
        if layout.relative_embeddings is None:
            raise ValueError("relative_attention needs the stack's relative table in the layout "
                             "(TransformerStack passes it; a cached decode step has none)")
        table = self.relative_dropout(layout.relative_embeddings)
        shared = self.config.share_att_key
        indices = relative_indices(self.config, layout.query_positions, layout.key_positions)
        return disentangled_bias(self.config, query, key, table, indices, self.key if shared else self.pos_key,
                                 self.query if shared else self.pos_query)

    def _core(self, query: jax.Array, key: jax.Array, value: jax.Array, layout: AttentionLayout,
              bias: jax.Array | None, dropout: jax.Array | None, windowed: bool, return_weights: bool,
              cache: KVCache | None = None, *, causal: bool) -> tuple[jax.Array, jax.Array | None]:
        """The softmax core over projected ``query: [batch, q, heads, head_dim]`` and ``key`` / ``value: [batch, k,
        kv_heads, head_dim]``: ``(context [batch, q, heads, head_dim], weights [batch, heads, q, k] or None)``,
        through ``config.sliding_window`` when ``windowed``. Given the written ``cache`` (a decode step), the
        matmuls read its buffers (``attention_core.cached_attention``). ``causal``: the config's, False for
        cross-attention."""
        config = self.config
        window = config.sliding_window if windowed else None
        mask = layout.mask(causal, window=window)
        is_causal = causal and mask is None
        softcap = config.attention_softcap
        # The closed-form cores apply the window themselves only where no explicit mask already carries it.
        own_window = window if is_causal or mask is None else None
        if cache is not None and not return_weights and dropout is None:
            return cached_attention(query, cache.key, cache.value, mask, bias, is_causal, window=own_window,
                                    softcap=softcap), None
        if return_weights:
            return attention_with_weights(query, key, value, mask, bias, is_causal, dropout, window=own_window,
                                          softcap=softcap)
        segments = None if layout.query_segments is None else (layout.query_segments, layout.key_segments)
        return attend(query, key, value, mask=mask, bias=bias, is_causal=is_causal, impl=config.attention_impl,
                      dropout=dropout, segments=segments, causal_segments=causal and mask is not None,
                      window=window, softcap=softcap), None

    def keys_values(self, source: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The keys (QK-normed where the config says) and values ``[batch, src, kv_heads, head_dim]`` of ``source:
        [batch, src, hidden]``: the layer's own input, or for cross-attention an encoder's output, computed once per
        source and passed to every call as ``memory_kv`` (a decode loop keeps them beside the self-attention
        cache)."""
        key, value = constrain(self.key(source), KV_HEADS), constrain(self.value(source), KV_HEADS)
        return self._norm_heads(self.key_norm, key), value

    def __call__(self, x: jax.Array, layout: AttentionLayout, *, cache: KVCache | None = None,
                 return_weights: bool = False, sliding: bool | jax.Array = False,
                 memory_kv: tuple[jax.Array, jax.Array] | None = None
                 ) -> tuple[jax.Array, KVCache | None, jax.Array | None]:
        """Attend ``x: [batch, seq, hidden]``: to itself, or (``memory_kv``) to an encoder's output.

        Args:
          layout: segments, positions and causal alignment of the queries and keys (``masking.AttentionLayout``).
          cache: when given, this step's keys/values are written at slot ``layout.query_offset`` and the queries
            attend over the whole cache (``k = max_len``; the layout covers the cache slots).
          return_weights: also return the softmax weights ``[batch, heads, q, k]`` (autodiff path).
          sliding: this layer attends through ``config.sliding_window`` (a Python bool; a traced one when stacked
            layers of both kinds share a scan: ``lax.cond`` then runs the windowed or the full core, each with its
            kernel).
          memory_kv: cross-attention: the keys and values of :meth:`keys_values` over an encoder's output (or a
            decode loop's :func:`heads_major` buffers of them). The queries are ``x``'s, never
            causal, unrotated and unbiased by positions (the layout's segments say which source tokens each query
            reads: its own pair's, real ones only); no ``cache``, window or relative attention applies.

        Returns ``(output [batch, seq, hidden], updated cache or None, weights or None)``.
        """
        config = self.config
        query = self._norm_heads(self.query_norm, constrain(self.query(x), QUERY_HEADS))  # [batch, seq, heads, hd]
        if memory_kv is not None:
            if cache is not None:
                raise ValueError("cross-attention (memory_kv) takes no KV cache: its keys and values are the "
                                 "encoder's, computed once by keys_values; expected cache=None")
            return self._cross(query, memory_kv, layout, return_weights)
        key, value = self.keys_values(x)
        if config.position == "rope":
            cos, sin = self._rotary(layout.query_positions, sliding)
            query, key = rotate(query, cos, sin, config.rope_layout), rotate(key, cos, sin, config.rope_layout)
        query = self._scaled(query)
        if cache is not None:
            cache, key, value = _cached(cache, key, value, layout.query_offset)
        bias = (alibi_bias(config.num_heads, layout.query_positions, layout.key_positions, causal=config.causal)
                if config.position == "alibi" else None)
        position_bias = (self.position_bias(layout.query_positions, layout.key_positions)
                         if self.position_bias is not None else layout.position_bias)
        if position_bias is not None:
            bias = position_bias if bias is None else bias + position_bias
        if config.relative_attention:
            bias, query = self._relative_bias(query, key, layout), query * jnp.asarray(
                1.0 / math.sqrt(config.relative_scale_factor), query.dtype)
        dropout = self._dropout_multiplier(x.shape[0], x.shape[1], key.shape[1])

        def core(windowed: bool, query: jax.Array, key: jax.Array, value: jax.Array):
            return self._core(query, key, value, layout, bias, dropout, windowed, return_weights, cache,
                              causal=config.causal)

        if config.sliding_window is None or isinstance(sliding, bool):
            context, weights = core(config.sliding_window is not None and sliding, query, key, value)
        else:  # stacked layers of both kinds in one scan: each kind keeps its own core (and kernel)
            context, weights = jax.lax.cond(sliding, functools.partial(core, True), functools.partial(core, False),
                                            query, key, value)
        return self.out(constrain(context, QUERY_HEADS)), cache, weights

    def _cross(self, query: jax.Array, memory_kv: tuple[jax.Array, jax.Array] | KVCache, layout: AttentionLayout,
               return_weights: bool) -> tuple[jax.Array, None, jax.Array | None]:
        """Cross-attention of projected ``query`` over ``memory_kv`` (see :meth:`__call__`): ``[batch, src,
        kv_heads, head_dim]`` keys and values, or a decode loop's :func:`heads_major` buffers (read in place)."""
        buffers = memory_kv if isinstance(memory_kv, KVCache) else None
        if buffers is not None:
            memory_kv = (sequence_major(buffers.key, query.shape[0]), sequence_major(buffers.value, query.shape[0]))
        key, value = memory_kv
        query = self._scaled(query)
        dropout = self._dropout_multiplier(query.shape[0], query.shape[1], key.shape[1])
        context, weights = self._core(query, key, value, layout, None, dropout, False, return_weights, buffers,
                                      causal=False)
        return self.out(constrain(context, QUERY_HEADS)), None, weights
