"""``python -m flaxzoo.train.tools.bench.int8_forms``: which XLA form of an int8-weight matmul is fastest in a decode loop.

A chain of ``--layers`` × 6 projections of SmolLM2's shapes (576 → 1536 → 576, the weights stored int8 with one
absmax scale per output column) runs ``--steps`` times inside a ``lax.fori_loop``, the way the decode loop of
``models/inference/generate.py`` reads its weights; each form is timed beside the float32 dot in the same process. The forms:

- ``float32``: the float weights, ``x @ w`` (the reference: 4 bytes an entry).
- ``convert+dot``: ``(x @ q.astype(float32)) * scale`` (what qwix's weight-only int8 compiles to).
- ``convert+dot, in the loop``: the same behind ``lax.optimization_barrier`` in the loop body, against XLA's
  loop-invariant code motion (XLA CPU removes barriers before its loop passes, so this changes nothing on CPU).
- ``mixed dot``: ``dot_general(x, q, preferred_element_type=float32)`` (XLA inserts the conversion).
- ``multiply-reduce``: ``sum(x[:, :, None] * q, axis=1) * scale``, one fusion that reads int8.
- ``int8 x int8``: the activations quantised per row too, an s8 × s8 → s32 dot (changes the results).
- ``bfloat16``: the weights stored bfloat16 (2 bytes an entry, what a hoisted int8 → bfloat16 conversion would leave
  the loop: int8 values are exact in bfloat16) and a bfloat16 × bfloat16 → float32 dot (rounds the activations).

Prints ms per step (the median of ``--rounds`` rounds, the forms alternated within each), the float32-equivalent
GB/s (4 bytes an entry over the step's time) and the speed relative to float32; ``models/QUANTIZE.md``
has the table for the 2-core AMD EPYC and what it means for int8 decoding on CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

Weights = tuple[jax.Array, jax.Array]  # int8 [in, out], float32 scale [out]
WEIGHT_KINDS = ("float32", "bfloat16", "int8")


def quantize_columns(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric absmax int8 per output column: ``(q int8 [in, out], scale float32 [out])``, ``w ≈ q · scale``."""
    scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / 127.0
    return np.round(w / scale).astype(np.int8), scale.astype(np.float32)


def _convert_dot(x: jax.Array, qs: Weights) -> jax.Array:
    return (x @ qs[0].astype(jnp.float32)) * qs[1]


def _mixed_dot(x: jax.Array, qs: Weights) -> jax.Array:
    return jax.lax.dot_general(x, qs[0], (((x.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.float32) * qs[1]


def _multiply_reduce(x: jax.Array, qs: Weights) -> jax.Array:
    return jnp.sum(x[..., :, None] * qs[0].astype(jnp.float32), axis=-2) * qs[1]


def _int8_int8(x: jax.Array, qs: Weights) -> jax.Array:
    x_scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 127.0 + 1e-12
    x_q = jnp.round(x / x_scale).astype(jnp.int8)
    product = jax.lax.dot_general(x_q, qs[0], (((x.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
    return product.astype(jnp.float32) * x_scale * qs[1]


def _bfloat16_dot(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.dot(x.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)


# name: (matmul, the weights it reads (one of WEIGHT_KINDS), behind a barrier in the loop body)
FORMS: dict[str, tuple[Callable, str, bool]] = {
    "float32": (lambda x, w: x @ w, "float32", False),
    "convert+dot": (_convert_dot, "int8", False),
    "convert+dot, in the loop": (_convert_dot, "int8", True),
    "mixed dot": (_mixed_dot, "int8", True),
    "multiply-reduce": (_multiply_reduce, "int8", True),
    "int8 x int8": (_int8_int8, "int8", True),
    "bfloat16": (_bfloat16_dot, "bfloat16", False),
}


def decode_like(matmul: Callable, steps: int, barrier: bool) -> Callable:
    """``x`` through every weight, ``steps`` times in a ``fori_loop`` (tanh between projections), jitted."""

    @jax.jit
    def run(x: jax.Array, weights: list) -> jax.Array:
        def body(_, x):
            ws = jax.lax.optimization_barrier(weights) if barrier else weights
            for w in ws:
                x = jnp.tanh(matmul(x, w))
            return x

        return jax.lax.fori_loop(0, steps, body, x)

    return run


def make_weights(layers: int, hidden: int, mlp: int, seed: int = 0,
                 std: float = 0.02) -> tuple[list[np.ndarray], list[Weights]]:
    """``layers`` × 6 projections alternating ``[hidden, mlp]`` and ``[mlp, hidden]``, normal with ``std``: float32
    and int8 versions."""
    rng = np.random.default_rng(seed)
    floats = [(rng.standard_normal((hidden, mlp) if j % 2 == 0 else (mlp, hidden)) * std).astype(np.float32)
              for j in range(6 * layers)]
    return floats, [tuple(jnp.asarray(a) for a in quantize_columns(w)) for w in floats]


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m flaxzoo.train.tools.bench.int8_forms",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--mlp", type=int, default=1536)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per form and round (median)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over all forms (median reported)")
    args = parser.parse_args(argv)
    for flag in ("batch", "layers", "hidden", "mlp", "steps", "repeats", "rounds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} {getattr(args, flag)}: expected a positive integer")
    floats, int8 = make_weights(args.layers, args.hidden, args.mlp)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((args.batch, args.hidden)).astype(np.float32))
    entries = sum(w.size for w in floats)
    stored = dict(float32=[jnp.asarray(w) for w in floats], bfloat16=[jnp.asarray(w, jnp.bfloat16) for w in floats],
                  int8=int8)
    runs = {}
    for name, (matmul, kind, barrier) in FORMS.items():  # compile every form first
        weights = stored[kind]
        runs[name] = (decode_like(matmul, args.steps, barrier), weights)
        runs[name][0](x, weights).block_until_ready()
    per_round: dict[str, list[float]] = {name: [] for name in FORMS}
    for _ in range(args.rounds):  # the forms alternate within each round: the host's drift hits them alike
        for name, (run, weights) in runs.items():
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                run(x, weights).block_until_ready()
                times.append(time.perf_counter() - start)
            per_round[name].append(statistics.median(times) / args.steps)
    results = {name: statistics.median(values) for name, values in per_round.items()}
    for name, step_s in results.items():
        print(f"batch {args.batch} {name:26s} {1e3 * step_s:8.2f} ms/step   "
              f"{4 * entries / step_s / 1e9:6.1f} GB/s float32-equivalent   "
              f"({results['float32'] / step_s:.2f}x float32; rounds "
              f"{', '.join(f'{1e3 * t:.1f}' for t in per_round[name])} ms)", flush=True)
    return results


if __name__ == "__main__":
    main()
