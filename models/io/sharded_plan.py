"""The one loading path's check and its tensor reads (``flaxzoo.models.io.sharded`` drives them): the weight table
checked once against the source's names and shapes (``prepare``), the parameters the source lacks, the caller's
shardings checked against the parameters, the lacking ones initialised (born sharded), and each parameter made from
a source's tensors (``tensor_arrays``).

``tensor_arrays`` makes each parameter with ``jax.make_array_from_callback``, whose callback, given the index of one
addressable shard, returns that shard's values (no shardings: the whole parameter, on the default device):

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

import dataclasses
from typing import Any, Callable, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import (Entry, ParamPath, WeightMap, check_coverage, dotted, expected_hf_shapes,
                                          format_names, match_tensors)
from flaxzoo.models.io.slicing import Layout, Unmappable, read_index, trace_layouts
from flaxzoo.models.io.sources import Plan
from flaxzoo.models.io.stored import OnRead, Read, StoredTensor
from flaxzoo.models.layers.layer_layout import LayerCounts, is_stacked_path, layer_count, unstack_layer_values
from flaxzoo.models.modeling import (AbstractParams, abstract_params, per_layer_shapes, vocab_axes, vocab_shapes,
                                     warn_initialised)

__all__ = ["Prepared", "check_shardings", "flat_tree", "initial_state", "layer_groups", "prepare",
           "tensor_arrays"]

Index = tuple[slice, ...]


@dataclasses.dataclass
class Prepared:
    """Everything decided before a value is read.

    ``abstract``: the model's abstract parameters (model layout: stacked ``[num_layers, ...]`` with
    ``config.scan_layers``). ``tensors``: the source's tensors by name (objects with ``.shape``; what the table did
    not drop). ``entries``: ``{per-layer parameter path: (table entry, which output of its transform)}``.
    ``stored_shapes``: each per-layer parameter's shape as the source holds it (vocabulary rows: ``plan.vocab_rows``).
    ``vocab``: ``{model path: vocabulary axis}``. ``lacking``: the per-layer paths the source has no tensor for."""

    config: TransformerConfig
    model_cls: type
    plan: Plan
    abstract: AbstractParams
    weights: WeightMap
    tensors: dict[str, Any]
    entries: dict[ParamPath, tuple[Entry, int]]
    stored_shapes: dict[ParamPath, tuple[int, ...]]
    vocab: dict[ParamPath, int]
    lacking: set[ParamPath]


def prepare(config: TransformerConfig, model_cls: type, plan: Plan, tensors: Mapping[str, Any], seed: int,
            announce: bool = True) -> Prepared:
    """The checked table and lacking parameters for building ``model_cls`` in ``config`` through ``plan`` from a
    source's ``tensors`` (``{name: object with .shape}``, read lazily or not, as the source allows): the one check of
    names and shapes, and the one warning for initialised heads (``announce``; False: only the shapes are wanted)."""
    found = dict(tensors)
    abstract = abstract_params(config, plan.factory)
    shapes = per_layer_shapes(abstract.shapes, config.layer_counts)
    vocab = vocab_axes(abstract.params)
    weights = plan.weights.for_params(shapes)
    check_coverage(weights, shapes, plan.where)
    stored_shapes = vocab_shapes(shapes, vocab, plan.vocab_rows)
    expected = expected_hf_shapes(weights, stored_shapes)
    lacking_names = match_tensors(found, weights, expected, plan.where)  # the one check of names and shapes
    if lacking_names and announce:
        warn_initialised(plan.where, lacking_names, seed)
    entries = {p: (e, j) for e in weights.entries for j, p in enumerate(e.paths)}
    lacking = {p for e in weights.entries if e.hf in lacking_names for p in e.paths}
    return Prepared(config, model_cls, plan, abstract, weights, found, entries, stored_shapes, vocab, lacking)


def layer_groups(paths: Mapping[ParamPath, Any], num_layers: LayerCounts) -> dict[ParamPath, list[ParamPath] | None]:
    """``{model path: its per-layer paths, layer by layer}`` for stacked parameters, ``{model path: None}`` for the
    others (their per-layer path is the model path)."""
    groups: dict[ParamPath, list[ParamPath] | None] = {}
    for path in paths:
        if not is_stacked_path(path):
            groups[path] = None
            continue
        depth = layer_count(num_layers, path)
        layers = unstack_layer_values({path: np.arange(depth)}, num_layers)  # {per-layer path: its layer}
        groups[path] = sorted(layers, key=lambda p: int(layers[p]))
    return groups


def flat_tree(tree: Any) -> dict[ParamPath, Any]:
    """``{path: leaf}`` of a tree (nested dicts, an ``nnx.State``, or already flat ``{path tuple: leaf}``); layer
    numbers as ints, a ``Variable`` leaf as its value."""
    if isinstance(tree, Mapping) and tree and all(isinstance(k, tuple) for k in tree):
        return dict(tree)
    if isinstance(tree, nnx.State):
        tree = nnx.to_pure_dict(tree)
    is_leaf = lambda x: isinstance(x, (jax.sharding.Sharding, nnx.Variable))  # noqa: E731
    flat = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]:
        keys = tuple(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))) for k in path)
        keys = tuple(int(k) if isinstance(k, str) and k.isdigit() else k for k in keys)
        flat[keys] = leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf
    return flat


def check_shardings(shardings: Any, abstract: AbstractParams) -> dict[ParamPath, NamedSharding]:
    """``{model path: NamedSharding}`` from ``shardings`` (a tree shaped like ``nnx.to_pure_dict`` of the parameters,
    an ``nnx.State`` of them, a flat ``{path: sharding}``, or a callable taking the abstract parameters'
    ``nnx.State`` and returning one of those); ValueError naming what is missing, extra or not a NamedSharding."""
    if callable(shardings) and not isinstance(shardings, (Mapping, nnx.State)):
        shardings = shardings(abstract.params)
    flat = flat_tree(shardings)
    missing, extra = set(abstract.shapes) - set(flat), set(flat) - set(abstract.shapes)
    if missing or extra:
        raise ValueError(f"shardings do not match the model's parameters: no sharding for "
                         f"{format_names([dotted(p) for p in missing]) or 'none'}; shardings for parameters the model "
                         f"lacks: {format_names([dotted(p) for p in extra]) or 'none'}")
    for path, sharding in flat.items():
        if not isinstance(sharding, NamedSharding):
            raise ValueError(f"shardings[{dotted(path)!r}] is {type(sharding).__name__}: expected a "
                             "jax.sharding.NamedSharding")
        shape = tuple(abstract.shapes[path].shape)
        try:
            sharding.shard_shape(shape)
        except ValueError:
            raise ValueError(f"shardings[{dotted(path)!r}] = {sharding.spec} does not divide the parameter's shape "
                             f"{shape} on the mesh {dict(sharding.mesh.shape)}: expected mesh axes whose sizes divide "
                             "the dimensions they split") from None
    return flat


def initial_state(prepared: Prepared, paths: list[ParamPath], shardings: Mapping[ParamPath, NamedSharding] | None,
                  seed: int) -> tuple[dict[ParamPath, jax.Array], nnx.State]:
    """The model's own initial values (``seed``) of ``paths`` (what ``create_model`` gives them), computed under
    ``jax.jit`` with ``out_shardings`` (born sharded; None: on the default device), and its state other than
    parameters (replicated)."""
    config, factory, wanted = prepared.config, prepared.plan.factory, set(paths)

    def initial() -> tuple[dict[str, jax.Array], nnx.State]:
        _, params, rest = nnx.split(factory(config, rngs=nnx.Rngs(seed)), nnx.Param, ...)
        return {dotted(p): v.get_value() for p, v in nnx.to_flat_state(params) if p in wanted}, rest

    if shardings is None:
        out, rest = jax.jit(initial)()
    else:
        replicated = NamedSharding(next(iter(shardings.values())).mesh, jax.sharding.PartitionSpec())
        out, rest = jax.jit(initial, out_shardings=({dotted(p): shardings[p] for p in paths}, replicated))()
    return {p: out[dotted(p)] for p in paths}, rest


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


def tensor_arrays(prepared: Prepared, shardings: Mapping[ParamPath, NamedSharding] | None,
                  on_read: OnRead | None = None, after_each: Callable[[], None] | None = None
                  ) -> Iterator[tuple[ParamPath, jax.Array]]:
    """``(model path, global array)`` for every parameter the source has (not ``prepared.lacking``), one at a time,
    laid out by ``shardings`` (None: whole, on the default device); ``after_each()`` runs once each parameter is made
    (closing the files it mapped)."""
    groups = layer_groups(prepared.abstract.shapes, prepared.config.layer_counts)
    layouts: dict[str, tuple[Layout, ...] | None] = {}
    for path, struct in prepared.abstract.shapes.items():
        if path in prepared.lacking:
            continue
        callback = _Shards(prepared, path, groups[path], np.dtype(struct.dtype), layouts, on_read)
        shape = tuple(struct.shape)
        if shardings is None:
            array = jnp.asarray(callback(tuple(slice(0, d) for d in shape)))
        else:
            array = jax.make_array_from_callback(shape, shardings[path], callback, dtype=struct.dtype)
        del callback  # what it read whole goes with it
        if after_each is not None:
            after_each()
        yield path, array
