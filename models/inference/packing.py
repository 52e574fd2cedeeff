"""Unpadding by packing: the real tokens of a right- or left-padded batch packed into rows of documents with
``segment_ids``, and the outputs put back in the padded layout.

Hugging Face's ModernBERT removes the padding before its layers (unpadding) and runs the real tokens as one long
sequence of documents. flaxzoo keeps static shapes and does the same with packing: each row of the packed batch holds
several documents numbered from 1 in ``segment_ids`` (0 = padding), a token attends only to its own document,
positions restart at each document, and sliding windows stay inside it (``models/layers/masking.py``). A model given
``segment_ids`` then computes, for each document, what it computes for that document alone.

    packed = pack_padded(input_ids, attention_mask)
    hidden = model.hidden_states(packed.input_ids, segment_ids=packed.segment_ids)   # [rows, length, hidden]
    per_token = unpack(hidden, packed)                                                # [batch, seq, hidden]
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class PackedBatch(NamedTuple):
    """``input_ids`` / ``segment_ids``: ``[rows, length]`` int32 (segments from 1 in each row, 0 = padding);
    ``row`` / ``column``: ``[batch, seq]``, where each token of the padded batch went (-1 for padding);
    ``pad_id``: the id padding slots hold."""

    input_ids: np.ndarray
    segment_ids: np.ndarray
    row: np.ndarray
    column: np.ndarray
    pad_id: int


def pack_padded(input_ids, attention_mask, length: int | None = None, pad_id: int = 0) -> PackedBatch:
    """Pack the real tokens of ``input_ids: [batch, seq]`` (``attention_mask``: 1 = real token, 0 = padding, on
    either side) into rows of ``length`` slots (default ``seq``), first fit in the batch's order: a sequence goes
    into the first row with room for it, else a new row. A sequence is never split. ValueError for a sequence
    longer than ``length`` or a mask of other values than 0 and 1."""
    ids, mask = np.asarray(input_ids), np.asarray(attention_mask)
    if ids.ndim != 2 or mask.shape != ids.shape:
        raise ValueError(f"input_ids {ids.shape} and attention_mask {mask.shape}: expected one [batch, seq] shape")
    if not np.isin(mask, (0, 1)).all():
        raise ValueError(f"attention_mask holds {np.unique(mask).tolist()}: expected only 0 and 1")
    length = ids.shape[1] if length is None else length
    counts = mask.sum(axis=1)
    if counts.max(initial=0) > length:
        raise ValueError(f"a sequence of {int(counts.max())} tokens does not fit rows of length={length}")
    used: list[int] = []  # slots taken in each packed row
    docs: list[int] = []  # documents in each packed row
    row = np.full(ids.shape, -1, np.int64)
    column = np.full(ids.shape, -1, np.int64)
    placed = []
    for b, n in enumerate(counts):
        target = next((r for r, u in enumerate(used) if u + n <= length), None)
        if target is None:
            used.append(0), docs.append(0)
            target = len(used) - 1
        docs[target] += 1
        real = np.flatnonzero(mask[b])
        row[b, real], column[b, real] = target, used[target] + np.arange(n)
        placed.append((b, real, target, used[target], docs[target]))
        used[target] += n
    packed_ids = np.full((max(len(used), 1), length), pad_id, np.int32)
    segments = np.zeros(packed_ids.shape, np.int32)
    for b, real, target, start, doc in placed:
        packed_ids[target, start:start + len(real)] = ids[b, real]
        segments[target, start:start + len(real)] = doc
    return PackedBatch(packed_ids, segments, row, column, pad_id)


def unpack(values, packed: PackedBatch, fill: float = 0.0) -> np.ndarray:
    """Per-token outputs ``[rows, length, ...]`` of a packed batch → ``[batch, seq, ...]`` in the padded layout
    (``fill`` at padding)."""
    values = np.asarray(values)
    out = np.full(packed.row.shape + values.shape[2:], fill, values.dtype)
    real = packed.row >= 0
    out[real] = values[packed.row[real], packed.column[real]]
    return out
