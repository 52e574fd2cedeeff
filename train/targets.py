"""Compile-only accelerator devices on a CPU machine, for ahead-of-time compiles (``python -m flaxzoo.train.compile``).

:func:`parse_target` turns a name into a :class:`Target` (the chip's memory, peak and bandwidth figures and the
topology to ask for); :func:`compile_devices` gives that target's devices as ``jax.Device`` objects that the XLA
compiler of the real chip accepts but that cannot run anything: ``jax.jit(f, in_shardings=..., out_shardings=...)
.lower(jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))).compile()`` over a mesh of them gives
the real executable, its ``memory_analysis()`` and HLO, with no accelerator attached. TPU devices come from libtpu,
GPU devices from JAX's CUDA plugin given a device description (:data:`GPU_SPECS`): both need the ``aot`` extra
(``pip install "flaxzoo[aot]"``); without it :func:`compile_devices` raises :class:`AotUnavailable`.

Names (one JAX device per chip on every target; v4 and v5p count TensorCores, two per chip, run as one megacore):

========== ============================= ============== ==================== ===================================
name       devices                       topology       chips per host       chip
========== ============================= ============== ==================== ===================================
v4-8       4 (v4-16: 8, ... v4-8192)     v4:2x2x1       2x2x1 (4)            "TPU v4", megacore
v5e-1      1                             v5e:1x1        1x1x1 (1)            "TPU v5 lite"
v5e-4      4                             v5e:2x2        2x2x1 (4)
v5e-8      8 (v5e-16 ... v5e-256)        v5e:2x4        2x4x1 (8)
v5p-8      4 (v5p-16: 8, ... v5p-8192)   v5:2x2x1       2x2x1 (4)            "TPU v5", megacore
v6e-1/4/8  as v5e (... v6e-256)          v6e:1x1 ...    as v5e               "TPU v6 lite"
h100xN     N (1..8, or a multiple of 8)  1x1xN, 1xHx8   8 (H = N / 8 hosts)  "NVIDIA H100 80GB HBM3"
a100xN     N                             as h100        as h100              "NVIDIA A100-SXM4-80GB"
========== ============================= ============== ==================== ===================================

2-D slices (v5e, v6e) grow 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16 (the Cloud TPU shapes); 3-D ones (v4, v5p)
2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8, ... 16x16x16, the smallest dimension doubled each time. v5e and v6e VMs
hold up to 8 chips (Cloud TPU docs: a 4x4 slice is 2 hosts), v4 and v5p ones 4; the host split changes nothing in the
compiled program (the HLO of a sharded step is the same with 4- or 8-chip hosts), only the devices' ``process_index``.
``slices > 1`` (TPU multislice over the data-centre network) gives ``slices`` times the devices, with ``slice_index``
0 .. slices-1 (a single slice's compile-only devices have no ``slice_index`` attribute): build the mesh with
``jax.experimental.mesh_utils.create_hybrid_device_mesh``. GPU targets of more than 8 GPUs are hosts of 8 (the GPU
topology string is partitions x hosts x GPUs per host; ``slices`` sets the partitions). GPU devices tell hosts apart by
``process_index`` only (``slice_index`` and ``partition_index`` are 0 on all, whatever the partitions), so a hybrid
mesh over hosts takes ``process_is_granule=True``; the compiled HLO is the same with 1x2x8 or 2x1x8.

What the compilers check: libtpu refuses a program that does not fit the chip (``RESOURCE_EXHAUSTED: ... exceeds
available HBM (15.75G)``: :attr:`Target.usable_hbm_bytes`); XLA's GPU compiler does not (it only logs that the
scheduler's memory limit is exceeded), so a GPU fit check is ``memory_analysis()`` against ``hbm_bytes``. Compile-only
devices have no ``memory_stats()``. A GPU executable's ``cost_analysis()`` is ``None`` (``flaxzoo.train.compile`` counts
FLOPs analytically anyway: XLA counts a loop body once). JAX's persistent compilation cache writes compile-only
executables but cannot read them back (``PjRtCompiler must be constructed with a Client``, a warning and a fresh
compile): compile under :func:`persistent_cache_off`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import os
import re
import threading
from typing import Iterator

import jax

GiB = 2**30

AOT_INSTALL = 'pip install "flaxzoo[aot]"'


class AotUnavailable(ImportError):
    """What a target's compile-only devices need (libtpu, JAX's CUDA plugin, NVIDIA's PTX compiler) is missing."""


