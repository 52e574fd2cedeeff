"""flaxzoo.models.jax_startup: JAX starts without the CUDA plugin's / libtpu's start-up lines on a machine without an
accelerator, real errors still get out (in order, even when the process aborts), and a machine with an accelerator or
a user's JAX_PLATFORMS is left as it is."""

from __future__ import annotations

import ctypes
import json
import importlib.util
import os
import re
import subprocess
import sys
import textwrap

import pytest

from flaxzoo.models import jax_startup

AOT = importlib.util.find_spec("libtpu") is not None and importlib.util.find_spec("jax_cuda12_plugin") is not None
# What the plugins print at start-up on a CPU machine (jax_startup's docstring), as the tests look for it.
NOISE_MARKS = re.compile(r"cudart_stub|Could not find cuda drivers|absl::InitializeLog|Logging before InitGoogle|"
                         r"Jax plugin configuration error|Unable to load CUDA|TPU_WORKER_HOSTNAMES|host bounds|"
                         r"TPU_ACCELERATOR_TYPE|Source Location Trace|libtpu_init_utils")

PREFACE = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
CUDART = (b"I0000 00:00:1796460198.541314    5427 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU "
          b"will not be used.\n")
HOST_BOUNDS = (b"Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type, "
               b"please set env var `TPU_ACCELERATOR_TYPE` manually, otherwise libtpu.so may not properly initialize.\n")
GLOG_PREFACE = b"WARNING: Logging before InitGoogle() is written to STDERR\n"
WORKERS = (b"E0000 00:00:1796460199.520764    5427 common_lib.cc:554] INVALID_ARGUMENT: Error: unexpected worker "
           b"hostname 'WARNING: could not determine TPU worker hostnames or IP addresses' from env var "
           b"TPU_WORKER_HOSTNAMES. Expecting a valid hostname or IP address without port number, or hostname:port:address "
           b"triple. (Full TPU workers' addr string: WARNING: could not determine TPU worker hostnames or IP addresses, "
           b"please set env var `TPU_WORKER_HOSTNAMES` manually, otherwise libtpu.so may not properly initialize.)\n")
TRACE = b"=== Source Location Trace: === \nlearning/45eac/tfrc/runtime/libtpu_init_utils.cc:327\n"
NOISE = PREFACE + CUDART + PREFACE + CUDART + HOST_BOUNDS + GLOG_PREFACE + WORKERS + TRACE


# ============================================================================================== the line filter
def test_the_filter_drops_the_noise_and_keeps_everything_else_in_order():
    real = b"E0000 00:00:1796460199.1    5427 foo.cc:12] a real error\n"
    text = (b"first\n" + NOISE + b"between\n" + PREFACE + real + CUDART + b"=== Source Location Trace: ===\n"
            + b"learning/x.cc:1\n" + b"after the trace\n" + b"learning/y.cc:2\n" + PREFACE + b"no newline at the end")
    noise = jax_startup.StartupNoise(["cuda", "tpu"])
    assert noise.filter(text) == (b"first\nbetween\n" + PREFACE + real + b"after the trace\nlearning/y.cc:2\n" + PREFACE
                                  + b"no newline at the end")
    # a preface is kept with the real line after it; source locations after a kept line are kept


def test_the_filter_drops_only_its_groups():
    assert jax_startup.StartupNoise(["cuda"]).filter(NOISE) == HOST_BOUNDS + GLOG_PREFACE + WORKERS + TRACE
    assert jax_startup.StartupNoise(["tpu"]).filter(NOISE) == PREFACE + CUDART + PREFACE + CUDART
    assert jax_startup.StartupNoise([]).filter(NOISE) == NOISE
    # a line that only resembles the noise is kept
    other_gpu = CUDART.replace(b"Could not find cuda drivers", b"Could not find cuDNN")
    assert jax_startup.StartupNoise(["cuda", "tpu"]).filter(other_gpu) == other_gpu
    with pytest.raises(ValueError, match="unknown noise groups"):
        jax_startup.StartupNoise(["rocm"])


