"""flaxzoo.train.tools.targets: target names, the figures behind them, and compile-only TPU / GPU devices that really compile.

The compile tests need the ``aot`` extra (libtpu; JAX's CUDA plugin and NVIDIA's PTX compiler) and are skipped,
with the reason, where a plugin is not installed."""

import os

# Several test processes (pytest-xdist workers, and the processes they start) may load libtpu at once; it refuses a
# second loader without this. Set before anything here loads libtpu (conftest imports jax but starts no backend).
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import importlib.util  # noqa: E402
import math  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.experimental import mesh_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from flaxzoo.train.tools import targets  # noqa: E402
from flaxzoo.train.tools.targets import devices as target_devices  # noqa: E402
from flaxzoo.train.tools.targets import GiB, AotUnavailable, Target, compile_devices, parse_target, target_names  # noqa: E402


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


needs_tpu = pytest.mark.skipif(not _installed("libtpu"), reason='libtpu is not installed (pip install "flaxzoo[aot]")')
needs_gpu = pytest.mark.skipif(
    not any(_installed(f"jax_plugins.xla_cuda{v}") and _installed(f"jax_cuda{v}_plugin") for v in (12, 13)),
    reason='JAX\'s CUDA plugin is not installed (pip install "flaxzoo[aot]")')


# ================================================================================================ names
TABLE = {  # name: (platform, devices, topology, chips per host, chip config, device kind)
    "v4-8": ("tpu", 4, "v4:2x2x1", (2, 2, 1), "megacore", "TPU v4"),
    "v4-16": ("tpu", 8, "v4:2x2x2", (2, 2, 1), "megacore", "TPU v4"),
    "v4-32": ("tpu", 16, "v4:2x2x4", (2, 2, 1), "megacore", "TPU v4"),
    "v4-128": ("tpu", 64, "v4:4x4x4", (2, 2, 1), "megacore", "TPU v4"),
    "v5e-1": ("tpu", 1, "v5e:1x1", (1, 1, 1), "default", "TPU v5 lite"),
    "v5e-4": ("tpu", 4, "v5e:2x2", (2, 2, 1), "default", "TPU v5 lite"),
    "v5e-8": ("tpu", 8, "v5e:2x4", (2, 4, 1), "default", "TPU v5 lite"),
    "v5e-16": ("tpu", 16, "v5e:4x4", (2, 4, 1), "default", "TPU v5 lite"),
    "v5e-32": ("tpu", 32, "v5e:4x8", (2, 4, 1), "default", "TPU v5 lite"),
    "v5e-256": ("tpu", 256, "v5e:16x16", (2, 4, 1), "default", "TPU v5 lite"),
    "v5p-8": ("tpu", 4, "v5:2x2x1", (2, 2, 1), "megacore", "TPU v5"),
    "v5p-16": ("tpu", 8, "v5:2x2x2", (2, 2, 1), "megacore", "TPU v5"),
    "v5p-8192": ("tpu", 4096, "v5:16x16x16", (2, 2, 1), "megacore", "TPU v5"),
    "v6e-1": ("tpu", 1, "v6e:1x1", (1, 1, 1), "default", "TPU v6 lite"),
    "v6e-8": ("tpu", 8, "v6e:2x4", (2, 4, 1), "default", "TPU v6 lite"),
    "v6e-16": ("tpu", 16, "v6e:4x4", (2, 4, 1), "default", "TPU v6 lite"),
    "h100x1": ("gpu", 1, "1x1x1", (1, 1, 1), "default", "NVIDIA H100 80GB HBM3"),
    "h100x8": ("gpu", 8, "1x1x8", (1, 1, 8), "default", "NVIDIA H100 80GB HBM3"),
    "h100x16": ("gpu", 16, "1x2x8", (1, 1, 8), "default", "NVIDIA H100 80GB HBM3"),
    "a100x3": ("gpu", 3, "1x1x3", (1, 1, 3), "default", "NVIDIA A100-SXM4-80GB"),
    "a100x8": ("gpu", 8, "1x1x8", (1, 1, 8), "default", "NVIDIA A100-SXM4-80GB"),
}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_table(name):
    platform, devices, topology, per_host, chip_config, kind = TABLE[name]
    t = parse_target(name)
    assert (t.name, t.platform, t.devices, t.topology, t.chips_per_host, t.chip_config_name, t.device_kind) == (
        name, platform, devices, topology, per_host, chip_config, kind)