# ======================================================================================================== chips
@dataclasses.dataclass(frozen=True)
class _Chip:
    """One accelerator generation: the figures of a :class:`Target` and how its topology is asked for."""

    family: str  # the name's prefix: "v5e", "h100"
    platform: str  # "tpu" | "gpu"
    device_kind: str  # jax.Device.device_kind of its (compile-only and real) devices
    hbm_bytes: int
    usable_hbm_bytes: int
    peak_flops: float  # dense bf16 FLOP/s per device
    hbm_bandwidth: float  # bytes/s per device
    topology_prefix: str = ""  # TPU: libtpu's generation name, "v5e" in "v5e:2x4"
    dims: int = 2  # TPU: 2-D (v5e, v6e) or 3-D (v4, v5p) slices
    counts_cores: bool = False  # TPU: the name counts TensorCores (2 per chip), not chips
    chip_config_name: str = "default"  # TPU: "megacore" runs a chip's two TensorCores as one device
    max_chips: int = 0  # TPU: the largest slice
    # TPU: the most chips on one host: v5e / v6e VMs hold 1, 4 or 8 chips, v4 / v5p ones 4.
    host_chips: int = 4


# Figures: Cloud TPU system-architecture pages (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e: peak bf16 compute per
# chip, HBM capacity and bandwidth per chip), NVIDIA's H100 and A100 data sheets (dense = half the "with sparsity"
# Tensor Core figure; memory and its bandwidth for the SXM 80 GB parts). usable_hbm_bytes, TPU: the HBM the compiler
# (libtpu 0.0.42) lets a program have, from its out-of-memory error ("exceeds available HBM (15.75G)"); a single
# output buffer up to ~2-3 MiB (the program's code) under it compiles. v5p: libtpu allows 95.74 GiB, more than the
# docs' "95 GB" taken as GiB. GPU: XLA's compiler enforces no limit; this is the whole memory (at run time
# JAX's allocator takes 75% of it unless XLA_PYTHON_CLIENT_MEM_FRACTION / XLA_PYTHON_CLIENT_PREALLOCATE say otherwise).
_CHIPS: dict[str, _Chip] = {chip.family: chip for chip in (
    _Chip("v4", "tpu", "TPU v4", 32 * GiB, int(30.75 * GiB), 275e12, 1.2e12,
          topology_prefix="v4", dims=3, counts_cores=True, chip_config_name="megacore", max_chips=4096),
    _Chip("v5e", "tpu", "TPU v5 lite", 16 * GiB, int(15.75 * GiB), 197e12, 8.19e11,
          topology_prefix="v5e", dims=2, max_chips=256, host_chips=8),
    _Chip("v5p", "tpu", "TPU v5", 95 * GiB, int(95.74 * GiB), 459e12, 2.765e12,
          topology_prefix="v5", dims=3, counts_cores=True, chip_config_name="megacore", max_chips=4096),
    _Chip("v6e", "tpu", "TPU v6 lite", 32 * GiB, int(31.25 * GiB), 918e12, 1.638e12,
          topology_prefix="v6e", dims=2, max_chips=256, host_chips=8),
    # H100 SXM5: BF16 Tensor Core 1,979 TFLOPS with sparsity -> 989 dense; 80 GB HBM3 at 3.35 TB/s.
    # Usable, GPU: JAX's allocator takes XLA_PYTHON_CLIENT_MEM_FRACTION = 75% of the memory by default, which is the
    # bytes_limit a real run (and so remat=auto there) sees.
    _Chip("h100", "gpu", "NVIDIA H100 80GB HBM3", 80 * GiB, int(0.75 * 80 * GiB), 989e12, 3.35e12, host_chips=8),
    # A100 SXM4 80 GB: BF16 Tensor Core 312 TFLOPS dense (624 with sparsity); 80 GB HBM2e at 2,039 GB/s.
    _Chip("a100", "gpu", "NVIDIA A100-SXM4-80GB", 80 * GiB, int(0.75 * 80 * GiB), 312e12, 2.039e12, host_chips=8),
)}
_ALIASES = {"v5litepod": "v5e"}  # Cloud TPU's accelerator-type name for v5e


