"""T5's relative position bias (Raffel et al., 2020): a learned scalar per head for each bucket of key − query
distance, added to the attention scores.

Distances ``d = p_key - p_query`` fall into ``num_buckets`` buckets. Bidirectionally (the encoder) half the buckets
hold ``d > 0`` and half ``d <= 0``; causally (the decoder) only ``d <= 0`` counts and keys ahead of the query share
bucket 0. Within a half of ``n`` buckets, distances below ``n / 2`` keep a bucket each and longer ones are spread
logarithmically up to ``max_distance``; farther than that, the last bucket. The bias ``table[bucket(d)]`` is one
additive ``[batch, heads, q, k]`` term that the attention core takes through its ``bias`` argument, as ALiBi's and
DeBERTa's (``attention_core.attend``).

T5 and mT5 keep one table in the first layer of each stack, which every layer of that stack reads; umT5 keeps one per
layer. Either way a table is a :class:`RelativePositionBias`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.linear import logical_param


def relative_bucket(relative: jax.Array, *, bidirectional: bool, num_buckets: int, max_distance: int) -> jax.Array:
    """The bucket of each key − query distance ``relative`` (integers, any shape; the same shape back, int32).

    Computed in float32 as the reference does (its log, division and truncation toward zero), so that distances on a
    bucket boundary land where they land there."""
    relative = relative.astype(jnp.int32)
    offset = jnp.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        offset = jnp.where(relative > 0, num_buckets, 0).astype(jnp.int32)
        distance = jnp.abs(relative)
    else:
        distance = -jnp.minimum(relative, 0)
    max_exact = num_buckets // 2
    scaled = (jnp.log(distance.astype(jnp.float32) / max_exact) / jnp.float32(math.log(max_distance / max_exact))
              * (num_buckets - max_exact))
    # where distance < max_exact the log is of a value below 1 (or of 0): discarded by the where below
    far = jnp.minimum(max_exact + jnp.where(distance < max_exact, 0.0, scaled).astype(jnp.int32), num_buckets - 1)
    return offset + jnp.where(distance < max_exact, distance, far)


class RelativePositionBias(nnx.Module):
    """One table ``[num_buckets, heads]`` of learned biases, read at each (query, key) pair's bucket.

    ``bidirectional``: an encoder's table (keys on both sides of the query); False: a decoder's self-attention."""

    def __init__(self, num_buckets: int, max_distance: int, num_heads: int, *, bidirectional: bool, rngs: nnx.Rngs,
                 init_std: float = 1.0, dtype: jnp.dtype = jnp.float32, param_dtype: jnp.dtype = jnp.float32):
        exact = (num_buckets // 2 if bidirectional else num_buckets) // 2  # distances with a bucket each
        if exact < 1 or max_distance <= exact:
            kind = "bidirectional" if bidirectional else "causal"
            raise ValueError(f"num_buckets={num_buckets}, max_distance={max_distance} ({kind}): expected at least "
                             f"{4 if bidirectional else 2} buckets and max_distance above the {max(exact, 1)} "
                             "distance(s) that keep a bucket each")
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.dtype = dtype
        self.embedding = logical_param(rngs, jax.nn.initializers.normal(init_std), (num_buckets, num_heads),
                                       (None, "heads"), param_dtype)

    def __call__(self, query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
        """Positions ``[batch, q]`` and ``[batch, k]`` → the bias ``[batch, heads, q, k]`` (the compute dtype)."""
        relative = key_positions[:, None, :].astype(jnp.int32) - query_positions[:, :, None].astype(jnp.int32)
        buckets = relative_bucket(relative, bidirectional=self.bidirectional, num_buckets=self.num_buckets,
                                  max_distance=self.max_distance)
        bias = jnp.take(self.embedding[...], buckets, axis=0)  # [batch, q, k, heads]
        return jnp.transpose(bias, (0, 3, 1, 2)).astype(self.dtype)


def position_bias_table(config: TransformerConfig, rngs: nnx.Rngs) -> RelativePositionBias:
    """The T5 bias table of a config with ``position_bias_buckets``: bidirectional for an encoder, causal for a
    decoder."""
    return RelativePositionBias(config.position_bias_buckets, config.position_bias_max_distance, config.num_heads,
                                bidirectional=not config.causal, rngs=rngs, init_std=config.initializer_range,
                                dtype=jnp.dtype(config.dtype), param_dtype=jnp.dtype(config.param_dtype))
