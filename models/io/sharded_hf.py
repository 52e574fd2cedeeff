"""Parameters made shard by shard from a source's tensors (``flaxzoo.models.io.sharded``'s Hugging Face, GGUF and
LoRA-run paths): each parameter is one ``jax.make_array_from_callback`` whose callback, given the index of one
addressable shard, returns that shard's values.

* A safetensors tensor (``flaxzoo.models.io.stored.StoredTensor``) whose table transform is a rearrangement of axes
  (``flaxzoo.models.io.slicing``) is read only in the box the shard comes from: a transpose reads the transposed
  slices, a head split a contiguous range, one part of a fused tensor that part, a stacked ``[num_layers, ...]``
  parameter the layers of the index, each from its own tensor.
* Anything else (a transform that computes, a GGUF tensor, which is dequantised whole, a pickle, a LoRA run's
  merged values) is read whole once per parameter per process, translated, and sliced.

The vocabulary rows a table is padded with (``pad_vocab_to``) are zeros, never read; a shard index that several
local devices share (a replicated mesh axis) is read once.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding

from flaxzoo.models.families.base import Entry, ParamPath
from flaxzoo.models.io.sharded_plan import Prepared, layer_groups
from flaxzoo.models.io.slicing import Layout, Unmappable, read_index, trace_layouts
from flaxzoo.models.io.stored import OnRead, Read, StoredTensor

__all__ = ["tensor_arrays"]

Index = tuple[slice, ...]


class _Shards:
    """The callback of one parameter: its shards' values (``[num_layers, ...]`` when stacked), in its dtype."""

    def __init__(self, prepared: Prepared, path: ParamPath, per_layer: list[ParamPath] | None, dtype: Any,
                 layouts: dict[str, tuple[Layout, ...] | None], on_read: OnRead | None):
        self.prepared, self.path, self.per_layer, self.dtype = prepared, path, per_layer, dtype
        self.layouts, self.on_read = layouts, on_read
        self.done: dict[tuple, np.ndarray] = {}  # shard index -> values: a replicated shard is read once
        self.whole: dict[str, tuple[np.ndarray, ...]] = {}  # entries read whole, while this parameter is made

    def __call__(self, index: Index) -> np.ndarray:
        shape = self.prepared.abstract.shapes[self.path].shape
        bounds = tuple(s.indices(d)[:2] for s, d in zip(index, shape))
        if bounds not in self.done:
            spans = tuple(slice(a, b) for a, b in bounds)
            if self.per_layer is None:
                value = self.layer(self.path, spans)
            else:
                value = np.stack([self.layer(p, spans[1:]) for p in self.per_layer[spans[0]]])
            self.done[bounds] = np.asarray(value).astype(self.dtype, copy=False)
        return self.done[bounds]

    def layer(self, path: ParamPath, index: Index) -> np.ndarray:
        """One per-layer parameter's ``[index]``; vocabulary rows past the stored ones are zeros."""
        axis = self.prepared.vocab.get(path)
        rows = self.prepared.stored_shapes[path][axis] if axis is not None else None
        if axis is None or index[axis].stop <= rows:
            return self.read(path, index)
        start, stop = index[axis].start, index[axis].stop
        shape = [s.stop - s.start for s in index]
        shape[axis] = stop - max(start, rows)
        padding = np.zeros(shape, self.dtype)
        if start >= rows:
            return padding
        kept = self.read(path, (*index[:axis], slice(start, rows), *index[axis + 1:]))
        return np.concatenate([kept, padding.astype(kept.dtype)], axis=axis)

    def read(self, path: ParamPath, index: Index) -> np.ndarray:
        entry, output = self.prepared.entries[path]
        tensor = self.prepared.tensors[entry.hf]
        layouts = self.layout(entry, tensor)
        if layouts is not None:
            return read_index(layouts[output], index, tensor.read)
        if entry.hf not in self.whole:
            if not isinstance(tensor, StoredTensor) and self.on_read is not None:  # a StoredTensor reports itself
                shape = tuple(tensor.shape)
                self.on_read(Read(entry.hf, tuple(slice(0, d) for d in shape), int(np.prod(shape)), False))
            self.whole[entry.hf] = tuple(entry.transform.to_flax(np.asarray(tensor)))
        return np.asarray(self.whole[entry.hf][output][index])

    def layout(self, entry: Entry, tensor: Any) -> tuple[Layout, ...] | None:
        """The entry's layouts when its tensor can be read by the box and its transform is a rearrangement."""
        if not isinstance(tensor, StoredTensor):
            return None
        if entry.hf not in self.layouts:
            try:
                self.layouts[entry.hf] = trace_layouts(entry.transform, tensor.shape)
            except Unmappable:
                self.layouts[entry.hf] = None
        return self.layouts[entry.hf]


def tensor_arrays(prepared: Prepared, shardings: Mapping[ParamPath, NamedSharding], on_read: OnRead | None = None,
                  after_each: Callable[[], None] | None = None) -> dict[ParamPath, jax.Array]:
    """``{model path: global array}`` for every parameter the source has (not ``prepared.lacking``), laid out by
    ``shardings``; ``after_each()`` runs once each parameter is made (closing the files it mapped)."""
    groups = layer_groups(prepared.abstract.shapes, prepared.config.num_layers)
    layouts: dict[str, tuple[Layout, ...] | None] = {}
    out = {}
    for path, struct in prepared.abstract.shapes.items():
        if path in prepared.lacking:
            continue
        callback = _Shards(prepared, path, groups[path], np.dtype(struct.dtype), layouts, on_read)
        out[path] = jax.make_array_from_callback(tuple(struct.shape), shardings[path], callback,
                                                 dtype=struct.dtype)
        if after_each is not None:
            after_each()
    return out
