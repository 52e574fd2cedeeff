"""JAX's start-up without the accelerator plugins' noise on a machine that has no accelerator.

Why: with the ``aot`` extra installed (libtpu, JAX's CUDA 12 plugin), every process that imports JAX on a CPU machine
printed, before any output of its own:

- ``cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.`` (each preceded by
  ``WARNING: All log messages before absl::InitializeLog() is called are written to STDERR``): once per CUDA plugin
  extension jaxlib loads at ``import jax`` (three), once more when JAX registers the plugin. C++ absl logging on file
  descriptor 2: neither ``TF_CPP_MIN_LOG_LEVEL`` nor Python's ``sys.stderr`` reaches it;
- the traceback ``Jax plugin configuration error: Exception when calling jax_plugins.xla_cuda12.initialize()`` ...
  ``RuntimeError: Unable to load CUDA. Is it installed?`` when JAX starts its backends and tries CUDA;
- libtpu's ``Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type ...``
  and ``E0000 ... common_lib.cc:554] INVALID_ARGUMENT: Error: unexpected worker hostname ... TPU_WORKER_HOSTNAMES``
  with its ``=== Source Location Trace: ===``, when JAX starts its backends and tries TPU, and when a deviceless TPU
  compile loads libtpu (``flaxzoo.train.tools.targets``).

What :func:`quiet_jax_startup` does, only while JAX is not imported yet and only on a machine with no sign of a GPU or
TPU (:func:`accelerator_signs`; any sign: it changes nothing, and none of those lines is dropped there, where they
may be the clue to a broken driver):

1. ``JAX_PLATFORMS=cpu`` when the user has not set ``JAX_PLATFORMS`` (what JAX ends up with anyway): JAX then neither
   validates the CUDA plugin (no traceback) nor starts libtpu as a backend (no libtpu lines at start). Deviceless
   compiles still work: ``jax.experimental.topologies`` loads libtpu itself, and the CUDA plugin registers without its
   CUDA check.
2. ``import jax`` and JAX's plugin registration (which loads the CUDA plugin's PJRT library: the fourth cudart line;
   it would otherwise happen at the first device use) with file descriptor 2 read by a small filter process
   (:func:`filtered_stderr`) that writes back every line but those of an explicit list (:class:`StartupNoise`).
   Everything else, real errors included, is printed, in order. A separate process rather than a thread: a
   ``F...`` fatal log line followed by ``abort()`` still gets out, and C code that writes with the GIL held cannot
   block on a full pipe.

:func:`quiet_plugin_start` does the same around a deviceless plugin's start (``flaxzoo.train.tools.targets.devices``), and
tells libtpu, only for that start and only where the machine has no TPU, that this machine is a single host
(``TPU_WORKER_HOSTNAMES=localhost``, ``TPU_HOST_BOUNDS=1,1,1``, unless set): libtpu then has nothing to complain
about (it reads them once, when it loads; the compile-only topology, process indices included, is unchanged).

``flaxzoo.models`` calls :func:`quiet_jax_startup` first thing (its package imports JAX), so every entry point that
imports anything of flaxzoo's is covered; entry points and ``tests/conftest.py`` call it at their top as well, before
anything else can import JAX. A process that imported JAX before flaxzoo is left as it is.

Run as a script (``python jax_startup.py GROUP ...``) this file is that filter: standard input to standard output.
"""

from __future__ import annotations

import contextlib
import gc
import glob
import os
import re
import subprocess
import sys
from typing import Iterable, Iterator, MutableMapping

# ================================================================================================ accelerator signs
# Device nodes: NVIDIA's (nvidia0.., nvidiactl, nvidia-uvm), WSL2's GPU, ROCm's; TPU VMs' (/dev/accel* on v2-v5p,
# VFIO groups on v5e / v6e and later).
GPU_DEVICE_GLOBS = ("/dev/nvidia*", "/dev/dxg", "/dev/kfd")
TPU_DEVICE_GLOBS = ("/dev/accel*", "/dev/vfio/[0-9]*")
NVIDIA_PCI_VENDOR = "0x10de"  # any NVIDIA PCI function: a GPU without its driver (where the cudart line is the clue)
GOOGLE_PCI_VENDOR = "0x1ae0"
# Google's TPU PCI device ids (jax._src.hardware_utils); Google's other PCI devices (gVNIC) are not TPUs.
TPU_PCI_DEVICES = frozenset({"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"})
PCI_DEVICES = "/sys/bus/pci/devices"