def test_filtered_stderr_works_on_the_file_descriptor(capfd):
    """C code's writes to fd 2 (libc's write) and os.write's go through the filter process, in order. (capfd points
    sys.stderr at its file directly: Python's writes are checked in the next test.)"""
    libc = ctypes.CDLL(None)
    capfd.readouterr()
    with jax_startup.filtered_stderr(["cuda", "tpu"]):
        os.write(2, PREFACE + CUDART)
        libc.write(2, b"real error from C\n", len(b"real error from C\n"))
        os.write(2, HOST_BOUNDS + GLOG_PREFACE + WORKERS + TRACE)
        os.write(2, b"last inside\n")
    os.write(2, b"after the filter\n")
    assert capfd.readouterr().err == "real error from C\nlast inside\nafter the filter\n"


def test_python_writes_and_output_before_an_abort_get_out():
    """sys.stderr's writes go through the filter in order with fd 2's; a fatal line and then abort() inside the
    filter: the filter process writes it out after the process died."""
    code = textwrap.dedent(f"""
        import importlib.util, os, sys
        spec = importlib.util.spec_from_file_location("jax_startup", {jax_startup.__file__!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with module.filtered_stderr(["cuda", "tpu"]):
            os.write(2, {(PREFACE + CUDART)!r})
            print("from Python", file=sys.stderr)
            os.write(2, {WORKERS!r})
            os.write(2, b"F0000 00:00:1.0  1 check.cc:3] Check failed: a real fatal error\\n")
            os.abort()
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr == b"from Python\nF0000 00:00:1.0  1 check.cc:3] Check failed: a real fatal error\n"


# =========================================================================================== the machine and env
@pytest.fixture
def fake_machine(tmp_path, monkeypatch):
    """A /dev and /sys/bus/pci/devices of tmp_path's (nothing in them: a CPU machine)."""
    dev, pci = tmp_path / "dev", tmp_path / "pci"
    (dev / "vfio").mkdir(parents=True)
    pci.mkdir()
    monkeypatch.setattr(jax_startup, "GPU_DEVICE_GLOBS", (f"{dev}/nvidia*", f"{dev}/dxg", f"{dev}/kfd"))
    monkeypatch.setattr(jax_startup, "TPU_DEVICE_GLOBS", (f"{dev}/accel*", f"{dev}/vfio/[0-9]*"))
    monkeypatch.setattr(jax_startup, "PCI_DEVICES", str(pci))

    def add_pci(address: str, vendor: str, device: str) -> None:
        (pci / address).mkdir()
        (pci / address / "vendor").write_text(vendor + "\n")
        (pci / address / "device").write_text(device + "\n")

    return dev, add_pci


def test_accelerator_signs(fake_machine):
    dev, add_pci = fake_machine
    add_pci("0000:00:04.0", "0x1ae0", "0x0042")  # Google's gVNIC: not a TPU
    add_pci("0000:00:01.0", "0x8086", "0x0d57")
    (dev / "vfio" / "vfio").touch()  # the VFIO control node alone: no group
    assert jax_startup.accelerator_signs() == [] and jax_startup.noise_groups() == ["cuda", "tpu"]
    add_pci("0000:00:05.0", "0x10de", "0x2330")  # an NVIDIA function, no driver (no /dev/nvidia*)
    assert jax_startup.gpu_signs() == ["PCI 0000:00:05.0 (NVIDIA)"] and jax_startup.tpu_signs() == []
    assert jax_startup.noise_groups() == ["tpu"]
    (dev / "vfio" / "0").touch()
    assert jax_startup.tpu_signs() == [str(dev / "vfio" / "0")] and jax_startup.noise_groups() == []


@pytest.mark.parametrize("signs, before, after, applies", [
    ([], {}, {"JAX_PLATFORMS": "cpu"}, True),
    ([], {"JAX_PLATFORMS": "tpu"}, {"JAX_PLATFORMS": "tpu"}, True),  # the user's choice stays
    ([], {"JAX_PLATFORMS": ""}, {"JAX_PLATFORMS": ""}, True),
    (["/dev/nvidia0"], {}, {}, False),  # a GPU or TPU: nothing changes
    (["/dev/accel0"], {"JAX_PLATFORMS": "tpu"}, {"JAX_PLATFORMS": "tpu"}, False),
])
def test_cpu_only_where_there_is_no_accelerator(monkeypatch, signs, before, after, applies):
    monkeypatch.setattr(jax_startup, "accelerator_signs", lambda: list(signs))
    environ = dict(before)
    assert jax_startup.cpu_if_no_accelerator(environ) is applies
    assert environ == after


def test_libtpu_is_told_of_a_single_host_only_without_a_tpu(monkeypatch):
    monkeypatch.delenv("TPU_HOST_BOUNDS", raising=False)
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "mine")  # the user's: kept, and still there after
    monkeypatch.setattr(jax_startup, "tpu_signs", lambda: [])
    with jax_startup.quiet_plugin_start():
        assert os.environ["TPU_HOST_BOUNDS"] == "1,1,1" and os.environ["TPU_WORKER_HOSTNAMES"] == "mine"
    assert "TPU_HOST_BOUNDS" not in os.environ and os.environ["TPU_WORKER_HOSTNAMES"] == "mine"
    monkeypatch.setattr(jax_startup, "tpu_signs", lambda: ["/dev/accel0"])
    with jax_startup.quiet_plugin_start():
        assert "TPU_HOST_BOUNDS" not in os.environ


