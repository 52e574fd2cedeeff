"""Device descriptions for XLA's GPU compiler without a GPU (:class:`GpuSpec`, one per GPU target family:
:data:`GPU_SPECS`), from the vendors' data sheets and architecture papers."""

from __future__ import annotations

import dataclasses

from flaxzoo.train.tools.targets.chips import GiB


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
