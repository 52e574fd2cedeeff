"""Compile-only devices of a :class:`~flaxzoo.train.tools.targets.chips.Target` on a CPU machine (:func:`compile_devices`):
TPU ones from libtpu, GPU ones from JAX's CUDA plugin given a :class:`~flaxzoo.train.tools.targets.gpu_specs.GpuSpec`;
:class:`AotUnavailable` says what to install when a plugin is missing. :func:`persistent_cache_off` wraps their
compiles (JAX's cache cannot read compile-only executables back)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import threading
from typing import Iterator

import jax

from flaxzoo.models.jax_startup import quiet_plugin_start
from flaxzoo.train.tools.targets.chips import Target, parse_target
from flaxzoo.train.tools.targets.gpu_specs import GPU_SPECS

AOT_INSTALL = 'pip install "flaxzoo[aot]"'


class AotUnavailable(ImportError):
    """What a target's compile-only devices need (libtpu, JAX's CUDA plugin, NVIDIA's PTX compiler) is missing."""


_DEVICES: dict[tuple[str, int], list[jax.Device]] = {}
_LOCK = threading.Lock()


def compile_devices(target: Target) -> list[jax.Device]:
    """The target's compile-only devices, all slices (``target.devices`` of them, in id order); cached per
    ``(name, slices)`` in this process.

    Raises :class:`AotUnavailable` (an ``ImportError``) when the plugin the platform needs is not installed, or, for
    GPU targets, NVIDIA's PTX compiler (ptxas) or libdevice cannot be found; ``RuntimeError`` when libtpu is held by
    another process (set ``ALLOW_MULTIPLE_LIBTPU_LOAD=1`` before JAX loads it)."""
    key = (target.name, target.slices)
    with _LOCK:
        if key not in _DEVICES:
            devices = _tpu_devices(target) if target.platform == "tpu" else _gpu_devices(target)
            if len(devices) != target.devices:
                raise RuntimeError(f"{target.name} x {target.slices}: expected {target.devices} compile-only "
                                   f"devices, got {len(devices)}")
            _DEVICES[key] = devices
        return list(_DEVICES[key])


def plugin_available(platform: str) -> tuple[bool, str]:
    """``(True, "")`` when compile-only devices of ``platform`` (``"tpu"`` or ``"gpu"``) can be made and compiled
    for here, else ``(False, why)`` with what to install (the :class:`AotUnavailable` message). Makes a one-device
    target's devices (v5e-1, h100x1) to find out: loads libtpu, or registers the CUDA plugin and compiles ``exp``."""
    probes = {"tpu": "v5e-1", "gpu": "h100x1"}
    if platform not in probes:
        raise ValueError(f"platform must be 'tpu' or 'gpu'; got {platform!r}")
    try:
        compile_devices(parse_target(probes[platform]))
    except AotUnavailable as exc:
        return False, str(exc)
    return True, ""


def _missing(target: Target, what: str) -> AotUnavailable:
    return AotUnavailable(f"compiling for {target.name} needs {what}, which is not installed here: {AOT_INSTALL}")


def _tpu_devices(target: Target) -> list[jax.Device]:
    from jax.experimental import topologies

    if importlib.util.find_spec("libtpu") is None:
        raise _missing(target, "libtpu (the jax[tpu] extra)")
    try:
        with quiet_plugin_start():  # the first call loads libtpu: without its complaints about a CPU host
            topology = topologies.get_topology_desc(
                platform="tpu", topology_name=target.topology, chip_config_name=target.chip_config_name,
                chips_per_host_bounds=target.chips_per_host, num_slices=target.slices)
    except jax.errors.JaxRuntimeError as exc:
        if "lockfile" in str(exc) or "TPU in use" in str(exc):
            raise RuntimeError(f"{target.name}: libtpu is held by another process ({str(exc).splitlines()[0]}); "
                               "set ALLOW_MULTIPLE_LIBTPU_LOAD=1 in the environment before JAX loads libtpu "
                               "(compile-only devices open no TPU)") from exc
        raise
    return sorted(topology.devices, key=lambda d: d.id)


def _gpu_devices(target: Target) -> list[jax.Device]:
    from jax.experimental import topologies

    plugin = next((pjrt for pjrt, extension in _CUDA_PLUGINS if _found(pjrt) and _found(extension)), None)
    if plugin is None:
        raise _missing(target, "JAX's CUDA plugin (jax-cuda12-plugin and jax-cuda12-pjrt)")
    config = GPU_SPECS[target.name.split("x")[0]].target_config()

    def topology():
        return topologies.get_topology_desc(platform="cuda", topology=target.topology, target_config=config)

    with quiet_plugin_start():  # without the CUDA stub's "Could not find cuda drivers" on a CPU host
        try:
            desc = topology()
        except NotImplementedError:
            # The plugin registers only after its check that CUDA's libraries load, which fails on a machine without
            # them (its traceback is logged as "Jax plugin configuration error"; with JAX_PLATFORMS=cpu, which
            # flaxzoo.models.jax_startup sets on such a machine, JAX skips the check); compiling needs none of them.
            _register_cuda_plugin_without_cuda(plugin)
            desc = topology()
    devices = sorted(desc.devices, key=lambda d: d.id)
    _check_ptx_toolchain(target, devices[0])
    return devices


# (the PJRT plugin, the extension with its custom calls): JAX's CUDA 12 wheels, or CUDA 13's.
_CUDA_PLUGINS = (("jax_plugins.xla_cuda12", "jax_cuda12_plugin"), ("jax_plugins.xla_cuda13", "jax_cuda13_plugin"))


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def _register_cuda_plugin_without_cuda(module: str) -> None:
    plugin = importlib.import_module(module)
    saved = os.environ.get("JAX_SKIP_CUDA_CONSTRAINTS_CHECK")
    os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"
    try:
        plugin.initialize()
    finally:
        if saved is None:
            del os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"]
        else:
            os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = saved


def _check_ptx_toolchain(target: Target, device: jax.Device) -> None:
    """Compile ``exp`` once: XLA's GPU compiler needs libdevice (to lower math functions) and ptxas (PTX to SASS),
    which ship with NVIDIA's ``nvidia-cuda-nvcc-cu12`` wheel or a CUDA toolkit, not with the plugin."""
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    try:
        with persistent_cache_off():
            jax.jit(jnp.exp).lower(jax.ShapeDtypeStruct((8,), jnp.float32,
                                                        sharding=SingleDeviceSharding(device))).compile()
    except jax.errors.JaxRuntimeError as exc:
        text = str(exc)
        if "libdevice" in text or "ptxas" in text or "PTX compilation provider" in text:
            first = text.splitlines()[0][:200]
            raise _missing(target, "NVIDIA's PTX compiler and libdevice (nvidia-cuda-nvcc-cu12, or a CUDA toolkit "
                                   f"in /usr/local/cuda or $CUDA_ROOT; XLA said: {first})") from exc
        raise


@contextlib.contextmanager
def persistent_cache_off() -> Iterator[None]:
    """Compile with JAX's persistent compilation cache off: it stores compile-only executables but cannot load
    them (a warning and a fresh compile on every later hit), so caching them only costs disk."""
    previous = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", previous)
