"""Disentangled relative attention (He et al., 2021, DeBERTa): content→position and position→content scores from one
table of relative-distance embeddings that every layer shares.

With queries ``q_i``, keys ``k_j`` and the table ``P`` (``[2 · span, hidden]``, ``span`` = ``position_buckets`` or
``max_relative_positions``), each layer projects the table to positional keys ``P·W_pk`` and queries ``P·W_pq`` (its
own key / query projections with ``share_att_key``) and adds, per head,

    c2p[i, j] = q_i · pk[δ(i, j)],   p2c[i, j] = k_j · pq[δ(i, j)],   δ(i, j) = clip(bucket(i - j) + span, 0, 2·span-1)

to the content score ``q_i · k_j``; all three are divided by ``√(head_dim · scale_factor)``, ``scale_factor = 1 +``
the number of positional terms. ``bucket`` keeps distances below ``position_buckets / 2`` exact and maps longer ones
logarithmically (:func:`log_bucket_position`). The two terms form one additive ``[batch, heads, q, k]`` bias that
the attention core takes through its ``bias`` argument (``attention_core.attend``), as ALiBi's.

The shared table lives on the layer stack (:class:`RelativeEmbeddings`) and reaches every layer through the call's
``AttentionLayout.relative_embeddings``; the per-layer projections live in ``Attention`` (``pos_key`` /
``pos_query``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.linear import Dense, logical_param
from flaxzoo.models.layers.norms import make_norm


def log_bucket_position(relative: jax.Array, buckets: int, max_position: int) -> jax.Array:
    """Signed log buckets of integer distances ``relative`` (any shape, same shape back, int32): ``|d| < buckets //
    2`` stays ``d``; longer distances become ``sign(d) · (mid + ceil(log(|d| / mid) / log((max_position - 1) / mid) ·
    (mid - 1)))``, ``mid = buckets // 2`` (so ``max_position - 1`` maps to ``buckets - 1``)."""
    mid = buckets // 2
    relative = relative.astype(jnp.int32)
    near = (relative < mid) & (relative > -mid)
    magnitude = jnp.where(near, mid - 1, jnp.abs(relative)).astype(jnp.float32)
    # float32 throughout, as the reference computes it (a float64 log moves some ceil() boundaries)
    scaled = jnp.log(magnitude / mid) / jnp.log(jnp.float32((max_position - 1) / mid)) * (mid - 1)
    far = jnp.ceil(scaled) + mid
    return jnp.where(magnitude <= mid, relative, (far * jnp.sign(relative)).astype(jnp.int32)).astype(jnp.int32)


def relative_indices(config: TransformerConfig, query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
    """``[batch, q, k]`` rows of the relative table each (query, key) pair reads: ``clip(bucket(p_q - p_k) + span, 0,
    2 · span - 1)`` for positions ``[batch, q]`` / ``[batch, k]``."""
    relative = query_positions[:, :, None].astype(jnp.int32) - key_positions[:, None, :].astype(jnp.int32)
    if config.position_buckets is not None:
        relative = log_bucket_position(relative, config.position_buckets, config.relative_max_distance)
    span = config.relative_span
    return jnp.clip(relative + span, 0, 2 * span - 1)


class RelativeEmbeddings(nnx.Module):
    """The ``[2 · relative_span, hidden]`` table of relative distances every layer reads, with its LayerNorm when
    ``config.relative_embedding_norm`` (DeBERTa-v3's ``norm_rel_ebd="layer_norm"``)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.embedding = logical_param(rngs, jax.nn.initializers.normal(config.initializer_range),
                                       (2 * config.relative_span, config.hidden_size), (None, "embed"),
                                       jnp.dtype(config.param_dtype))
        self.norm = make_norm(config, rngs) if config.relative_embedding_norm else None
        self.dtype = jnp.dtype(config.dtype)

    def __call__(self) -> jax.Array:
        """The (normalised) table ``[2 · relative_span, hidden]``."""
        table = self.embedding[...].astype(self.dtype)
        return table if self.norm is None else self.norm(table)


def positional_projections(config: TransformerConfig, rngs: nnx.Rngs) -> tuple[Dense | None, Dense | None]:
    """A layer's own ``(pos_key, pos_query)`` projections of the relative table (``[hidden] → [heads, head_dim]``,
    with bias): None for a term the config lacks, and both None with ``share_att_key`` (the layer's key / query
    projections serve)."""
    if not config.relative_attention or config.share_att_key:
        return None, None
    d, h, hd = config.hidden_size, config.num_heads, config.head_dim
    common = dict(use_bias=True, rngs=rngs, dtype=jnp.dtype(config.dtype), param_dtype=jnp.dtype(config.param_dtype),
                  init_std=config.initializer_range, axes=("embed", "heads", "head_dim"))
    types = config.relative_attention_types
    return (Dense((d,), (h, hd), **common) if "c2p" in types else None,
            Dense((d,), (h, hd), **common) if "p2c" in types else None)


def disentangled_bias(config: TransformerConfig, query: jax.Array, key: jax.Array, table: jax.Array,
                      indices: jax.Array, pos_key: nnx.Module | None, pos_query: nnx.Module | None) -> jax.Array:
    """The ``[batch, heads, q, k]`` float32 bias ``(c2p + p2c) / √(head_dim · scale_factor)``.

    ``query: [batch, q, heads, d]``, ``key: [batch, k, heads, d]`` (before any scaling); ``table: [2 · span,
    hidden]`` (normalised); ``indices: [batch, q, k]`` (:func:`relative_indices`); ``pos_key`` / ``pos_query``: the
    projections of the table to positional keys / queries (``[2 · span, heads, d]``)."""
    batch, q_len, heads, head_dim = query.shape
    k_len = key.shape[1]
    scale = 1.0 / math.sqrt(head_dim * config.relative_scale_factor)
    bias = jnp.zeros((batch, heads, q_len, k_len), jnp.float32)
    rows = jnp.broadcast_to(indices[:, None], (batch, heads, q_len, k_len))
    if "c2p" in config.relative_attention_types:
        keys = pos_key(table)  # [2 · span, heads, d]
        scores = jnp.einsum("bqhd,rhd->bhqr", query, keys, preferred_element_type=jnp.float32)
        bias = bias + jnp.take_along_axis(scores, rows, axis=-1)
    if "p2c" in config.relative_attention_types:
        queries = pos_query(table)
        scores = jnp.einsum("bkhd,rhd->bhkr", key, queries, preferred_element_type=jnp.float32)  # [b, h, k, 2·span]
        bias = bias + jnp.take_along_axis(scores, jnp.swapaxes(rows, -1, -2), axis=-1).swapaxes(-1, -2)
    return bias * scale
