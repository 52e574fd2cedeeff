"""The device mesh, the logical-axis rules that place parameters and optimizer state on it, multi-host start-up.

The mesh has three axes, ``("data", "fsdp", "tensor")``, all ``AxisType.Auto`` (Explicit axes break the embedding
gather). The batch is split over ``data`` × ``fsdp``; parameters are split over ``fsdp`` (ZeRO-3 style: each device
holds a slice, gathered for use) and ``tensor`` (Megatron style: heads and MLP columns stay split) by the rules in
:data:`LOGICAL_RULES`, which map the logical names every parameter carries (``vocab``, ``embed``, ``heads``,
``kv_heads``, ``head_dim``, ``mlp``, ``norm``) to mesh axes. A dimension that a mesh axis does not divide is left
unsplit on that axis (e.g. 4 heads on ``tensor=8``), so any mesh runs any model.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

log = logging.getLogger(__name__)

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
    None: None,
}
# Whole-parameter overrides, checked first. The token table is split over its rows only: splitting [vocab, embed] as
# ("tensor", "fsdp") makes XLA rematerialise the whole table at the gather ("Involuntary full rematerialization").
PARAMETER_RULES: dict[tuple[str | None, ...], tuple[Any, ...]] = {
    ("vocab", "embed"): (("tensor", "fsdp"), None),
}


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``(data, fsdp, tensor)`` mesh of ``shape`` over ``devices`` (default: all), Auto axes."""
    devices = list(jax.devices() if devices is None else devices)
    if math.prod(shape) != len(devices):
        raise ValueError(f"mesh shape {tuple(shape)} needs {math.prod(shape)} devices; got {len(devices)}")
    return jax.make_mesh(tuple(shape), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


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
    """This process's rows (``[global_batch / process_count, ...]``, as ``train.data`` yields them) → global arrays
    sharded by ``sharding``."""
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local.items()}


def describe(mesh: Mesh) -> str:
    return " x ".join(f"{name}={size}" for name, size in mesh.shape.items())


# ===================================================================================================== multi-host
# Variables that launchers set when a job spans several processes (hosts).
_MULTI_PROCESS_ENV = {
    "JAX_COORDINATOR_ADDRESS": None,   # explicit: jax.distributed.initialize reads it with JAX_NUM_PROCESSES etc.
    "SLURM_NTASKS": "int>1",           # srun
    "OMPI_COMM_WORLD_SIZE": "int>1",   # mpirun (Open MPI)
    "PMI_SIZE": "int>1",               # mpiexec (MPICH)
    "TPU_WORKER_HOSTNAMES": "list>1",  # Cloud TPU pod slices (one process per host)
    "MEGASCALE_COORDINATOR_ADDRESS": None,
}


def multi_process_environment() -> str | None:
    """The name of the launcher variable that says this is one process of many, or None (single process).
    ``FLAXZOO_DISTRIBUTED=1`` / ``0`` forces the answer."""
    forced = os.environ.get("FLAXZOO_DISTRIBUTED")
    if forced is not None:
        return "FLAXZOO_DISTRIBUTED" if forced.strip().lower() in ("1", "true", "yes") else None
    for name, kind in _MULTI_PROCESS_ENV.items():
        value = os.environ.get(name)
        if not value:
            continue
        if kind is None:
            return name
        if kind == "int>1" and value.isdigit() and int(value) > 1:
            return name
        if kind == "list>1" and len([h for h in value.split(",") if h.strip()]) > 1:
            return name
    return None


def maybe_initialize_distributed() -> bool:
    """Call ``jax.distributed.initialize()`` (which reads the cluster's own variables: SLURM, Open MPI, Cloud TPU,
    Kubernetes) when a multi-process launch is detected; a launch by hand sets ``JAX_COORDINATOR_ADDRESS``
    (``host:port`` of process 0), ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` on every process. Must run before anything touches a JAX device. Returns True when it initialised."""
    source = multi_process_environment()
    if source is None:
        return False
    if os.environ.get("JAX_PLATFORMS", "").startswith("cpu"):
        # CPU processes need a collectives implementation to form one mesh (tests, debugging).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs = {}
    if os.environ.get("JAX_NUM_PROCESSES") and os.environ.get("JAX_PROCESS_ID"):
        # A hand-made launch (no cluster manager): JAX reads the coordinator address itself, not these two.
        kwargs = {"num_processes": int(os.environ["JAX_NUM_PROCESSES"]),
                  "process_id": int(os.environ["JAX_PROCESS_ID"])}
    log.info("multi-process launch detected (%s): jax.distributed.initialize(%s)", source, kwargs or "")
    jax.distributed.initialize(**kwargs)
    return True
