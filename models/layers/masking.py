"""Which token attends to which, and at which position: one object built once per call, read by every layer.

Every attention layer of a call sees the same ``AttentionLayout``:

* ``query_segments: [batch, q]`` / ``key_segments: [batch, k]``: the document each token belongs to (int; 0 =
  padding). A query attends only to keys of its own segment, so packed documents never see each other; padding
  queries attend only to padding (their outputs are ignored, and no row is ever fully masked). ``None`` for both
  means one document per row, nothing masked but causality. (An encoder given only ``attention_mask`` puts every
  query in document 1, so that padding queries read the real keys, as BERT's do.)
* ``query_positions: [batch, q]`` / ``key_positions: [batch, k]``: token positions (learned / sinusoidal tables,
  RoPE angles, ALiBi distances).
* ``query_offset``: the key slot of the first query. Causal models let query ``i`` see key slots
  ``<= query_offset + i``. It is ``k - q`` for a plain call (bottom-right alignment, as transformers aligns a causal
  mask against a cache) and the cache write index when decoding.

Positions restart at 0 at each document start and count real tokens only (a left-padded prompt starts at 0), except
for BERT-style encoders without ``segment_ids``, which number slots ``0 .. seq-1`` as BERT does.
``config.position_offset`` (RoBERTa: ``pad_token_id + 1``) is added to real tokens; their padding then takes position
``position_offset - 1``, exactly Hugging Face's ``create_position_ids_from_input_ids``. ``config.slot_positions``
(BART) numbers every slot instead, padding included, ``position_offset`` added (packed rows still restart at each
document).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from flaxzoo.models.config import TransformerConfig


@struct.dataclass
class AttentionLayout:
    """Segments and positions of the queries and keys of one call (see the module docstring)."""

    query_positions: jax.Array
    key_positions: jax.Array
    query_offset: jax.Array | int = 0
    query_segments: jax.Array | None = None
    key_segments: jax.Array | None = None
    relative_embeddings: jax.Array | None = None  # [2 · span, hidden]: the stack's shared relative table (DeBERTa)
    position_bias: jax.Array | None = None  # [batch, heads, q, k]: the stack's shared T5 bias (per-layer: none here)
    # An encoder-decoder's decoder: the encoder's output [batch, src, hidden] and the layout of its cross-attention
    # (the decoder's queries against the source tokens: segments say which a query reads)
    memory: jax.Array | None = None
    cross: "AttentionLayout | None" = None

    def mask(self, causal: bool, *, window: int | None = None, dense: bool = False) -> jax.Array | None:
        """Boolean ``[batch, 1, q, k]`` (True = may attend), or None when only plain causality (or nothing)
        applies and ``dense`` is False: the attention core then uses its own causal path (``is_causal``, given
        ``window`` itself).

        ``window``: a causal query sees itself and the ``window - 1`` key slots before it, a bidirectional one
        itself and the ``window - 1`` slots on each side (:func:`symmetric_band`). Packed documents keep their
        windows inside the document (the segments mask the rest)."""
        if self.query_segments is None and not dense:
            return None
        q_len, k_len = self.query_positions.shape[1], self.key_positions.shape[1]
        if self.query_segments is None:
            allowed = jnp.ones((1, q_len, k_len), bool)
        else:
            allowed = self.query_segments[:, :, None] == self.key_segments[:, None, :]
        if causal:
            allowed = allowed & causal_mask(q_len, k_len, self.query_offset)[None]
            if window is not None:
                allowed = allowed & window_band(q_len, k_len, self.query_offset, window)[None]
        elif window is not None:
            allowed = allowed & symmetric_band(q_len, k_len, self.query_offset, window)[None]
        return allowed[:, None]


def cross_layout(query_positions: jax.Array, source_mask: jax.Array | None, source_len: int, *,
                 query_segments: jax.Array | None = None, source_segments: jax.Array | None = None
                 ) -> AttentionLayout:
    """The layout of cross-attention from ``[batch, q]`` decoder queries to ``source_len`` encoder outputs.

    One pair per row: every query (padding too, as transformers does) reads the source's real tokens
    (``source_mask: [batch, src]``, None: all real). Packed pairs (``query_segments`` and ``source_segments``, numbered
    from 1 along each row, 0 = padding): a query reads only its own pair's source; a padding query reads the source's
    padding, or where the row has none its first pair, so that no query is left without a key."""
    batch, q_len = query_positions.shape
    source_positions = jnp.broadcast_to(jnp.arange(source_len, dtype=jnp.int32), (batch, source_len))
    if query_segments is None:
        keys = (jnp.ones((batch, source_len), jnp.int32) if source_mask is None
                else jnp.asarray(source_mask).astype(jnp.int32))
        return AttentionLayout(query_positions=query_positions, key_positions=source_positions,
                               query_segments=jnp.ones((batch, q_len), jnp.int32), key_segments=keys)
    if source_segments is None:
        raise ValueError("packed decoder rows (decoder segment_ids) need the source's segment_ids: expected both")
    keys = jnp.asarray(source_segments).astype(jnp.int32)
    if source_mask is not None:
        keys = keys * jnp.asarray(source_mask).astype(jnp.int32)
    queries = jnp.asarray(query_segments).astype(jnp.int32)
    has_padding = jnp.any(keys == 0, axis=-1, keepdims=True)
    queries = jnp.where((queries == 0) & ~has_padding, 1, queries)
    return AttentionLayout(query_positions=query_positions, key_positions=source_positions,
                           query_segments=queries, key_segments=keys)


def causal_mask(q_len: int, k_len: int, query_offset: jax.Array | int) -> jax.Array:
    """``[q, k]`` booleans: query ``i`` sees key slots ``<= query_offset + i``."""
    return jnp.arange(k_len)[None, :] <= jnp.arange(q_len)[:, None] + query_offset


def window_band(q_len: int, k_len: int, query_offset: jax.Array | int, window: int) -> jax.Array:
    """``[q, k]`` booleans: key slot ``j > query_offset + i - window`` (query ``i``'s sliding window, with
    :func:`causal_mask`: itself and the ``window - 1`` slots before it)."""
    return jnp.arange(k_len)[None, :] > jnp.arange(q_len)[:, None] + query_offset - window


def symmetric_band(q_len: int, k_len: int, query_offset: jax.Array | int, window: int) -> jax.Array:
    """``[q, k]`` booleans: ``|j - (query_offset + i)| < window``, a bidirectional sliding window (query ``i`` sees
    itself and the ``window - 1`` key slots on each side; ModernBERT's local layers: ``window = local_attention //
    2 + 1``)."""
    distance = jnp.arange(k_len)[None, :] - (jnp.arange(q_len)[:, None] + query_offset)
    return jnp.abs(distance) < window


def document_positions(real: jax.Array, segments: jax.Array | None = None) -> jax.Array:
    """``[batch, seq]`` positions counting the real tokens of each document: 0 at its first token.

    ``real``: ``[batch, seq]`` 1 / True for tokens, 0 for padding. ``segments``: document ids (numbered from 1, in
    order along the row; 0 = padding), or None for one document per row. Padding gets 0.
    """
    real = real.astype(jnp.int32)
    counted = jnp.cumsum(real, axis=-1) - 1  # index of each real token among the row's real tokens
    if segments is None:
        return jnp.maximum(counted, 0) * real
    segments = segments.astype(jnp.int32)
    previous = jax.lax.cummax(segments, axis=segments.ndim - 1)
    previous = jnp.concatenate([jnp.zeros_like(previous[:, :1]), previous[:, :-1]], axis=-1)
    starts = (segments > previous) & (real > 0)
    start_count = jax.lax.cummax(jnp.where(starts, counted, -1), axis=segments.ndim - 1)
    return jnp.where(real > 0, counted - start_count, 0)


def input_positions(config: TransformerConfig, seq: int, batch: int, *, attention_mask: jax.Array | None,
                    segment_ids: jax.Array | None, input_ids: jax.Array | None) -> jax.Array:
    """The default ``[batch, seq]`` positions of a full-sequence call (see the module docstring)."""
    offset = config.position_offset
    if config.slot_positions and segment_ids is None:  # BART: every slot numbered, padding included
        return jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32) + offset, (batch, seq))
    real = segment_ids if segment_ids is not None else attention_mask
    if real is None and offset and config.pad_token_id is not None and input_ids is not None:
        real = input_ids != config.pad_token_id  # RoBERTa without a mask: Hugging Face tells pads by their id
    if real is not None and (segment_ids is not None or config.causal or offset):
        real = real != 0
        positions = document_positions(real, segment_ids)
        return jnp.where(real, positions + offset, max(offset - 1, 0))
    return jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32) + offset, (batch, seq))


def full_sequence_layout(config: TransformerConfig, positions: jax.Array, *, attention_mask: jax.Array | None,
                         segment_ids: jax.Array | None) -> AttentionLayout:
    """The layout of a call over whole sequences (training, evaluation, encoding): queries are the keys.

    An encoder given only ``attention_mask`` lets every query (padding too) attend to the real keys, as BERT does,
    so even a padding slot's output (a left-padded row's slot 0, which a pooler reads) is Hugging Face's."""
    segments = segment_ids
    if attention_mask is not None:
        mask = attention_mask.astype(jnp.int32)
        if segments is None and not config.causal:
            return AttentionLayout(query_positions=positions, key_positions=positions, query_offset=0,
                                   query_segments=jnp.ones_like(mask), key_segments=mask)
        segments = mask if segments is None else segments.astype(jnp.int32) * mask
    return AttentionLayout(query_positions=positions, key_positions=positions, query_offset=0,
                           query_segments=segments, key_segments=segments)
