"""Parameters of a flaxzoo work directory (an orbax checkpoint, ``flaxzoo.models.io.checkpoint``) restored straight into
their shardings (``flaxzoo.models.io.sharded``'s flaxzoo path).

orbax is given ``jax.ShapeDtypeStruct(shape, dtype, sharding=...)`` targets, so that each process reads only the
shards its devices hold. A parameter stored as the model holds it (same layout, shape and dtype) is restored into its
own sharding and used as it is. One that changes on the way (per-layer stored and stacked wanted, or the other way;
another vocabulary padding; another dtype) is restored into the sharding of the wanted one, adapted to the stored
shape (the layer axis dropped or added unsplit, a mesh axis that does not divide a stored dimension left out), then
stacked / indexed / padded / cast under ``jax.jit`` with ``out_shardings``: no device holds more than its shards of
either.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from flaxzoo.models.io.checkpoint import STATE, param_metadata, quiet_orbax
from flaxzoo.models.families.base import ParamPath, dotted
from flaxzoo.models.io.sharded_plan import Prepared, flat_tree, layer_groups
from flaxzoo.models.layers.layer_layout import LayerCounts, is_stacked_path, layer_count, unstack_layer_values
from flaxzoo.models.modeling import resize_vocab

__all__ = ["stored_tensors", "workdir_arrays"]

Where = tuple[ParamPath, int | None]  # (stored path, layer of a stacked one)


def stored_tensors(step_dir: Any, num_layers: LayerCounts
                   ) -> tuple[dict[str, jax.ShapeDtypeStruct], dict[str, Where], dict[ParamPath, Any]]:
    """From a step's metadata alone: ``({per-layer dotted name: ShapeDtypeStruct}, {per-layer dotted name: where it
    is stored}, {stored path: metadata})``."""
    metadata = param_metadata(step_dir)
    shapes, where = {}, {}
    for path, meta in metadata.items():
        if not is_stacked_path(path):
            layers = {path: None}
        else:
            depth = layer_count(num_layers, path)
            layers = {p: int(i) for p, i in unstack_layer_values({path: np.arange(depth)}, num_layers).items()}
        for per_layer, layer in layers.items():
            shape = tuple(meta.shape) if layer is None else tuple(meta.shape)[1:]
            shapes[dotted(per_layer)] = jax.ShapeDtypeStruct(shape, np.dtype(meta.dtype))
            where[dotted(per_layer)] = (path, layer)
    return shapes, where, metadata


def fit(sharding: NamedSharding, spec: tuple[Any, ...], shape: tuple[int, ...]) -> NamedSharding:
    """``spec`` on ``sharding``'s mesh for an array of ``shape``: each dimension keeps the leading mesh axes of its
    entry whose product divides it."""
    entries = list(spec) + [None] * (len(shape) - len(spec))
    out = []
    for dim, entry in zip(shape, entries[:len(shape)]):
        axes = [] if entry is None else [entry] if isinstance(entry, str) else list(entry)
        while axes and dim % math.prod(sharding.mesh.shape[a] for a in axes):
            axes.pop()
        out.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return NamedSharding(sharding.mesh, PartitionSpec(*out))


def restore(step_dir: Any, targets: Mapping[ParamPath, jax.ShapeDtypeStruct]) -> dict[ParamPath, jax.Array]:
    """The stored parameters ``targets`` names (stored paths), restored by orbax into the targets' shardings."""
    import orbax.checkpoint as ocp  # heavy: imported on use

    tree: dict[Any, Any] = {}
    for path, struct in targets.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = struct
    item = {"params": tree}
    with quiet_orbax(), ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as checkpointer:
        restored = checkpointer.restore(step_dir / STATE, args=ocp.args.PyTreeRestore(
            item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True))
    return flat_tree(restored["params"])


def _combine(arrays: list[jax.Array], layers: list[jax.Array], *, takes: tuple[bool, ...], stacked: bool,
             vocab: tuple[int, int] | None, dtype: Any) -> jax.Array:
    parts = [jax.lax.dynamic_index_in_dim(a, i, keepdims=False) if take else a
             for a, i, take in zip(arrays, layers, takes)]
    value = jnp.stack(parts) if stacked else parts[0]
    if vocab is not None:
        value = resize_vocab(value, *vocab)
    return value.astype(dtype)


def workdir_arrays(step_dir: Any, prepared: Prepared, where: Mapping[str, Where], metadata: Mapping[ParamPath, Any],
                   shardings: Mapping[ParamPath, NamedSharding]) -> dict[ParamPath, jax.Array]:
    """``{model path: global array}`` for every parameter the checkpoint has (not ``prepared.lacking``)."""
    groups = layer_groups(prepared.abstract.shapes, prepared.config.layer_counts)
    targets: dict[ParamPath, jax.ShapeDtypeStruct] = {}
    direct: dict[ParamPath, ParamPath] = {}  # model path -> stored path, restored as it is wanted
    combined: dict[ParamPath, tuple[list[Where], dict[str, Any]]] = {}
    for path, struct in prepared.abstract.shapes.items():
        if path in prepared.lacking:
            continue
        sharding, stacked = shardings[path], groups[path] is not None
        sources = [where[prepared.entries[p][0].hf] for p in (groups[path] or [path])]
        first, layer = sources[0]
        meta = metadata[first]
        same_layout = (sources == [(first, i) for i in range(len(sources))]) if stacked else layer is None
        if same_layout and tuple(meta.shape) == tuple(struct.shape) and np.dtype(meta.dtype) == np.dtype(struct.dtype):
            targets.setdefault(first, jax.ShapeDtypeStruct(tuple(meta.shape), np.dtype(meta.dtype), sharding=sharding))
            direct[path] = first
            continue
        spec = tuple(sharding.spec) + (None,) * (len(struct.shape) - len(sharding.spec))
        for stored, i in sources:
            kind = (i is not None, stacked)  # (stored stacked, wanted stacked)
            stored_spec = spec[1:] if kind == (False, True) else (None, *spec) if kind == (True, False) else spec
            shape = tuple(metadata[stored].shape)
            targets.setdefault(stored, jax.ShapeDtypeStruct(shape, np.dtype(metadata[stored].dtype),
                                                            sharding=fit(sharding, stored_spec, shape)))
        axis = prepared.vocab.get(path)
        vocab = (axis, struct.shape[axis]) if axis is not None else None
        combined[path] = (sources, dict(takes=tuple(i is not None for _, i in sources), stacked=stacked, vocab=vocab,
                                     dtype=np.dtype(struct.dtype)))
    restored = restore(step_dir, targets)
    out = {path: restored[stored] for path, stored in direct.items()}
    compiled: dict[Any, Any] = {}
    for path, (sources, static) in combined.items():
        key = (tuple(sorted(static.items(), key=lambda kv: kv[0])), shardings[path])
        if key not in compiled:
            compiled[key] = jax.jit(lambda a, i, static=static: _combine(a, i, **static),
                                    out_shardings=shardings[path])
        out[path] = compiled[key]([restored[s] for s, _ in sources], [np.int32(i or 0) for _, i in sources])
    return out
