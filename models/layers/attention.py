"""Multi-head attention with grouped-query heads, combined masks, an additive bias path and a KV cache."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from models.config import TransformerConfig
from models.layers.attention_core import attend, attention_with_weights
from models.layers.linear import Dense
from models.layers.positions import apply_rope


class KVCache(NamedTuple):
    """One layer's cached keys and values, each ``[batch, max_len, kv_heads, head_dim]``."""

    key: jax.Array
    value: jax.Array

    @classmethod
    def zeros(cls, config: TransformerConfig, batch: int, max_len: int) -> "KVCache":
        shape = (batch, max_len, config.num_kv_heads, config.head_dim)
        return cls(jnp.zeros(shape, config.dtype), jnp.zeros(shape, config.dtype))


def make_attention_mask(key_valid: jax.Array | None, *, causal: bool,
                        query_slots: jax.Array | None = None, key_slots: jax.Array | None = None) -> jax.Array | None:
    """A boolean ``[batch, 1, q, k]`` mask (True = may attend), or None when nothing is masked.

    ``key_valid: [batch, k]`` marks real (non-pad) keys. ``causal`` lets query slot ``i`` see key slots ``<= i``;
    ``query_slots`` / ``key_slots`` (``[q]`` / ``[k]``) give the slots' places in the sequence when they are not
    ``0..q-1`` (decoding against a KV cache). Pad queries are left attending (their outputs are ignored); masking
    whole rows would only produce NaNs.
    """
    if key_valid is None and not causal:
        return None
    mask = None
    if key_valid is not None:
        mask = key_valid.astype(bool)[:, None, None, :]
    if causal:
        if query_slots is None or key_slots is None:
            raise ValueError("a causal mask needs query_slots and key_slots")
        causal_mask = (key_slots[None, :] <= query_slots[:, None])[None, None]
        mask = causal_mask if mask is None else mask & causal_mask
    return mask


class Attention(nnx.Module):
    """Multi-head / grouped-query / multi-query self-attention.

    ``num_kv_heads`` key/value heads are shared by groups of ``num_heads // num_kv_heads`` query heads. RoPE, when the
    config uses it, rotates queries and keys here. The softmax core is ``attention_core.attend``:
    ``jax.nn.dot_product_attention`` (cuDNN flash attention) on GPU, a closed-form-backward kernel elsewhere
    (``config.attention_impl``).
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

    def __call__(self, x: jax.Array, *, positions: jax.Array, mask: jax.Array | None = None,
                 bias: jax.Array | None = None, cache: KVCache | None = None, cache_index: jax.Array | None = None,
                 return_weights: bool = False) -> tuple[jax.Array, KVCache | None, jax.Array | None]:
        """Attend ``x: [batch, seq, hidden]``.

        Args:
          positions: ``[batch, seq]`` token positions (for RoPE).
          mask: boolean ``[batch, 1, q, k]``; None means causal-only (decoders) or nothing masked (encoders).
          bias: additive ``[batch, heads, q, k]`` (ALiBi).
          cache: when given, this step's keys/values are written at ``cache_index`` and the queries attend over the
            whole cache (``k = max_len``); ``mask`` must then cover the cache slots.
          return_weights: also return the softmax weights ``[batch, heads, q, k]`` (slower path).

        Returns ``(output [batch, seq, hidden], updated cache or None, weights or None)``.
        """
        config = self.config
        query, key, value = self.query(x), self.key(x), self.value(x)  # [batch, seq, heads, head_dim]
        if config.position == "rope":
            query = apply_rope(query, positions, theta=config.rope_theta, layout=config.rope_layout)
            key = apply_rope(key, positions, theta=config.rope_theta, layout=config.rope_layout)
        if cache is not None:
            start = (0, cache_index, 0, 0)
            cache = KVCache(jax.lax.dynamic_update_slice(cache.key, key.astype(cache.key.dtype), start),
                            jax.lax.dynamic_update_slice(cache.value, value.astype(cache.value.dtype), start))
            key, value = cache.key, cache.value
        is_causal = config.causal and mask is None and cache is None
        if return_weights:
            context, weights = attention_with_weights(query, key, value, mask, bias, is_causal)
        else:
            context = attend(query, key, value, mask=mask, bias=bias, is_causal=is_causal,
                             impl=config.attention_impl)
            weights = None
        return self.out(context), cache, weights