# ================================================================================================ GPU descriptions
@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """The device description XLA's GPU compiler needs without a GPU (a ``stream_executor.GpuTargetConfigProto``).

    Which fields matter (tried on a sharded transformer-layer step, jax 0.10.2): the compute capability (without it
    XLA asks ptxas for sm_0.0 and fails), threads per warp and the grid limit (zero: a division by zero crashes the
    process, SIGFPE), the opt-in shared memory per block (zero: "Shared memory size limit exceeded" on every Triton
    fusion); SM count, clock, FP32 lanes, memory bandwidth and size, L2 size, shared memory per block, registers per
    block and threads per SM change fusion and scheduling choices (other HLO, other temporaries); the rest (threads
    per block, block limits, registers and shared memory per SM, the name) left out changed nothing there. An empty
    description makes devices but compiles nothing (SIGFPE in launch-dimension arithmetic)."""

    name: str  # the CUDA device name; JAX reports it as device_kind
    compute_capability: tuple[int, int]
    accelerated_features: bool  # sm_90a ("a" features: wgmma, TMA...), as a real Hopper reports
    sm_count: int
    fp32_lanes_per_sm: int
    clock_ghz: float
    memory_bytes: int
    memory_bandwidth: float  # bytes/s
    l2_cache_bytes: int
    shared_memory_per_sm: int
    shared_memory_per_block: int  # without opting in
    shared_memory_per_block_optin: int
    registers_per_sm: int
    registers_per_block: int
    threads_per_sm: int
    threads_per_block: int = 1024
    threads_per_warp: int = 32
    grid_limits: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    block_limits: tuple[int, int, int] = (1024, 1024, 64)

    def target_config(self) -> str:
        """The description as GpuTargetConfigProto text (the format of XLA's ``gpu_specs/*.txtpb``)."""
        major, minor = self.compute_capability
        extension = " feature_extension: ACCELERATED_FEATURES" if self.accelerated_features else ""
        fields = {
            "threads_per_block_limit": self.threads_per_block, "threads_per_warp": self.threads_per_warp,
            "shared_memory_per_block": self.shared_memory_per_block,
            "shared_memory_per_core": self.shared_memory_per_sm, "threads_per_core_limit": self.threads_per_sm,
            "core_count": self.sm_count, "fpus_per_core": self.fp32_lanes_per_sm,
            "block_dim_limit_x": self.grid_limits[0], "block_dim_limit_y": self.grid_limits[1],
            "block_dim_limit_z": self.grid_limits[2], "memory_bandwidth": int(self.memory_bandwidth),
            "l2_cache_size": self.l2_cache_bytes, "clock_rate_ghz": self.clock_ghz,
            "device_memory_size": self.memory_bytes,
            "shared_memory_per_block_optin": self.shared_memory_per_block_optin,
            "registers_per_core_limit": self.registers_per_sm, "registers_per_block_limit": self.registers_per_block,
            "thread_dim_limit_x": self.block_limits[0], "thread_dim_limit_y": self.block_limits[1],
            "thread_dim_limit_z": self.block_limits[2],
        }
        body = "".join(f"  {key}: {value}\n" for key, value in fields.items())
        return (f"gpu_device_info {{\n{body}"
                f"  cuda_compute_capability {{ major: {major} minor: {minor}{extension} }}\n"
                f"  name: \"{self.name}\"\n}}\n"
                f"platform_name: \"CUDA\"\ndevice_description_str: \"{self.name}\"\n")


# H100 SXM5 80 GB. NVIDIA H100 data sheet: 80 GB HBM3, 3.35 TB/s, FP32 67 TFLOPS; Hopper architecture whitepaper
# ("NVIDIA H100 Tensor Core GPU Architecture"): 132 SMs, 128 FP32 cores per SM (16,896), 50 MB L2, 256 KB of
# registers per SM (64 K 32-bit), shared memory configurable up to 228 KB per SM; the 1.98 GHz boost clock is the
# one the FP32 figure implies (132 x 128 x 2 FLOP x 1.98 GHz = 66.9 TFLOPS); CUDA C++ Programming Guide, "Technical
# Specifications per Compute Capability", 9.0: 227 KB shared memory per block (opt-in; 48 KB without), 2048 threads
# and 64 K registers per SM, 64 K registers and 1024 threads per block, blocks of 1024 x 1024 x 64, grids of
# (2^31 - 1) x 65535 x 65535. The CUDA name is the one the driver reports for this part. Format (not values): XLA's
# xla/backends/gpu/target_config/specs/h100_sxm.txtpb.
H100_SXM = GpuSpec(
    name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0), accelerated_features=True, sm_count=132,
    fp32_lanes_per_sm=128, clock_ghz=1.98, memory_bytes=80 * GiB, memory_bandwidth=3.35e12,
    l2_cache_bytes=50 * 2**20, shared_memory_per_sm=228 * 1024, shared_memory_per_block=48 * 1024,
    shared_memory_per_block_optin=227 * 1024, registers_per_sm=65536, registers_per_block=65536, threads_per_sm=2048)