def test_every_listed_name_parses():
    names = target_names()
    assert len(names) == len(set(names)) and {"v4-8", "v5e-1", "v5e-256", "v5p-8", "v6e-8", "h100x8"} <= set(names)
    for name in names:
        t = parse_target(name)
        assert t.name == name and t.slices == 1 and t.devices == t.chips
        if t.platform == "tpu":
            shape = [int(n) for n in t.topology.split(":")[1].split("x")]
            assert math.prod(shape) == t.chips
            assert t.chips % math.prod(t.chips_per_host) == 0
        assert 0 < t.usable_hbm_bytes <= 1.01 * t.hbm_bytes
    for name in names:  # every size is in the help text's family list
        assert name.split("-")[0].split("x")[0] in targets.TARGET_HELP


def test_spellings_and_slices():
    assert parse_target(" V5E-8 ").name == "v5e-8"
    assert parse_target("v5litepod-16") == parse_target("v5e-16")
    t = parse_target("v5p-16", slices=4)
    assert (t.chips, t.slices, t.devices, t.hosts) == (8, 4, 32, 8)
    assert parse_target("v5e-16").hosts == 2 and parse_target("v5e-4").hosts == 1
    g = parse_target("h100x16", slices=2)
    assert (g.topology, g.devices, g.hosts) == ("2x2x8", 32, 4)
    assert "v5e-8 x 2 slices: 16 x TPU v5 lite" in parse_target("v5e-8", 2).describe()


FIGURES = {  # family: (HBM GiB, peak bf16 TFLOP/s, HBM GB/s)
    "v4-8": (32, 275, 1200), "v5e-8": (16, 197, 819), "v5p-8": (95, 459, 2765), "v6e-8": (32, 918, 1638),
    "h100x8": (80, 989, 3350), "a100x8": (80, 312, 2039),
}


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_figures(name):
    hbm, peak, bandwidth = FIGURES[name]
    t = parse_target(name)
    assert (t.hbm_bytes, t.peak_flops, t.hbm_bandwidth) == (hbm * GiB, peak * 1e12, bandwidth * 1e9)


@pytest.mark.parametrize("name", ["v5e-2", "v5e-512", "v4-4", "v4-7", "v4-12", "v5p-6", "v6e-3", "h100x0", "h100x12",
                                  "a100x20", "v7-8", "h200x8", "v5e_8", "tpu", "", "8"])
def test_bad_names(name):
    with pytest.raises(ValueError) as info:
        parse_target(name)
    text = str(info.value)
    assert repr(name) in text and "expected" in text
    assert "v5e-1" in text and "h100xN" in text  # the whole list of what is accepted


def test_bad_size_names_the_family_sizes():
    with pytest.raises(ValueError, match=r"v5e comes as v5e-1, v5e-4, v5e-8, v5e-16, ... v5e-256"):
        parse_target("v5e-2")
    with pytest.raises(ValueError, match=r"TensorCores, 2 per chip"):
        parse_target("v4-4")
    with pytest.raises(ValueError, match=r"N = 1..8 GPUs on one host or a multiple of 8"):
        parse_target("h100x12")


@pytest.mark.parametrize("slices", [0, -1, 1.5, True, "2"])
def test_bad_slices(slices):
    with pytest.raises(ValueError, match="slices must be a whole number >= 1"):
        parse_target("v5e-8", slices)


def test_gpu_descriptions():
    text = targets.H100_SXM.target_config()
    for field in ("core_count: 132", "clock_rate_ghz: 1.98", "memory_bandwidth: 3350000000000",
                  "shared_memory_per_block_optin: 232448", "major: 9 minor: 0 feature_extension: ACCELERATED_FEATURES",
                  'name: "NVIDIA H100 80GB HBM3"', 'platform_name: "CUDA"'):
        assert field in text
    assert "core_count: 108" in targets.A100_SXM.target_config() and "feature_extension" not in \
        targets.A100_SXM.target_config()
    for family, spec in targets.GPU_SPECS.items():
        t = parse_target(f"{family}x8")
        assert spec.name == t.device_kind and spec.memory_bytes == t.hbm_bytes
        assert spec.memory_bandwidth == t.hbm_bandwidth


def test_missing_plugin_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    for name in ("v5e-32", "a100x5"):  # not compiled elsewhere in this file: not cached
        with pytest.raises(AotUnavailable, match=r'pip install "flaxzoo\[aot\]"') as info:
            compile_devices(parse_target(name, slices=3))
        assert isinstance(info.value, ImportError)


# ================================================================================================ compiling
def _compile_matmul(target: Target, devices: list[jax.Device]):
    """``x @ w`` with x [8*128, 256] split over 8 devices by rows, w [256, 512] replicated; the compiled executable
    and the bytes of one device's x, w and output shard."""
    mesh = Mesh(np.array(devices).reshape(len(devices)), ("x",))
    rows, replicated = NamedSharding(mesh, P("x", None)), NamedSharding(mesh, P())
    x = jax.ShapeDtypeStruct((8 * 128, 256), jnp.bfloat16, sharding=rows)
    w = jax.ShapeDtypeStruct((256, 512), jnp.bfloat16, sharding=replicated)
    f = jax.jit(lambda x, w: jnp.tanh(x @ w), in_shardings=(rows, replicated), out_shardings=rows)
    with targets.persistent_cache_off():
        compiled = f.lower(x, w).compile()
    return compiled, 8 * 128 * 256 * 2 // 8, 256 * 512 * 2, 8 * 128 * 512 * 2 // 8


