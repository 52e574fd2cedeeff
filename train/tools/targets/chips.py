"""Accelerator targets by name: the chip generations' figures (memory, peak, bandwidth, how their topology is asked
for) and :func:`parse_target`, which turns a name ("v5e-8", "h100x16") into a :class:`Target` (the table of names is
``flaxzoo.train.tools.targets``' docstring)."""

from __future__ import annotations

import dataclasses
import re

GiB = 2**30


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