# ================================================================================================ JAX itself
STARTUP = """
import os, sys
{before}
import jax
print("platform", jax.devices()[0].platform, os.environ.get("JAX_PLATFORMS"))
from flaxzoo.train.tools.targets import compile_devices, parse_target
print("v5e-1", [d.device_kind for d in compile_devices(parse_target("v5e-1"))])
print("h100x1", [d.device_kind for d in compile_devices(parse_target("h100x1"))])
"""


@pytest.mark.skipif(not AOT, reason="the aot extra (libtpu, jax-cuda12-plugin) is not installed: nothing to silence")
@pytest.mark.skipif(bool(jax_startup.accelerator_signs()), reason="a GPU / TPU machine: jax_startup changes nothing")
def test_jax_starts_quietly_and_deviceless_compiles_still_work():
    env = {k: v for k, v in os.environ.items()
           if k != "JAX_PLATFORMS" and not k.startswith("TPU_") and k != "JAX_SKIP_CUDA_CONSTRAINTS_CHECK"}
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"  # another test process may hold libtpu
    quiet = STARTUP.format(before="from flaxzoo.models.jax_startup import quiet_jax_startup\nquiet_jax_startup()")
    proc = subprocess.run([sys.executable, "-c", quiet], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "platform cpu cpu" in proc.stdout
    assert "v5e-1 ['TPU v5 lite']" in proc.stdout and "h100x1 ['NVIDIA H100 80GB HBM3']" in proc.stdout
    assert not NOISE_MARKS.search(proc.stderr), proc.stderr
    # Without it, the same process is noisy (else jax_startup has become unnecessary: the check above proves nothing)
    plain = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], capture_output=True, text=True,
                           env=env, timeout=300)
    assert plain.returncode == 0, plain.stderr
    assert "Could not find cuda drivers" in plain.stderr and "TPU_WORKER_HOSTNAMES" in plain.stderr, plain.stderr


def test_the_entry_points_collect_garbage_less_often_and_importing_flaxzoo_does_not():
    """``fewer_gc_passes`` is a program's choice: the training and compile entry points make it, while importing
    flaxzoo's packages and those entry points' modules leaves Python's thresholds as they were."""
    script = textwrap.dedent("""
        import gc, json, sys
        before = gc.get_threshold()
        import flaxzoo.models, flaxzoo.train, flaxzoo.train.tools.compile, flaxzoo.train.__main__ as cli
        imported = gc.get_threshold()
        cli.main(["flaxzoo.train", "--help"])
        print(json.dumps([before, imported, gc.get_threshold()]))
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, imported, after = json.loads(proc.stdout.splitlines()[-1])
    assert imported == before != list(jax_startup.FEWER_GC_PASSES)
    assert after == list(jax_startup.FEWER_GC_PASSES)