def _pci_devices() -> Iterator[tuple[str, str, str]]:
    """``(address, vendor id, device id)`` of each PCI function (none where sysfs is not there)."""
    for path in sorted(glob.glob(os.path.join(PCI_DEVICES, "*"))):
        try:
            with open(os.path.join(path, "vendor")) as vendor, open(os.path.join(path, "device")) as device:
                yield os.path.basename(path), vendor.read().strip().lower(), device.read().strip().lower()
        except OSError:
            continue


def gpu_signs() -> list[str]:
    """What says this machine has a GPU: its device nodes, an NVIDIA PCI function."""
    found = [p for pattern in GPU_DEVICE_GLOBS for p in sorted(glob.glob(pattern))]
    return found + [f"PCI {address} (NVIDIA)" for address, vendor, _ in _pci_devices() if vendor == NVIDIA_PCI_VENDOR]


def tpu_signs() -> list[str]:
    """What says this machine has a TPU: its device nodes (or any VFIO group), a TPU PCI function."""
    found = [p for pattern in TPU_DEVICE_GLOBS for p in sorted(glob.glob(pattern))]
    return found + [f"PCI {address} (TPU {device})" for address, vendor, device in _pci_devices()
                    if vendor == GOOGLE_PCI_VENDOR and device in TPU_PCI_DEVICES]


def accelerator_signs() -> list[str]:
    """Every sign of a GPU or TPU on this machine (empty: a CPU-only machine)."""
    return gpu_signs() + tpu_signs()


