"""The device mesh, the logical-axis rules that place parameters and optimizer state on it, batch placement.

The mesh has three axes, ``("data", "fsdp", "tensor")``, all ``AxisType.Auto`` (Explicit axes break the embedding
gather). The batch is split over ``data`` × ``fsdp``; parameters are split over ``fsdp`` (ZeRO-3 style: each device
holds a slice, gathered for use) and ``tensor`` (Megatron style: heads and MLP columns stay split) by the rules in
:data:`LOGICAL_RULES`, which map the logical names every parameter carries (``vocab``, ``embed``, ``heads``,
``kv_heads``, ``head_dim``, ``mlp``, ``norm``) to mesh axes. A dimension that a mesh axis does not divide is left
unsplit on that axis (e.g. 4 heads on ``tensor=8``), so any mesh runs any model.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
from flax import nnx
from jax.experimental import mesh_utils
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from flaxzoo.models.layers.partitioning import (ACTIVATION_BATCH, ACTIVATION_EMBED, ACTIVATION_HEADS, ACTIVATION_KV_HEADS,
                                        ACTIVATION_LENGTH, ACTIVATION_MLP, ACTIVATION_VOCAB, HEAD_BATCH, HEAD_VOCAB,
                                        ActivationPlacement)

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# logical axis name -> mesh axes (a name, a tuple of names, or None = replicated)
LOGICAL_RULES: dict[str | None, str | tuple[str, ...] | None] = {
    "batch": BATCH_AXES,
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
    "layers": None,  # the stacked-layers axis (scan_layers): every device runs every layer
    # Activations (models/layers/partitioning.py): rows over data x fsdp, the residual stream whole on every device
    # of a row's group (FSDP gathers the weights, not the batch), heads / MLP width / vocabulary over tensor.
    ACTIVATION_BATCH: BATCH_AXES,
    ACTIVATION_LENGTH: None,
    ACTIVATION_EMBED: None,
    ACTIVATION_HEADS: "tensor",
    ACTIVATION_KV_HEADS: "tensor",
    ACTIVATION_MLP: "tensor",
    ACTIVATION_VOCAB: "tensor",
    HEAD_BATCH: "data",
    HEAD_VOCAB: ("tensor", "fsdp"),
    None: None,
}
# Whole-parameter overrides, checked first. The token table is split over its rows only: splitting [vocab, embed] as
# ("tensor", "fsdp") makes XLA rematerialise the whole table at the gather ("Involuntary full rematerialization").
# An untied output kernel is split the same way, along its vocabulary: the head's logits and gradients are computed
# where its rows are (``LMHead``), never gathered whole.
PARAMETER_RULES: dict[tuple[str | None, ...], tuple[Any, ...]] = {
    ("vocab", "embed"): (("tensor", "fsdp"), None),
    ("embed", "vocab"): (None, ("tensor", "fsdp")),
}


def slice_count(devices: Sequence[jax.Device]) -> int:
    """How many slices (TPU pods joined over the data-centre network, DCN) ``devices`` span; 1 elsewhere."""
    return len({getattr(d, "slice_index", 0) for d in devices})


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``(data, fsdp, tensor)`` mesh of ``shape`` over ``devices`` (default: all), Auto axes.

    Devices of several slices (multi-slice TPU) get a hybrid mesh: the ``data`` axis spans the slices, so that only
    the gradient all-reduce crosses the slow DCN links; ``fsdp`` and ``tensor`` (and the rest of ``data``) stay
    inside a slice, on its ICI links. ``data`` must then be a multiple of the slice count."""
    devices = list(jax.devices() if devices is None else devices)
    shape = tuple(shape)
    if math.prod(shape) != len(devices):
        raise ValueError(f"mesh shape {shape} needs {math.prod(shape)} devices; got {len(devices)}")
    axis_types = (AxisType.Auto,) * len(MESH_AXES)
    slices = slice_count(devices)
    if slices == 1:
        return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)
    data, fsdp, tensor = shape
    if data % slices:
        raise ValueError(f"mesh shape {shape} over {slices} slices: the data axis ({data}) spans the slices, so it "
                         f"must be a multiple of {slices} (e.g. mesh.data=-1)")
    grid = mesh_utils.create_hybrid_device_mesh((data // slices, fsdp, tensor), (slices, 1, 1), devices,
                                                allow_split_physical_axes=True)
    return Mesh(grid, MESH_AXES, axis_types=axis_types)


def activation_placement(mesh: Mesh) -> ActivationPlacement:
    """The placement the train / eval steps trace the model under: activations split by :data:`LOGICAL_RULES`
    (each dimension only over mesh axes that divide it), the platform of the mesh's devices."""
    return ActivationPlacement(mesh=mesh, spec_for=lambda logical, shape: logical_to_mesh(logical, shape, mesh),
                               platform=platform_of(mesh.devices.flat[0]))


def platform_of(device: jax.Device) -> str:
    """``"cpu"``, ``"gpu"`` (CUDA and ROCm devices, compile-only ones included) or ``"tpu"``."""
    return "gpu" if device.platform in ("cuda", "rocm", "gpu") else device.platform


def _as_tuple(axes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def logical_to_mesh(logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    dropped: list[str] | None = None) -> PartitionSpec:
    """The mesh ``PartitionSpec`` of a parameter with logical axis names ``logical`` and ``shape``.

    Each dimension takes the mesh axes its rule names, skipping axes of size 1, axes an earlier dimension already
    uses, and trailing axes until the product divides the dimension. ``dropped``, when given, receives one line per
    mesh axis a dimension wanted but could not take (its size is not divisible).
    """
    logical = tuple(logical)
    if len(logical) != len(shape):
        raise ValueError(f"logical axes {logical} do not match shape {tuple(shape)}")
    wanted = PARAMETER_RULES.get(logical)
    if wanted is None:
        for name in logical:
            if name not in LOGICAL_RULES:
                raise ValueError(f"logical axis {name!r} has no rule; expected one of {sorted(map(str, LOGICAL_RULES))}")
        wanted = tuple(LOGICAL_RULES[name] for name in logical)
    used: set[str] = set()
    spec = []
    for dim, axes in zip(shape, wanted):
        chosen = [a for a in _as_tuple(axes) if mesh.shape[a] > 1 and a not in used]
        while chosen and dim % math.prod(mesh.shape[a] for a in chosen):
            axis = chosen.pop()
            if dropped is not None:
                dropped.append(f"dimension {dim} ({logical[len(spec)]}) not split over {axis}={mesh.shape[axis]}")
        used.update(chosen)
        spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
    return PartitionSpec(*spec)


def param_shardings(logical_specs: Any, shapes: Any, mesh: Mesh, unsplit: list[str] | None = None) -> Any:
    """``NamedSharding`` per parameter: ``logical_specs`` (a tree of ``PartitionSpec`` of logical names, from
    ``nnx.get_partition_spec``) and ``shapes`` (the same tree of arrays or ``ShapeDtypeStruct``). ``unsplit``, when
    given, receives one line per parameter that a mesh axis wanted but cannot split (its path, what was dropped)."""
    def sharding(path, spec, leaf):
        dropped: list[str] = []
        out = NamedSharding(mesh, logical_to_mesh(tuple(spec), leaf.shape, mesh, dropped))
        if unsplit is not None and dropped:
            name = ".".join(str(_path_key(p)) for p in path)
            unsplit.append(f"{name} {tuple(leaf.shape)}: " + "; ".join(dropped))
        return out

    return jax.tree_util.tree_map_with_path(sharding, logical_specs, shapes,
                                            is_leaf=lambda x: isinstance(x, PartitionSpec))


def variable_shardings(state: Any, mesh: Mesh, unsplit: list[str] | None = None) -> Any:
    """Shardings for an ``nnx.State`` (same tree): each parameter by its logical axes (its ``out_sharding``
    metadata), every other variable (RNG streams, counters) replicated. For the frozen base weights LoRA training
    keeps outside the trained parameters."""
    replicated = NamedSharding(mesh, PartitionSpec())

    def sharding(path, variable):
        axes = variable.get_metadata().get("out_sharding") if isinstance(variable, nnx.Param) else None
        if axes is None:
            return variable.replace(replicated)
        dropped: list[str] = []
        shape = variable.get_value().shape
        out = NamedSharding(mesh, logical_to_mesh(tuple(axes), shape, mesh, dropped))
        if unsplit is not None and dropped:
            name = ".".join(str(_path_key(p)) for p in path)
            unsplit.append(f"{name} {tuple(shape)}: " + "; ".join(dropped))
        return variable.replace(out)

    return jax.tree_util.tree_map_with_path(sharding, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _path_key(entry) -> Any:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return str(entry)


def tree_shardings_like(tree: Any, params: Any, params_shardings: Any, mesh: Mesh) -> Any:
    """Shardings for a tree (an optimizer state) whose leaves mirror parameters: a leaf whose path ends with a
    parameter's path and has its shape gets that parameter's sharding; everything else (counts, scalars) is
    replicated. ``jax.jit(tx.init)`` alone would replicate the moments."""
    by_path: dict[tuple, tuple[tuple[int, ...], NamedSharding]] = {}
    for (path, leaf), sharding in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                                      jax.tree.leaves(params_shardings)):
        by_path[tuple(_path_key(p) for p in path)] = (tuple(leaf.shape), sharding)
    replicated = NamedSharding(mesh, PartitionSpec())

    def pick(path, leaf):
        keys = tuple(_path_key(p) for p in path)
        for start in range(len(keys)):
            hit = by_path.get(keys[start:])
            if hit is not None and hit[0] == tuple(getattr(leaf, "shape", ())):
                return hit[1]
        return replicated

    return jax.tree_util.tree_map_with_path(pick, tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows over ``data`` × ``fsdp``, everything else whole."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def global_batch(local: Mapping[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """This process's contiguous block of rows (``[global_batch / process_count, ...]``) → global arrays sharded by
    ``sharding``. Right when each process's devices hold one such block (one process; ``data`` × ``fsdp`` laid out
    process by process); :class:`BatchPlacement` is right for any mesh."""
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local.items()}


def global_from_host(tree: Any, shardings: Any) -> Any:
    """Host arrays (the same values on every process) → global arrays laid out by ``shardings`` (a matching tree):
    each process copies onto its devices only the slices they hold (``jax.make_array_from_callback``), so no device
    ever holds a whole array that its sharding splits."""
    def put(value, sharding):
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    return jax.tree.map(put, tree, shardings)


class BatchPlacement:
    """Which rows of a global batch this process loads, and how they become global arrays, for any mesh.

    The rows are those the process's addressable devices hold under ``sharding`` (from
    ``sharding.addressable_devices_indices_map``), in ascending order: a contiguous block when the mesh's batch axes
    are laid out process by process, interleaved blocks when they are not (devices ordered across processes), and
    every row on each process when only non-batch axes (``tensor``) span the processes. ``rows`` is what the input
    pipeline reads (``flaxzoo.train.data.make_iterator(..., rows=placement.rows)``); :meth:`place` turns the loaded
    ``[len(rows), ...]`` arrays into global ``[global_rows, ...]`` arrays, each device taking its slice.
    """

    def __init__(self, sharding: NamedSharding, global_rows: int):
        self.sharding, self.global_rows = sharding, int(global_rows)
        taken = np.zeros(self.global_rows, bool)
        for index in sharding.addressable_devices_indices_map((self.global_rows,)).values():
            taken[index[0]] = True
        self.rows = np.flatnonzero(taken)

    def place(self, local: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """``{key: [len(rows), ...]}`` numpy arrays (this process's rows, in :attr:`rows` order) → global arrays."""
        out = {}
        for key, value in local.items():
            value = np.asarray(value)
            if value.shape[0] != len(self.rows):
                raise ValueError(f"batch[{key!r}] has {value.shape[0]} rows; this process loads {len(self.rows)} "
                                 f"(rows {self.rows[:4].tolist()}... of {self.global_rows})")
            shape = (self.global_rows, *value.shape[1:])

            def shard(index, value=value):
                wanted = np.arange(self.global_rows)[index[0]]
                return value[np.searchsorted(self.rows, wanted)][(slice(None), *index[1:])]

            out[key] = jax.make_array_from_callback(shape, self.sharding, shard)
        return out


def describe(mesh: Mesh) -> str:
    return " x ".join(f"{name}={size}" for name, size in mesh.shape.items())
