"""The state of cached decoding: keys and values of every layer, and the bookkeeping that goes with them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.embeddings import is_concrete
from flaxzoo.models.layers.masking import AttentionLayout, cross_layout, document_positions


@struct.dataclass
class DecodeState:
    """KV caches and where they stand, for ``batch`` rows of up to ``max_len`` tokens.

    ``keys`` / ``values``: one ``[batch · kv_heads, max_len, head_dim]`` buffer per layer (a tuple: each layer's step
    writes its new slots in place with ``dynamic_update_slice``; a stacked ``[num_layers, ...]`` cache is copied whole
    by every step of a layer scan, and a sequence-major one is relaid out by every step; see ``attention._cached`` and
    ``models/layers/DECODING.md``); ``valid: [batch, max_len]`` int32, 1
    where a slot holds a real token (left padding and slots not yet written are 0); ``lengths: [batch]`` the real
    tokens of each row so far (the next token's position); ``index``: the slot the next token is written to (the
    same for every row: prompts are left-aligned so that their last tokens share a slot).

    An encoder-decoder's decoder (:meth:`with_memory`) also keeps, per layer, the cross-attention keys and values of
    the encoder's output (``memory_keys`` / ``memory_values``, ``[batch · kv_heads, src, head_dim]`` as the cache's
    buffers, computed once and only read by each step) and which source tokens are real
    (``memory_valid: [batch, src]``).
    """

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    valid: jax.Array
    lengths: jax.Array
    index: jax.Array
    memory_keys: tuple[jax.Array, ...] = ()
    memory_values: tuple[jax.Array, ...] = ()
    memory_valid: jax.Array | None = None

    @classmethod
    def create(cls, config: TransformerConfig, batch: int, max_len: int) -> "DecodeState":
        """An empty state (nothing written yet)."""
        for name, value in (("batch", batch), ("max_len", max_len)):
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r}: expected a positive integer")
        shape = (batch * config.num_kv_heads, max_len, config.head_dim)
        zeros = tuple(jnp.zeros(shape, config.dtype) for _ in range(config.num_layers))
        return cls(keys=zeros, values=tuple(jnp.zeros(shape, config.dtype) for _ in range(config.num_layers)),
                   valid=jnp.zeros((batch, max_len), jnp.int32), lengths=jnp.zeros((batch,), jnp.int32),
                   index=jnp.zeros((), jnp.int32))

    def with_memory(self, keys: tuple[jax.Array, ...], values: tuple[jax.Array, ...], valid: jax.Array
                    ) -> "DecodeState":
        """The state with each layer's cross-attention ``keys`` / ``values`` (``[batch · kv_heads, src, head_dim]``
        buffers: ``attention.heads_major``) of an encoder output whose real tokens ``valid: [batch, src]`` marks."""
        if len(keys) != len(self.keys) or len(values) != len(self.keys):
            raise ValueError(f"memory keys / values for {len(keys)} / {len(values)} layers: expected one per layer "
                             f"({len(self.keys)})")
        if valid.shape[0] != self.batch:
            raise ValueError(f"memory_valid has shape {tuple(valid.shape)}: expected [{self.batch}, src]")
        return self.replace(memory_keys=tuple(keys), memory_values=tuple(values),
                            memory_valid=jnp.asarray(valid).astype(jnp.int32))

    @property
    def batch(self) -> int:
        return self.valid.shape[0]

    @property
    def max_len(self) -> int:
        return self.valid.shape[1]

    def advance(self, new_valid: jax.Array, position_offset: int = 0, slot_positions: bool = False
                ) -> tuple[AttentionLayout, "DecodeState"]:
        """The layout of ``q`` new tokens written at slots ``index .. index + q - 1``, and the state after them
        (``valid``, ``lengths`` and ``index`` moved on; the layers write ``keys`` / ``values``). Positions count
        each row's real tokens, or with ``slot_positions`` (BART) its slots, padding included; ``position_offset``
        is added to either.

        ``new_valid: [batch, q]``: 1 for real tokens, 0 for (left) padding. Raises ``ValueError`` when the write would
        pass ``max_len`` and the index is known (outside ``jit``); inside ``jit`` see ``overflowed``.
        """
        if new_valid.ndim != 2 or new_valid.shape[0] != self.batch:
            raise ValueError(f"new tokens' mask has shape {tuple(new_valid.shape)}: expected [{self.batch}, q]")
        q_len = new_valid.shape[1]
        index = int(np.asarray(self.index)) if is_concrete(self.index) else None
        if index is not None and index + q_len > self.max_len:
            raise ValueError(f"the decode state holds {self.max_len} tokens per row and {index} are written: "
                             f"{q_len} more do not fit (create it with max_len >= {index + q_len})")
        new_valid = new_valid.astype(jnp.int32)
        valid = jax.lax.dynamic_update_slice(self.valid, new_valid, (0, self.index))
        if slot_positions:
            slots = jnp.broadcast_to(jnp.arange(self.max_len, dtype=jnp.int32), valid.shape)
            query_positions = self.index + jnp.broadcast_to(jnp.arange(q_len, dtype=jnp.int32), new_valid.shape)
            key_positions = slots
        else:
            query_positions = self.lengths[:, None] + document_positions(new_valid)
            key_positions = document_positions(valid)
        layout = AttentionLayout(query_positions=query_positions + position_offset,
                                 key_positions=key_positions + position_offset,
                                 query_offset=self.index, query_segments=new_valid, key_segments=valid)
        if self.memory_valid is not None:
            layout = layout.replace(cross=cross_layout(layout.query_positions, self.memory_valid,
                                                       self.memory_valid.shape[1]))
        return layout, self.replace(valid=valid, lengths=self.lengths + new_valid.sum(axis=1),
                                    index=self.index + q_len)

    @property
    def overflowed(self) -> jax.Array:
        """True once more tokens were written than the state holds (possible only inside ``jit``, where the write
        index is not known): the decode step then returns NaN hidden states instead of clamping silently."""
        return self.index > self.max_len