# ====================================================================================================== the filter
# absl's "I0000 00:00:1796460198.541314    5427 " (before absl::InitializeLog: seconds since the epoch) or glog's
# "I0412 13:05:07.123456  5427 ".
_ABSL_PREFIX = r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ "
PREFACES = (  # printed once before an absl / glog logger's first line: dropped with that line when it is noise
    re.compile(r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"),
    re.compile(r"WARNING: Logging before InitGoogle\(\) is written to STDERR"),
)
NOISE = {
    "cuda": (
        re.compile(_ABSL_PREFIX + r"cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will not "
                                  r"be used\."),
    ),
    "tpu": (
        re.compile(r"Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator "
                   r"type, please set env var `TPU_ACCELERATOR_TYPE` manually, otherwise libtpu\.so may not properly "
                   r"initialize\."),
        re.compile(_ABSL_PREFIX + r"common_lib\.cc:\d+\] INVALID_ARGUMENT: Error: unexpected worker hostname 'WARNING: "
                                  r"could not determine TPU worker hostnames or IP addresses' from env var "
                                  r"TPU_WORKER_HOSTNAMES\. .*"),
    ),
}
# What libtpu prints after an error line: its source locations. Dropped only right after a dropped line.
TRACE_HEADER = re.compile(r"=== Source Location Trace: ===\s*")
TRACE_LINE = re.compile(r"[\w./+-]+\.(cc|h):\d+\s*")


class StartupNoise:
    """A line filter: :meth:`feed` one line (bytes, with its newline) at a time, write out what it returns;
    :meth:`finish` at the end. Drops the lines of ``NOISE[group]`` for ``groups`` (with the absl / glog preface just
    before one, and the source-location trace just after one); returns every other line, in order. A preface is
    held until the line after it says whether it goes."""

    def __init__(self, groups: Iterable[str]) -> None:
        unknown = sorted(set(groups) - set(NOISE))
        if unknown:
            raise ValueError(f"unknown noise groups {unknown}; expected some of {sorted(NOISE)}")
        self.patterns = tuple(p for group in sorted(set(groups)) for p in NOISE[group])
        self.held: list[bytes] = []
        self.after_noise = False  # the last line was dropped: a trace header may follow
        self.in_trace = False

    def feed(self, line: bytes) -> list[bytes]:
        text = line.decode("utf-8", "replace").rstrip("\r\n")
        if self.after_noise and TRACE_HEADER.fullmatch(text):
            self.after_noise, self.in_trace = False, True
            return []
        if self.in_trace and TRACE_LINE.fullmatch(text):
            return []
        self.after_noise = self.in_trace = False
        if any(p.fullmatch(text) for p in PREFACES):
            self.held.append(line)
            return []
        if any(p.fullmatch(text) for p in self.patterns):
            self.held = []
            self.after_noise = True
            return []
        out, self.held = self.held + [line], []
        return out

    def finish(self) -> list[bytes]:
        out, self.held = self.held, []
        return out

    def filter(self, text: bytes) -> bytes:
        """All of ``text`` at once (lines split after each ``\\n``; a last line without one is kept as it is)."""
        out = [kept for line in text.splitlines(keepends=True) for kept in self.feed(line)]
        return b"".join(out + self.finish())


def _write_all(fd: int, data: bytes) -> bool:
    """Write ``data`` to ``fd``; False once the other end is gone."""
    while data:
        try:
            data = data[os.write(fd, data):]
        except OSError:
            return False
    return True


def run_filter(groups: Iterable[str], source: int = 0, sink: int = 1) -> None:
    """Copy ``source`` to ``sink`` through :class:`StartupNoise` until end of file (the filter process's loop). Reads
    on after ``sink`` is gone, so that the writers never block."""
    noise, pending, writable = StartupNoise(groups), b"", True
    while True:
        chunk = os.read(source, 65536)
        if not chunk:
            break
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        out = b"".join(kept for line in lines for kept in noise.feed(line + b"\n"))
        if out and writable:
            writable = _write_all(sink, out)
    tail = (noise.feed(pending) if pending else []) + noise.finish()
    if tail and writable:
        _write_all(sink, b"".join(tail))


_LINGERING: list[subprocess.Popen] = []  # filter processes still draining a pipe that a child process holds


@contextlib.contextmanager
def filtered_stderr(groups: Iterable[str], *, drain_timeout_s: float = 10.0) -> Iterator[None]:
    """File descriptor 2 (C and Python writes alike) goes through a filter process that drops the ``groups``' noise
    (:class:`StartupNoise`) and writes the rest to the real standard error as it comes. On leaving, waits up to
    ``drain_timeout_s`` for the filter to finish, so later output stays after it; a child process started inside
    keeps the pipe open after that, and the filter forwards its lines until it ends. Filters nothing where no filter
    process can be started (no ``sys.executable``, this file inside an archive, no file descriptor 2)."""
    groups = sorted(set(groups))
    if not groups or not sys.executable or os.name != "posix" or not os.path.isfile(__file__):
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:  # no standard error at all
        yield
        return
    read_end, write_end = os.pipe()
    try:
        # -I -S: no site-packages, environment or script folder (models/ holds modules named like stdlib ones);
        # its own session: a Ctrl-C meant for this process must not kill the filter before it has written out.
        proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), *groups], stdin=read_end,
                                stdout=saved, stderr=saved, start_new_session=True)
    except OSError:
        for fd in (read_end, write_end, saved):
            os.close(fd)
        yield
        return
    os.close(read_end)
    _flush_stderr()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        _flush_stderr()
        os.dup2(saved, 2)  # the last write end of the pipe here: the filter reads to its end and exits
        os.close(saved)
        try:
            proc.wait(timeout=drain_timeout_s)
        except subprocess.TimeoutExpired:
            _LINGERING.append(proc)


def _flush_stderr() -> None:
    with contextlib.suppress(Exception):
        sys.stderr.flush()


def noise_groups() -> list[str]:
    """The noise groups that are harmless on this machine: ``cuda`` without a GPU sign, ``tpu`` without a TPU sign."""
    return (["cuda"] if not gpu_signs() else []) + (["tpu"] if not tpu_signs() else [])


