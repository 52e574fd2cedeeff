"""Test setup: JAX's persistent compilation cache (shared by every test process) and small helpers."""

import os
import pathlib

import jax

CACHE_DIR = os.environ.get("FLAXZOO_JAX_CACHE", str(pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"))
os.environ.setdefault("FLAXZOO_JAX_CACHE", CACHE_DIR)
jax.config.update("jax_compilation_cache_dir", CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