# A100 SXM4 80 GB. NVIDIA A100 data sheet: 80 GB HBM2e, 2,039 GB/s, FP32 19.5 TFLOPS; Ampere architecture whitepaper
# ("NVIDIA A100 Tensor Core GPU Architecture"): 108 SMs, 64 FP32 cores per SM (6,912), 1410 MHz boost clock
# (108 x 64 x 2 FLOP x 1.41 GHz = 19.5 TFLOPS), 40 MB L2, 256 KB of registers per SM, up to 164 KB shared memory per
# SM; CUDA C++ Programming Guide, compute capability 8.0: 163 KB shared memory per block (opt-in; 48 KB without),
# 2048 threads and 64 K registers per SM, limits per block and grid as 9.0. Format: XLA's a100_sxm_80.txtpb.
A100_SXM = GpuSpec(
    name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0), accelerated_features=False, sm_count=108,
    fp32_lanes_per_sm=64, clock_ghz=1.41, memory_bytes=80 * GiB, memory_bandwidth=2.039e12,
    l2_cache_bytes=40 * 2**20, shared_memory_per_sm=164 * 1024, shared_memory_per_block=48 * 1024,
    shared_memory_per_block_optin=163 * 1024, registers_per_sm=65536, registers_per_block=65536, threads_per_sm=2048)
GPU_SPECS: dict[str, GpuSpec] = {"h100": H100_SXM, "a100": A100_SXM}


# ================================================================================================ targets
@dataclasses.dataclass(frozen=True)
class Target:
    """An accelerator system to compile for: ``chips`` devices per slice, ``slices`` slices; figures per device."""

    name: str  # canonical: "v5e-8", "v4-16", "h100x8"
    platform: str  # "tpu" | "gpu"
    chips: int  # devices per slice (TPU chips, megacore on v4 / v5p; GPUs)
    slices: int  # TPU slices joined over the data-centre network; GPU: copies of the N-GPU system
    hbm_bytes: int  # per device, the vendor's figure
    usable_hbm_bytes: int  # per device: what the compiler lets a program have (TPU); JAX's 75% of it (GPU)
    peak_flops: float  # dense bf16 FLOP/s per device
    hbm_bandwidth: float  # bytes/s per device
    device_kind: str  # as jax reports it
    topology: str  # what get_topology_desc is given: "v5e:2x4" (TPU), "1x1x8" (GPU: partitions x hosts x GPUs)
    chips_per_host: tuple[int, int, int]  # TPU: chips_per_host_bounds; GPU: (1, 1, GPUs per host)
    chip_config_name: str = "default"  # TPU: "megacore" on v4 / v5p

    @property
    def devices(self) -> int:
        """Devices over all slices."""
        return self.chips * self.slices

    @property
    def hosts(self) -> int:
        """Processes (hosts) over all slices."""
        per_host = self.chips_per_host[0] * self.chips_per_host[1] * self.chips_per_host[2]
        return self.slices * max(1, self.chips // per_host)

    def describe(self) -> str:
        """One line: devices, chip, memory, peak, bandwidth."""
        slices = f" x {self.slices} slices" if self.slices > 1 else ""
        return (f"{self.name}{slices}: {self.devices} x {self.device_kind} ({self.hosts} host(s)), "
                f"{self.hbm_bytes / GiB:g} GiB HBM ({self.usable_hbm_bytes / GiB:.2f} usable), "
                f"{self.peak_flops / 1e12:g} TFLOP/s bf16, {self.hbm_bandwidth / 1e9:g} GB/s per device")


_SHAPES_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}


def _shapes_3d(max_chips: int) -> dict[int, tuple[int, int, int]]:
    """``{chips: (x, y, z)}``: 2x2x1, then the smallest dimension (the last of equals) doubled, up to ``max_chips``."""
    shape, shapes = [2, 2, 1], {}
    while shape[0] * shape[1] * shape[2] <= max_chips:
        shapes[shape[0] * shape[1] * shape[2]] = tuple(shape)
        smallest = min(shape)
        i = max(j for j in range(3) if shape[j] == smallest)
        shape[i] *= 2
    return shapes


def _shapes(chip: _Chip) -> dict[int, tuple[int, ...]]:
    return _SHAPES_2D if chip.dims == 2 else _shapes_3d(chip.max_chips)


