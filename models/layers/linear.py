"""Parameters with logical sharding names, and the one dense projection every layer uses."""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

Axes = tuple[str | None, ...]


def logical_param(rngs: nnx.Rngs, init: jax.nn.initializers.Initializer, shape: Sequence[int], axes: Axes,
                  dtype: jnp.dtype = jnp.float32) -> nnx.Param:
    """A parameter tagged with logical axis names (e.g. ``("embed", "mlp")``).

    The names are only metadata here: ``train/sharding.py`` maps them to mesh axes. ``eager_sharding=False`` lets a
    model be built with no mesh in scope (a notebook, a test, ``eval_shape``).
    """
    if len(axes) != len(shape):
        raise ValueError(f"axes {axes} do not match shape {tuple(shape)}")
    return nnx.Param(init(next_key(rngs.params), tuple(shape), dtype), out_sharding=tuple(axes), eager_sharding=False)


def next_key(stream: nnx.RngStream) -> jax.Array:
    """``stream()``: the same key (``fold_in(key, count)``) and the same count afterwards, stored without the check
    flax's ``Variable.set_value`` makes on every assignment. That check reads ``value.sharding``, which on a tracer
    raises an error whose message walks every operation traced so far (jax 0.10): building a model under ``jit`` or
    ``eval_shape`` spent time quadratic in its parameter count there (1.9 s of a 25 s MiniLM fine-tune)."""
    count = stream.count.get_value()
    key = jax.random.fold_in(stream.key.get_value(), count)
    stream.count.set_raw_value(count + 1)
    return key


def take_rows(table: jax.Array, ids: jax.Array, limit: int | None = None) -> jax.Array:
    """``table[ids]`` along the first axis; ids outside ``[0, limit)`` (negative included) give rows of NaNs.

    ``limit`` defaults to the table's rows; a padded vocabulary table passes the real vocabulary size, so a padding
    row is never read as if it were a token."""
    rows = table.shape[0]
    limit = rows if limit is None else min(limit, rows)
    outside = (ids < 0) | (ids >= limit)
    return jnp.take(table, jnp.where(outside, rows, ids), axis=0, mode="fill", fill_value=jnp.nan)


def compute_copy(weight: jax.Array, dtype) -> jax.Array:
    """``weight`` in the compute ``dtype``, the same values as ``weight.astype(dtype)``.

    A float32 weight read as bfloat16 is rounded by ``reduce_precision`` first (bfloat16's exponent is float32's, so
    this is exactly the cast's rounding). Why: XLA moves a narrowing cast ahead of the layer scan's slice of the
    stacked weights, and then hoists it out of the loop, so that the whole ``[layers, ...]`` stack was held in
    bfloat16 for the whole step, beside the float32 one (0.33 GB per chip for Llama-3.2-1B on a v6e-8). A cast of a
    rounded value is left where it is written: in the loop, one layer at a time, before the layer's FSDP all-gather.
    """
    if weight.dtype == jnp.float32 and jnp.dtype(dtype) == jnp.bfloat16:
        weight = jax.lax.reduce_precision(weight, exponent_bits=8, mantissa_bits=7)
    return weight.astype(dtype)


class Dense(nnx.Module):
    """``y = x · kernel + bias``, contracting the last ``len(in_shape)`` axes of ``x``.

    The kernel has shape ``in_shape + out_shape`` so that heads stay a named axis:
    ``Dense((d,), (heads, head_dim))`` maps ``[batch, seq, d]`` to ``[batch, seq, heads, head_dim]``.
    """

    out_major = False  # True once decode_layout holds the kernel as an [out, in] matrix

    def __init__(self, in_shape: Sequence[int], out_shape: Sequence[int], *, axes: Axes, use_bias: bool,
                 rngs: nnx.Rngs, init_std: float = 0.02, dtype: jnp.dtype = jnp.float32,
                 param_dtype: jnp.dtype = jnp.float32):
        self.in_shape, self.out_shape = tuple(in_shape), tuple(out_shape)
        self.dtype = dtype
        self.kernel = logical_param(rngs, jax.nn.initializers.normal(init_std), self.in_shape + self.out_shape,
                                    axes, param_dtype)
        out_axes = tuple(axes[len(self.in_shape):])
        self.bias = (logical_param(rngs, jax.nn.initializers.zeros, self.out_shape, out_axes, param_dtype)
                     if use_bias else None)

    def __call__(self, x: jax.Array) -> jax.Array:
        n_in = len(self.in_shape)
        if x.shape[x.ndim - n_in:] != self.in_shape:
            raise ValueError(f"Dense expected trailing shape {self.in_shape}, got input shape {x.shape}")
        if self.out_major:
            y = self._out_major_product(x)
        else:
            contract = (tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in)))
            kernel = self.kernel
            # A float kernel is an nnx.Param; a quantised one (models/adapters/quantize.py: qwix's ``WithAux`` of an
            # int8 QArray) goes to dot_general whole, which qwix intercepts in a quantised Dense.
            kernel = compute_copy(kernel[...], self.dtype) if isinstance(kernel, nnx.Variable) else kernel
            # In the compute dtype: qwix's LoRA adds its float32 adapters' product inside dot_general, which would turn
            # a bfloat16 model's activations float32 from the first adapted layer on (and break lax.scan's carry type).
            y = jax.lax.dot_general(x.astype(self.dtype), kernel, (contract, ((), ()))).astype(self.dtype)
        if self.bias is not None:
            y = y + compute_copy(self.bias[...], self.dtype)
        return y

    def _out_major_product(self, x: jax.Array) -> jax.Array:
        """``x · W`` for a kernel held as :func:`decode_layout`'s ``[prod(out_shape), prod(in_shape)]`` matrix."""
        rows = x.reshape(*x.shape[:x.ndim - len(self.in_shape)], math.prod(self.in_shape)).astype(self.dtype)
        matrix = compute_copy(self.kernel[...], self.dtype)
        y = jax.lax.dot_general(rows, matrix, (((rows.ndim - 1,), (1,)), ((), ())))
        return y.reshape(*y.shape[:-1], *self.out_shape).astype(self.dtype)


def decode_layout(modules: Sequence[nnx.Module]) -> None:
    """Hold every plain float :class:`Dense` kernel in ``modules`` as a ``[prod(out_shape), prod(in_shape)]`` matrix
    that the layer reads transposed, the contracted axis innermost in memory; for a decode loop on the CPU, called on
    the modules of a model merged inside the traced function, before the loop (each kernel is relaid out once per
    call, not per step). XLA's CPU dots (YNNPACK) at a few rows run faster that way: 512 x 2048 at 8 rows 0.42 ms
    against 0.60 ms; ``t5_generate`` at batch 8 339 -> 414 new tokens/s, batch 1 117 -> 121 (2-core AMD EPYC,
    ``models/layers/DECODING.md``). Quantised kernels (qwix's) and layers with LoRA adapters (qwix reads their
    kernels' axes) are left as they are."""
    for module in modules:
        for _, node in nnx.iter_graph(module):
            if type(node) is not Dense or not isinstance(node.kernel, nnx.Param) or node.out_major:
                continue
            others = [name for name, value in vars(node).items() if isinstance(value, nnx.Variable)]
            if set(others) - {"kernel", "bias"}:
                continue  # adapters beside the kernel
            kernel = node.kernel[...]
            node.kernel.set_raw_value(kernel.reshape(math.prod(node.in_shape), math.prod(node.out_shape)).T)
            node.out_major = True
