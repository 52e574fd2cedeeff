"""Position schemes: learned absolute, sinusoidal, rotary (two pair layouts) and ALiBi."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxzoo.models.layers.linear import logical_param, take_rows


def sinusoidal_table(num_positions: int, dim: int) -> np.ndarray:
    """Vaswani et al. (2017): ``PE[p, 2i] = sin(p / 10000^(2i/d))``, ``PE[p, 2i+1] = cos(p / 10000^(2i/d))``.

    Returns ``[num_positions, dim]`` float32.
    """
    position = np.arange(num_positions, dtype=np.float64)[:, None]
    inv_freq = 1.0 / 10000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    table = np.zeros((num_positions, dim), dtype=np.float64)
    table[:, 0::2] = np.sin(position * inv_freq)
    table[:, 1::2] = np.cos(position * inv_freq)
    return table.astype(np.float32)


class LearnedPositions(nnx.Module):
    """A trained ``[max_positions, hidden]`` table (BERT, GPT-2)."""

    def __init__(self, max_positions: int, hidden_size: int, *, rngs: nnx.Rngs, init_std: float = 0.02,
                 param_dtype=jnp.float32):
        self.embedding = logical_param(rngs, jax.nn.initializers.normal(init_std), (max_positions, hidden_size),
                                       (None, "embed"), param_dtype)

    def __call__(self, positions: jax.Array) -> jax.Array:
        """``[batch, seq]`` int → ``[batch, seq, hidden]``."""
        return take_rows(self.embedding[...], positions)  # outside the table: NaNs, not a clamped row


def rope_angles(positions: jax.Array, head_dim: int, theta: float) -> jax.Array:
    """Rotation angles ``position · theta^(-2i/head_dim)``: ``[batch, seq]`` → ``[batch, seq, head_dim // 2]`` fp32."""
    inv_freq = 1.0 / theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    return positions.astype(jnp.float32)[..., None] * inv_freq


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array, layout: str) -> jax.Array:
    """Rotate the first ``2 · cos.shape[-1]`` features of ``x: [batch, seq, heads, head_dim]`` by the angles whose
    ``cos`` / ``sin`` are ``[batch, seq, rotary_dim // 2]``; the rest pass unrotated (partial rotary, GPT-NeoX).

    ``layout="half"`` rotates the pairs ``(i, i + rotary_dim/2)`` (Hugging Face's rotate-half); ``"interleaved"``
    rotates ``(2i, 2i + 1)`` (Meta's original and GGUF). Both give scores that depend only on relative offsets.
    """
    rotary_dim = 2 * cos.shape[-1]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [batch, seq, 1, rotary_dim/2]
    x32 = x.astype(jnp.float32)
    rotated_part, passed = x32[..., :rotary_dim], x32[..., rotary_dim:]
    if layout == "half":
        first, second = jnp.split(rotated_part, 2, axis=-1)
        rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    elif layout == "interleaved":
        first, second = rotated_part[..., 0::2], rotated_part[..., 1::2]
        rotated = jnp.stack([first * cos - second * sin, second * cos + first * sin],
                            axis=-1).reshape(rotated_part.shape)
    else:
        raise ValueError(f"rope layout {layout!r}: expected 'half' or 'interleaved'")
    if passed.shape[-1]:
        rotated = jnp.concatenate([rotated, passed], axis=-1)
    return rotated.astype(x.dtype)


def apply_rope(x: jax.Array, positions: jax.Array, *, theta: float, layout: str) -> jax.Array:
    """Rotary position embedding (Su et al., 2021) of every feature of ``x: [batch, seq, heads, head_dim]`` at
    ``positions: [batch, seq]`` (see :func:`rotate`)."""
    angles = rope_angles(positions, x.shape[-1], theta)
    return rotate(x, jnp.cos(angles), jnp.sin(angles), layout)


def alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi head slopes (Press et al., 2022): the geometric sequence starting at ``2^(-8/n)`` with that ratio.

    For a head count that is not a power of two, the paper takes the slopes of the closest smaller power of two
    ``m`` and adds every other slope of ``2m`` heads. Returns ``[num_heads]`` float32.
    """
    def power_of_two_slopes(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if num_heads & (num_heads - 1) == 0:
        return np.asarray(power_of_two_slopes(num_heads), np.float32)
    closest = 2 ** math.floor(math.log2(num_heads))
    extra = power_of_two_slopes(2 * closest)[0::2][: num_heads - closest]
    return np.asarray(power_of_two_slopes(closest) + extra, np.float32)


def alibi_bias(num_heads: int, query_positions: jax.Array, key_positions: jax.Array, *, causal: bool) -> jax.Array:
    """Additive attention bias ``-slope · distance``: ``[batch, q]``, ``[batch, k]`` → ``[batch, heads, q, k]`` fp32.

    Causal models use ``q - k`` (future keys are masked anyway); encoders use ``|q - k|``.
    """
    distance = query_positions[:, :, None] - key_positions[:, None, :]
    distance = distance if causal else jnp.abs(distance)
    slopes = jnp.asarray(alibi_slopes(num_heads))
    return -slopes[None, :, None, None] * distance[:, None, :, :].astype(jnp.float32)