def _check_matmul(target: Target, devices: list[jax.Device]):
    compiled, x_bytes, w_bytes, out_bytes = _compile_matmul(target, devices)
    memory = compiled.memory_analysis()
    assert memory.argument_size_in_bytes == x_bytes + w_bytes  # the row-split x: 1/8 of its 512 KiB per device
    assert memory.output_size_in_bytes == out_bytes
    assert 0 <= memory.temp_size_in_bytes < 64 * 2**20
    return compiled


@needs_tpu
def test_tpu_devices_compile():
    target = parse_target("v5e-8")
    devices = compile_devices(target)
    assert len(devices) == 8 and {d.platform for d in devices} == {"tpu"}
    assert {d.device_kind for d in devices} == {"TPU v5 lite"} and target.device_kind == "TPU v5 lite"
    assert {d.process_index for d in devices} == {0}  # one 8-chip host
    assert not hasattr(devices[0], "slice_index")  # a single slice's compile-only devices have none
    compiled = _check_matmul(target, devices)
    flops = compiled.cost_analysis()["flops"]  # per device: libtpu's own count (the matmul and the tanh)
    assert 2 * 128 * 256 * 512 <= flops <= 1.05 * 2 * 128 * 256 * 512
    assert compile_devices(target) == devices and compile_devices(target) is not compile_devices(target)


@needs_tpu
def test_tpu_compiler_holds_programs_to_usable_hbm():
    target = parse_target("v5e-1")
    (device,) = compile_devices(target)
    out = NamedSharding(Mesh(np.array([device]), ("x",)), P())

    def compile_output(nbytes: int):
        with targets.persistent_cache_off():
            return jax.jit(lambda: jnp.zeros((nbytes,), jnp.int8), out_shardings=out).lower().compile()

    assert compile_output(target.usable_hbm_bytes - 64 * 2**20).memory_analysis().output_size_in_bytes > 15 * GiB
    with pytest.raises(jax.errors.JaxRuntimeError, match="RESOURCE_EXHAUSTED"):
        compile_output(target.usable_hbm_bytes + 64 * 2**20)


@needs_tpu
def test_two_slices():
    target = parse_target("v5e-8", slices=2)
    devices = compile_devices(target)
    assert len(devices) == 16 and len({d.id for d in devices}) == 16
    assert sorted(d.slice_index for d in devices) == [0] * 8 + [1] * 8
    assert len({d.process_index for d in devices}) == target.hosts == 2
    grid = mesh_utils.create_hybrid_device_mesh((1, 8), (2, 1), devices=devices)
    assert grid.shape == (2, 8)
    assert [{d.slice_index for d in row} for row in grid] == [{0}, {1}]


@needs_gpu
@pytest.mark.parametrize("name", ["h100x8", "a100x8"])
def test_gpu_devices_compile(name):
    target = parse_target(name)
    devices = compile_devices(target)
    assert len(devices) == 8 and {d.platform for d in devices} == {"gpu"}
    assert {d.device_kind for d in devices} == {target.device_kind}
    compiled = _check_matmul(target, devices)
    assert compiled.cost_analysis() is None  # GPU executables give none: flaxzoo.train.tools.compile counts FLOPs analytically


@needs_gpu
def test_gpu_hosts():
    devices = compile_devices(parse_target("h100x16"))
    assert [d.process_index for d in devices] == [0] * 8 + [1] * 8
    grid = mesh_utils.create_hybrid_device_mesh((1, 8), (2, 1), devices=devices, process_is_granule=True)
    assert [{d.process_index for d in row} for row in grid] == [{0}, {1}]


def test_plugin_available(monkeypatch):
    with pytest.raises(ValueError, match="platform must be 'tpu' or 'gpu'"):
        targets.plugin_available("cpu")
    monkeypatch.setattr(target_devices, "_DEVICES", {})  # nothing made yet, so that the check below looks afresh
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    for platform in ("tpu", "gpu"):
        ok, why = targets.plugin_available(platform)
        assert not ok and 'pip install "flaxzoo[aot]"' in why


@needs_tpu
def test_plugin_available_tpu():
    assert targets.plugin_available("tpu") == (True, "")


@needs_gpu
def test_plugin_available_gpu():
    assert targets.plugin_available("gpu") == (True, "")