# ================================================================================================ the start-up
def quiet_jax_startup() -> None:
    """Import JAX, on a machine without a GPU or TPU, without the plugins' start-up noise (the module docstring):
    ``JAX_PLATFORMS=cpu`` unless the user set ``JAX_PLATFORMS`` (:func:`cpu_if_no_accelerator`), then ``import jax``
    and JAX's plugin registration with the known harmless lines filtered out of standard error. Call it before
    anything imports JAX; where JAX is already imported, or the machine shows a GPU or TPU, it does nothing."""
    if "jax" in sys.modules or not cpu_if_no_accelerator():
        return
    with filtered_stderr(noise_groups()):
        import jax  # noqa: F401

        if os.environ["JAX_PLATFORMS"] == "cpu":
            _register_plugins()


def cpu_if_no_accelerator(environ: MutableMapping[str, str] | None = None) -> bool:
    """On a machine with no sign of a GPU or TPU (:func:`accelerator_signs`): ``JAX_PLATFORMS=cpu`` in ``environ``
    (default ``os.environ``) unless it holds ``JAX_PLATFORMS`` already (any value, empty included: the user's), and
    True. Elsewhere False, and nothing changed."""
    if accelerator_signs():
        return False
    (os.environ if environ is None else environ).setdefault("JAX_PLATFORMS", "cpu")
    return True


def _register_plugins() -> None:
    """JAX's plugin discovery now, inside the filter, instead of at the first device use (it registers the CUDA plugin,
    which loads its PJRT library: one more cudart line). Registering starts no backend (``jax.distributed.initialize``
    may still come first). JAX keeps it private: a JAX without it leaves discovery where it was, and so does an error
    (a malformed ``PJRT_NAMES_AND_LIBRARY_PATHS``), which JAX then raises at the first device use, as it would."""
    try:
        from jax._src.xla_bridge import _discover_and_register_pjrt_plugins as discover
    except ImportError:
        return
    with contextlib.suppress(Exception):
        discover()


# Where the machine has no TPU, what libtpu asks of the environment when it loads (it reads them once): one host,
# this one. Without them it prints the host-bounds and worker-hostname lines of the module docstring.
LIBTPU_SINGLE_HOST = {"TPU_WORKER_HOSTNAMES": "localhost", "TPU_HOST_BOUNDS": "1,1,1"}


@contextlib.contextmanager
def quiet_plugin_start() -> Iterator[None]:
    """Around the start of a deviceless plugin (libtpu for a TPU topology, JAX's CUDA plugin for a GPU one): on a
    machine without a TPU, :data:`LIBTPU_SINGLE_HOST` in the environment (each unless set; restored on leaving), and
    the known harmless lines filtered out of standard error (:func:`filtered_stderr`)."""
    added = {}
    if not tpu_signs():
        added = {k: v for k, v in LIBTPU_SINGLE_HOST.items() if k not in os.environ}
    os.environ.update(added)
    try:
        with filtered_stderr(noise_groups()):
            yield
    finally:
        for key in added:
            os.environ.pop(key, None)


# ====================================================================================== Python's garbage collector
# gc.set_threshold's (gen0 allocations, gen0 passes per gen1 pass, gen1 passes per gen2 pass); Python's are (700, 10, 10).
FEWER_GC_PASSES = (10_000, 20, 100)


def fewer_gc_passes() -> None:
    """Python's cyclic garbage collector less often, for a whole program: tracing and compiling JAX programs allocate
    millions of short-lived objects, and with Python's thresholds every tenth gen1 pass walks the whole heap (JAX,
    flax and, in the tests, torch and transformers: 0.3 s per pass). Measured (2-core AMD EPYC): 9.1 s of 73 s in the
    collector -> 3.1 s over ``tests/test_train_step.py`` + ``test_every_encoder.py`` + ``test_hub.py``, same peak
    memory; a short ``python -m flaxzoo.train`` run 7.3 s -> 6.8 s. For entry points (a program's choice), not for
    library imports."""
    gc.set_threshold(*FEWER_GC_PASSES)


if __name__ == "__main__":  # the filter process of filtered_stderr
    run_filter(sys.argv[1:])