def _sizes(chip: _Chip) -> list[int]:
    """The numbers a name of this TPU family may carry (TensorCores on v4 / v5p, chips on v5e / v6e)."""
    return [n * (2 if chip.counts_cores else 1) for n in _shapes(chip)]


def target_names() -> list[str]:
    """Every TPU name :func:`parse_target` accepts, then the GPU ones of 1, 2, 4, 8 and 16 GPUs (any N <= 8 and any
    multiple of 8 parse)."""
    names = [f"{chip.family}-{n}" for chip in _CHIPS.values() if chip.platform == "tpu" for n in _sizes(chip)]
    return names + [f"{family}x{n}" for family in ("h100", "a100") for n in (1, 2, 4, 8, 16)]


def _sizes_text(chip: _Chip) -> str:
    sizes = _sizes(chip)
    return ", ".join(f"{chip.family}-{n}" for n in sizes[:4]) + f", ... {chip.family}-{sizes[-1]}"


TARGET_HELP = ("TPU " + "; ".join(_sizes_text(c) for c in _CHIPS.values() if c.platform == "tpu")
               + " (v4 and v5p count TensorCores: v4-8 is 4 chips); GPU h100xN, a100xN (N = 1..8 GPUs on one host, or "
               "a multiple of 8: hosts of 8)")


def parse_target(name: str, slices: int = 1) -> Target:
    """The :class:`Target` named ``name`` (see the module's table), ``slices`` times over.

    Raises ``ValueError`` naming the value and what is expected for an unknown name, a size the family does not come
    in, or a slice count below 1."""
    if isinstance(slices, bool) or not isinstance(slices, int) or slices < 1:
        raise ValueError(f"slices must be a whole number >= 1; got {slices!r}")
    text = name.strip().lower() if isinstance(name, str) else ""
    tpu = re.fullmatch(r"(v4|v5e|v5litepod|v5p|v6e)-(\d+)", text)
    gpu = re.fullmatch(r"(h100|a100)x(\d+)", text)
    if tpu:
        chip = _CHIPS[_ALIASES.get(tpu.group(1), tpu.group(1))]
        count = int(tpu.group(2))
        chips = count // 2 if chip.counts_cores and count % 2 == 0 else (0 if chip.counts_cores else count)
        shape = _shapes(chip).get(chips)
        if shape is None:
            unit = "TensorCores, 2 per chip" if chip.counts_cores else "chips"
            raise ValueError(f"unknown target {name!r}: {chip.family} comes as {_sizes_text(chip)} ({unit}); "
                             f"expected one of: {TARGET_HELP}")
        host = min(chips, chip.host_chips)
        bounds = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}[host]
        return Target(name=f"{chip.family}-{count}", platform="tpu", chips=chips, slices=slices,
                      hbm_bytes=chip.hbm_bytes, usable_hbm_bytes=chip.usable_hbm_bytes, peak_flops=chip.peak_flops,
                      hbm_bandwidth=chip.hbm_bandwidth, device_kind=chip.device_kind,
                      topology=f"{chip.topology_prefix}:" + "x".join(map(str, shape)), chips_per_host=bounds,
                      chip_config_name=chip.chip_config_name)
    if gpu:
        chip = _CHIPS[gpu.group(1)]
        count = int(gpu.group(2))
        if count < 1 or (count > chip.host_chips and count % chip.host_chips):
            raise ValueError(f"unknown target {name!r}: {chip.family}xN takes N = 1..{chip.host_chips} GPUs on one "
                             f"host or a multiple of {chip.host_chips} (hosts of {chip.host_chips}); "
                             f"expected one of: {TARGET_HELP}")
        per_host = min(count, chip.host_chips)
        hosts = count // per_host
        return Target(name=f"{chip.family}x{count}", platform="gpu", chips=count, slices=slices,
                      hbm_bytes=chip.hbm_bytes, usable_hbm_bytes=chip.usable_hbm_bytes, peak_flops=chip.peak_flops,
                      hbm_bandwidth=chip.hbm_bandwidth, device_kind=chip.device_kind,
                      topology=f"{slices}x{hosts}x{per_host}", chips_per_host=(1, 1, per_host))
    raise ValueError(f"unknown target {name!r}; expected one of: {TARGET_HELP}")


# ================================================================================================ devices
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

    try:
        desc = topology()
    except NotImplementedError:
        # The plugin registers only after its check that CUDA's libraries load, which fails on a machine without
        # them (its traceback is logged as "Jax plugin configuration error"); compiling needs none of them.
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


# ================================================================================================ compiling
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

