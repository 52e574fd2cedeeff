"""LayerNorm and RMSNorm (statistics in fp32)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.linear import logical_param


class LayerNorm(nnx.Module):
    """``(x - mean) / sqrt(var + eps) * scale + bias`` over the last axis ``[..., features]``; ``use_bias=False``
    drops the bias (ModernBERT's ``norm_bias=False``)."""

    def __init__(self, features: int, *, eps: float, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32,
                 use_bias: bool = True):
        self.eps, self.dtype = eps, dtype
        self.scale = logical_param(rngs, jax.nn.initializers.ones, (features,), ("norm",), param_dtype)
        self.bias = (logical_param(rngs, jax.nn.initializers.zeros, (features,), ("norm",), param_dtype)
                     if use_bias else None)

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = x32.mean(-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        y = y * self.scale[...]
        return (y if self.bias is None else y + self.bias[...]).astype(self.dtype)


class RMSNorm(nnx.Module):
    """``x / sqrt(mean(x²) + eps) * scale`` over the last axis (Zhang & Sennrich, 2019), as Llama uses it.

    ``unit_offset``: the stored scale is an offset from one, ``· (1 + scale)`` (Gemma; it starts at zero)."""

    def __init__(self, features: int, *, eps: float, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32,
                 unit_offset: bool = False):
        self.eps, self.dtype, self.unit_offset = eps, dtype, unit_offset
        init = jax.nn.initializers.zeros if unit_offset else jax.nn.initializers.ones
        self.scale = logical_param(rngs, init, (features,), ("norm",), param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.square(x32).mean(-1, keepdims=True) + self.eps)
        scale = self.scale[...].astype(jnp.float32)
        return (y * (1.0 + scale if self.unit_offset else scale)).astype(self.dtype)


def make_norm(config: TransformerConfig, rngs: nnx.Rngs, features: int | None = None) -> LayerNorm | RMSNorm:
    """The norm the config names, over ``features`` (default ``hidden_size``)."""
    common = dict(eps=config.norm_eps, rngs=rngs, dtype=jnp.dtype(config.dtype),
                  param_dtype=jnp.dtype(config.param_dtype))
    features = config.hidden_size if features is None else features
    if config.norm == "rmsnorm":
        return RMSNorm(features, unit_offset=config.norm_unit_offset, **common)
    return LayerNorm(features, use_bias=config.norm_bias, **common)
