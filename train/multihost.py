"""One job over several processes (hosts): start-up, failure detection, agreement, barriers.

Everything here runs on JAX's own multi-controller runtime (``jax.distributed``: a coordination service in process 0,
a client in every process; XLA's collectives between devices: NCCL on GPU clusters, ICI / DCN on TPU pods, Gloo on
CPU). With one process every function is a cheap no-op, so the training loop calls them unconditionally.

Start-up (:func:`initialize`) happens only when the environment says this process is one of several, and only for
launches ``jax.distributed.initialize()`` can complete: the cluster managers JAX detects itself (SLURM job steps,
Open MPI's ``mpirun``, Cloud TPU pod slices; Kubernetes with its client library once ``FLAXZOO_DISTRIBUTED=1``
says the job spans processes) or a launch by hand that sets
``JAX_COORDINATOR_ADDRESS`` (``host:port`` of process 0), ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` on every
process (``python -m flaxzoo.train.launch`` does this on one machine). Other launchers (MPICH / Intel MPI's ``PMI_*``,
torchrun's ``WORLD_SIZE``, ``sbatch`` without ``srun``) are refused with a message saying what to set: a bare
``jax.distributed.initialize()`` there would wait for a coordinator nobody starts.

Failure detection: the runtime's heartbeats. A process that sends none for ``FLAXZOO_HEARTBEAT_TIMEOUT_S`` seconds
(default :data:`HEARTBEAT_TIMEOUT_S`; JAX's own default is 100) is declared dead and every other process terminates
with the runtime's message naming it ("The following tasks are unhealthy (stopped sending heartbeats): 1"); when
process 0 (the coordinator) dies the others fail at once. ``FLAXZOO_INIT_TIMEOUT_S`` (JAX: 300) bounds the wait for
all processes to connect, ``FLAXZOO_SHUTDOWN_TIMEOUT_S`` (JAX: 300) the wait for the others at exit.
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

import jax
import numpy as np

log = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT_S = 30
INIT_TIMEOUT_S = 300
SHUTDOWN_TIMEOUT_S = 60
EXPLICIT_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


class LaunchError(RuntimeError):
    """The environment says this is one process of several, but not in a way ``jax.distributed`` can complete."""


def _count(name: str) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else 0


def _hosts(name: str) -> int:
    return len([h for h in os.environ.get(name, "").split(",") if h.strip()])


def launch_kind() -> str | None:
    """How this process was started, when it is one of several: ``"explicit"`` (the ``JAX_*`` variables), a
    cluster manager JAX detects (``"slurm"``, ``"openmpi"``, ``"tpu"``, ``"megascale"``), or None (one process).
    ``FLAXZOO_DISTRIBUTED=0`` forces None, ``=1`` forces a launch (JAX then detects the cluster).

    Raises :class:`LaunchError` for a multi-process launch JAX cannot detect, naming the variable and what to set.
    """
    forced = os.environ.get("FLAXZOO_DISTRIBUTED")
    if forced is not None and forced.strip().lower() in ("0", "false", "no"):
        return None
    explicit = [name for name in EXPLICIT_VARIABLES if os.environ.get(name)]
    if len(explicit) == len(EXPLICIT_VARIABLES):
        return "explicit"
    if _count("SLURM_NTASKS") > 1:
        missing = [v for v in ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_LOCALID")
                   if v not in os.environ]
        if missing:
            raise LaunchError(f"SLURM_NTASKS={os.environ['SLURM_NTASKS']} but {missing} are not set: this is not a "
                              "SLURM job step; start the processes with srun (one per host), or set "
                              + ", ".join(EXPLICIT_VARIABLES))
        return "slurm"
    if _count("OMPI_COMM_WORLD_SIZE") > 1:
        if "OMPI_MCA_orte_hnp_uri" not in os.environ:
            raise LaunchError(f"OMPI_COMM_WORLD_SIZE={os.environ['OMPI_COMM_WORLD_SIZE']} but OMPI_MCA_orte_hnp_uri "
                              "is not set (Open MPI 5 / PMIx, which jax.distributed does not detect): set "
                              f"{', '.join(EXPLICIT_VARIABLES)} (JAX_PROCESS_ID from OMPI_COMM_WORLD_RANK)")
        return "openmpi"
    if _hosts("TPU_WORKER_HOSTNAMES") > 1:
        return "tpu"
    if os.environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return "megascale"
    for name, launcher, rank in (("PMI_SIZE", "MPICH / Intel MPI (PMI)", "PMI_RANK"),
                                 ("PMIX_SIZE", "a PMIx launcher", "PMIX_RANK"),
                                 ("WORLD_SIZE", "torchrun-style", "RANK")):
        if _count(name) > 1:
            raise LaunchError(f"{name}={os.environ[name]} says this is one of several processes started by "
                              f"{launcher}, which jax.distributed cannot detect; set {', '.join(EXPLICIT_VARIABLES)} "
                              f"on every process (JAX_PROCESS_ID from {rank}, JAX_COORDINATOR_ADDRESS = host:port of "
                              "process 0), or start the job with srun / Open MPI's mpirun")
    if explicit:
        missing = [name for name in EXPLICIT_VARIABLES if name not in explicit]
        raise LaunchError(f"{', '.join(explicit)} set but {', '.join(missing)} not: a launch by hand needs all of "
                          f"{', '.join(EXPLICIT_VARIABLES)} on every process")
    if forced is not None and forced.strip().lower() in ("1", "true", "yes"):
        return "forced"
    return None


def _seconds(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    if not value.strip().isdigit() or int(value) < 1:
        raise LaunchError(f"{name}={value!r}: expected a whole number of seconds >= 1")
    return int(value)


def initialize() -> bool:
    """``jax.distributed.initialize`` when :func:`launch_kind` says this is one process of several (before anything
    touches a device), with the timeouts of the module docstring. On CPU, Gloo collectives. True when it ran."""
    kind = launch_kind()
    if kind is None:
        return False
    timeouts = {"heartbeat_timeout_seconds": _seconds("FLAXZOO_HEARTBEAT_TIMEOUT_S", HEARTBEAT_TIMEOUT_S),
                "initialization_timeout": _seconds("FLAXZOO_INIT_TIMEOUT_S", INIT_TIMEOUT_S),
                "shutdown_timeout_seconds": _seconds("FLAXZOO_SHUTDOWN_TIMEOUT_S", SHUTDOWN_TIMEOUT_S)}
    if os.environ.get("JAX_PLATFORMS", "").startswith("cpu"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs = {}
    if kind == "explicit":  # JAX reads the coordinator address itself, not these two
        for name in EXPLICIT_VARIABLES[1:]:
            if not os.environ[name].strip().isdigit():
                raise LaunchError(f"{name}={os.environ[name]!r}: expected a whole number")
        kwargs = {"num_processes": int(os.environ["JAX_NUM_PROCESSES"]),
                  "process_id": int(os.environ["JAX_PROCESS_ID"])}
    log.info("multi-process launch (%s): jax.distributed.initialize(%s)", kind, {**kwargs, **timeouts})
    jax.distributed.initialize(**kwargs, **timeouts)
    return True


# ===================================================================================================== agreement
def is_multi_process() -> bool:
    return jax.process_count() > 1


def barrier(name: str) -> None:
    """Every process waits here until all have arrived (``name``: the same on every process, to catch processes
    that took different paths)."""
    if is_multi_process():
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def gather(values: Sequence[int]) -> np.ndarray:
    """``[process_count, len(values)]`` int64: every process's ``values`` (the same length everywhere), on every
    process."""
    local = np.asarray(values, np.int64).reshape(-1)
    if not is_multi_process():
        return local[None]
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(local)).reshape(jax.process_count(), -1)


def from_process_zero(values: Sequence[int]) -> list[int]:
    """Process 0's ``values`` (any length; the other processes' are ignored), on every process."""
    if not is_multi_process():
        return [int(v) for v in values]
    from jax.experimental import multihost_utils

    local = np.asarray(values, np.int64).reshape(-1)
    size = int(multihost_utils.broadcast_one_to_all(np.asarray(local.size, np.int64)))
    padded = np.zeros(size, np.int64)
    if jax.process_index() == 0:
        padded[:] = local
    return [int(v) for v in np.asarray(multihost_utils.broadcast_one_to_all(padded))]


class StorageNotShared(ValueError):
    """A folder every process must see (the work directory, the data directory) differs between the processes."""


def check_shared(folder: os.PathLike | str, what: str, *, required: bool = True) -> bool:
    """With several processes, whether every process sees the same ``folder`` (an ``epath`` path: local or
    ``gs://`` / ``s3://``): process 0 writes a marker holding a random number there, every process looks for it.
    When ``folder`` is host-local storage (each host its own disk): raises :class:`StorageNotShared` on every process,
    naming the processes that did not find it, or (``required=False``) says so and returns False. One process:
    True, nothing to check."""
    if not is_multi_process():
        return True
    from etils import epath

    folder = epath.Path(folder)
    token = from_process_zero([int.from_bytes(os.urandom(6), "little")])[0]
    marker = folder / f".flaxzoo_shared_{token}"
    if jax.process_index() == 0:
        folder.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(token))
    barrier(f"flaxzoo_shared_written_{token}")
    try:
        seen = marker.exists() and marker.read_text() == str(token)
    except OSError:
        seen = False
    missing = np.flatnonzero(gather([int(not seen)])[:, 0]).tolist()
    barrier(f"flaxzoo_shared_read_{token}")
    if jax.process_index() == 0:
        marker.unlink(missing_ok=True)
    if not missing:
        return True
    problem = StorageNotShared(
        f"{what} {folder} is not shared storage: process(es) {missing} do not see the marker process 0 wrote there; "
        "expected one folder every process reads (NFS, a bucket: gs://..., s3://...). For a data directory on each "
        "host's own disk, prepare the data on every host beforehand with the same settings (python -m "
        "flaxzoo.train.data, docs/multi-host.md); checkpoints need shared storage")
    if required:
        raise problem
    log.warning("%s: every process prepares (or reads) its own copy", problem)
    return False


def preemption_agreed(step: int) -> bool:
    """True on every process at the same step once any process received SIGTERM (JAX's preemption sync manager:
    the notice reaches every process and the stop step is the largest step any of them had reported, plus one).
    Call it at every step, on every process. False with one process."""
    if not is_multi_process():
        return False
    from jax.experimental import multihost_utils

    return multihost_utils.reached_preemption_sync_point(step)
