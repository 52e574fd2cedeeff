"""The memory roofline of decoding: bytes a decode step must move per new token, and the memory bandwidth they are
moved at (measured on CPU, the data sheet's HBM figure on an accelerator).

A cached decode step of ``B`` rows reads every weight once (shared by the rows) and, per row, the keys and values of
the ``T`` tokens before it, and writes the new token's key and value:

    bytes per token = weights / B + 2 · L · kv_heads · head_dim · (T + 1) · bytes per cache element

``weights``: the bytes of every parameter the step reads, as stored (an int8 projection counts its int8 values and
scales): the token table counts whole when it is the tied LM head, only ``B`` rows otherwise; learned position and
token-type tables count one row per token. At batch 1 the weights dominate (SmolLM2-135M: 0.54 GB of float32
weights against 1.2 MB of cache per row at 128 tokens), so the best a step can do is ``weights / bandwidth``: the
fraction :func:`bandwidth_fraction` reports is ``bytes per token × tokens/s ÷ bandwidth``.

The bandwidth is the read rate of a matrix-vector product over a float32 matrix far larger than the caches (what a
batch-1 decode step does with every weight), on the default device, best of 5, measured in the process beside the
work (:func:`time_memory_bandwidth`): the host's DRAM on CPU, HBM on an accelerator. A STREAM-style scale
(``y = a · x``) measured 5.0 GB/s on the 2-core AMD EPYC, the matrix-vector product 29.9: XLA CPU runs the
elementwise loop on one thread, the library's product on both, so the scale understated what a decode step can
reach (SmolLM2-135M float32 decoded at 247 % of it). The accelerator compile (``--step generate``) uses the data
sheet's HBM bandwidth of the target instead.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxzoo.models.config import TransformerConfig

BANDWIDTH_MB = 512  # well past any cache (the CPU hosts here: 32-256 MB of L3; an H100: 50 MB of L2)


def time_memory_bandwidth(megabytes: int = BANDWIDTH_MB, repeats: int = 5) -> float:
    """Bytes/s read by ``W @ x`` over a float32 ``W`` of ``megabytes`` (``[rows, 2048]``, best of ``repeats``), on
    the default device."""
    if megabytes <= 0:
        raise ValueError(f"megabytes={megabytes}: expected a positive size")
    weights = jnp.ones((max(1, megabytes * 2 ** 20 // (4 * 2048)), 2048), jnp.float32)
    vector = jnp.ones((2048,), jnp.float32)
    product = jax.jit(lambda w, v: w @ v)
    product(weights, vector).block_until_ready()
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        product(weights, vector).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return weights.nbytes / best


def weight_bytes(model: nnx.Module, batch: int) -> int:
    """Bytes of ``model``'s parameters a decode step of ``batch`` rows reads (as stored: int8 where quantised): all of
    them, except lookup tables of which only the rows used count (an untied token table, learned positions and
    token types: ``batch`` rows each)."""
    config: TransformerConfig = model.config
    lookups = {"positions", "token_types"} | ({"tokens"} if not config.tie_word_embeddings else set())
    total = 0
    for path, leaf in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = leaf.get_value() if hasattr(leaf, "get_value") else leaf
        arrays = [a for a in jax.tree.leaves(value) if hasattr(a, "dtype")]
        nbytes = sum(int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize for a in arrays)
        names = {str(p) for p in path}
        if "embeddings" in names and names & lookups and arrays:
            rows = arrays[0].shape[0]
            nbytes = nbytes * min(batch, rows) // rows
        total += nbytes
    return total


def cache_bytes_per_token(config: TransformerConfig, context: float) -> float:
    """Bytes of keys and values one row reads (``context`` cached tokens) and writes (one token) in a decode step."""
    per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * jnp.dtype(config.dtype).itemsize
    return per_token * (context + 1)


def decode_bytes_per_token(model: nnx.Module, batch: int, context: float) -> dict[str, float]:
    """``{"weights", "cache", "total"}``: bytes per new token of a decode step of ``batch`` rows at a mean context of
    ``context`` tokens (the weights shared by the rows)."""
    if batch < 1:
        raise ValueError(f"batch={batch}: expected at least one row")
    weights = weight_bytes(model, batch) / batch
    cache = cache_bytes_per_token(model.config, context)
    return {"weights": weights, "cache": cache, "total": weights + cache}


def bandwidth_fraction(bytes_per_token: float, tokens_per_s: float, bandwidth: float) -> float:
    """The fraction of ``bandwidth`` (bytes/s) that moving ``bytes_per_token`` at ``tokens_per_s`` takes."""
    return bytes_per_token * tokens_per_s / bandwidth


def roofline_fields(model: nnx.Module, batch: int, context: float, tokens_per_s: float,
                    bandwidth: float, bandwidth_kind: str) -> dict[str, Any]:
    """The benchmark's roofline fields for one decode workload."""
    moved = decode_bytes_per_token(model, batch, context)
    return dict(bytes_per_token=moved["total"], weight_bytes_per_token=moved["weights"],
                cache_bytes_per_token=moved["cache"], bandwidth=bandwidth, bandwidth_kind=bandwidth_kind,
                bandwidth_fraction=bandwidth_fraction(moved["total"], tokens_per_s, bandwidth),
                roofline_tokens_per_s=bandwidth / moved["total"])
