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
devices have no ``memory_stats()``. A GPU executable's ``cost_analysis()`` is ``None`` (``flaxzoo.train.tools.compile`` counts
FLOPs analytically anyway: XLA counts a loop body once). JAX's persistent compilation cache writes compile-only
executables but cannot read them back (``PjRtCompiler must be constructed with a Client``, a warning and a fresh
compile): compile under :func:`persistent_cache_off`.

Modules: ``chips`` (the figures, :class:`Target`, :func:`parse_target`, :func:`target_names`), ``gpu_specs`` (the
device descriptions of :data:`GPU_SPECS`), ``devices`` (:func:`compile_devices`, :func:`plugin_available`,
:func:`persistent_cache_off`); every name below is importable from ``flaxzoo.train.tools.targets`` itself.
"""

from flaxzoo.train.tools.targets.chips import GiB, TARGET_HELP, Target, parse_target, target_names
from flaxzoo.train.tools.targets.devices import (AOT_INSTALL, AotUnavailable, compile_devices, persistent_cache_off,
                                           plugin_available)
from flaxzoo.train.tools.targets.gpu_specs import A100_SXM, GPU_SPECS, H100_SXM, GpuSpec

__all__ = ["A100_SXM", "AOT_INSTALL", "GPU_SPECS", "GiB", "GpuSpec", "H100_SXM", "TARGET_HELP", "AotUnavailable",
           "Target", "compile_devices", "parse_target", "persistent_cache_off", "plugin_available", "target_names"]
