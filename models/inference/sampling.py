"""Next-token sampling with traced parameters: temperature, top-k and nucleus (top-p) filtering.

``temperature``, ``top_k`` and ``top_p`` are ordinary (traceable) array arguments, not static ones, so one compiled
generation program serves every setting, and each may be a scalar or a ``[batch]`` array (one value per row).

Conventions (shared by :func:`sampling_probabilities` and :func:`sample_logits`):

* ``temperature == 0``: greedy, all mass on ``jnp.argmax(logits)`` (the first index on ties).
* ``top_k <= 0`` or ``top_k >= vocab``: no top-k filtering.
* ``top_p >= 1``: no nucleus filtering.
* Order as in Hugging Face: scale by the temperature, keep the ``top_k`` largest, then keep the smallest prefix of
  the sorted tokens whose (renormalised top-k) mass reaches ``top_p``; the first token is always kept.
* Tokens are ranked by their logits, ties broken by the lower token index (a stable sort), so top-k keeps exactly
  ``k`` tokens and the nucleus exactly the prefix it needs, even when logits tie at the boundary.
* Numerics: the row max is subtracted before dividing by the temperature, so tiny temperatures (1e-30) and huge
  logits (±1e30) neither overflow nor give NaN. ``-inf`` logits (banned tokens) get probability 0. ``+inf`` logits
  share the mass equally; a row whose logits are all ``-inf`` is uniform. NaN logits are not supported.

:func:`check_sampling_args` validates host-side Python values once, before they are passed into compiled code
(inside ``jit`` the values cannot be checked).
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp

__all__ = ["check_sampling_args", "sample_logits", "sampling_probabilities"]


def _per_row(value, dtype, batch: int, name: str) -> jax.Array:
    """``value`` (a scalar, 0-d or ``[batch]`` array, possibly traced) as a ``[batch]`` array of ``dtype``."""
    value = jnp.asarray(value)
    if value.ndim > 1 or (value.ndim == 1 and value.shape[0] != batch):
        raise ValueError(f"{name} has shape {value.shape}: expected a scalar or one value per row, shape ({batch},)")
    return jnp.broadcast_to(value.astype(dtype), (batch,))


def _scaled(logits: jax.Array, temperature: jax.Array) -> jax.Array:
    """``(logits - row max) / temperature`` with the row's maxima exactly 0: ``[batch, vocab]`` float32, every entry
    in ``[-inf, 0]``. Subtracting first keeps tiny temperatures finite; setting the maxima to 0 directly (rather than
    computing ``max - max``) keeps ``+inf`` rows and all ``-inf`` rows free of ``inf - inf`` NaNs."""
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    return jnp.where(logits == row_max, 0.0, (logits - row_max) / temperature[:, None])


def sampling_probabilities(logits: jax.Array, temperature=1.0, top_k=0, top_p=1.0) -> jax.Array:
    """The exact distribution :func:`sample_logits` draws from.

    Args:
      logits: ``[batch, vocab]`` float (any float dtype; computed in float32).
      temperature: scalar or ``[batch]``; ``0`` is greedy, otherwise ``> 0`` and finite.
      top_k: scalar or ``[batch]`` int; ``<= 0`` or ``>= vocab`` means no top-k filtering.
      top_p: scalar or ``[batch]``; ``>= 1`` means no nucleus filtering, otherwise in ``(0, 1)``.
      All three may be traced (``jit`` arguments): new values do not recompile. They are not validated here; see
      :func:`check_sampling_args`.

    Returns ``[batch, vocab]`` float32, each row summing to 1 (see the module docstring for the conventions).
    """
    logits = jnp.asarray(logits)
    if logits.ndim != 2 or logits.shape[1] == 0:
        raise ValueError(f"logits has shape {logits.shape}: expected [batch, vocab] with vocab >= 1")
    logits = logits.astype(jnp.float32)
    batch, vocab = logits.shape
    temperature = _per_row(temperature, jnp.float32, batch, "temperature")
    top_k = _per_row(top_k, jnp.int32, batch, "top_k")
    top_p = _per_row(top_p, jnp.float32, batch, "top_p")

    greedy = temperature == 0.0
    safe_temperature = jnp.where(greedy, 1.0, temperature)
    keep_k = jnp.where((top_k <= 0) | (top_k >= vocab), vocab, top_k)  # [batch], in [1, vocab]
    filters = ~greedy & ((keep_k < vocab) | (top_p < 1.0))

    def unfiltered(_):
        return jax.nn.softmax(_scaled(logits, safe_temperature), axis=-1)

    def filtered(_):
        # Ranking on the unscaled logits (the temperature is monotone, so the order is the same, and rounding in the
        # division cannot create new ties); lax.sort is stable and treats -0.0 == 0.0, so ties go to the lower index.
        order = jnp.broadcast_to(jnp.arange(vocab, dtype=jnp.int32), (batch, vocab))
        neg_sorted, order = jax.lax.sort((-logits, order), dimension=1, num_keys=1, is_stable=True)
        weights = jnp.exp(_scaled(-neg_sorted, safe_temperature))  # [batch, vocab], descending, first entry 1
        rank = jnp.arange(vocab, dtype=jnp.int32)[None, :]
        weights = jnp.where(rank < keep_k[:, None], weights, 0.0)
        probs = weights / jnp.sum(weights, axis=-1, keepdims=True)
        # Nucleus: keep a token while the mass strictly before it is below top_p (the first token: mass 0).
        cumulative = jnp.cumsum(probs, axis=-1)
        mass_before = jnp.concatenate([jnp.zeros((batch, 1), jnp.float32), cumulative[:, :-1]], axis=-1)
        keep_p = (mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0) | (rank == 0)
        probs = jnp.where(keep_p, probs, 0.0)
        probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
        rows = jnp.arange(batch)[:, None]
        return jnp.zeros_like(probs).at[rows, order].set(probs, unique_indices=True)

    # The sort is the costly part: skip it when no row filters (plain temperature sampling or greedy).
    probs = jax.lax.cond(jnp.any(filters), filtered, unfiltered, None)
    greedy_probs = jax.nn.one_hot(jnp.argmax(logits, axis=-1), vocab, dtype=jnp.float32)
    return jnp.where(greedy[:, None], greedy_probs, probs)


def sample_logits(logits: jax.Array, rng: jax.Array, temperature=1.0, top_k=0, top_p=1.0) -> jax.Array:
    """Draw one token per row from :func:`sampling_probabilities` ``(logits, temperature, top_k, top_p)``.

    Args:
      logits: ``[batch, vocab]`` float.
      rng: a ``jax.random`` key (typed or raw ``uint32[2]``), one for the whole batch.
      temperature, top_k, top_p: scalars or ``[batch]`` arrays, traceable; conventions as in the module docstring.

    Returns ``[batch]`` int32 token ids; rows with ``temperature == 0`` are exactly ``jnp.argmax(logits, -1)``.
    """
    probs = sampling_probabilities(logits, temperature, top_k, top_p)
    drawn = jax.random.categorical(rng, jnp.log(probs), axis=-1).astype(jnp.int32)  # log 0 = -inf: never drawn
    greedy = _per_row(temperature, jnp.float32, probs.shape[0], "temperature") == 0.0
    return jnp.where(greedy, jnp.argmax(jnp.asarray(logits), axis=-1).astype(jnp.int32), drawn)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_sampling_args(temperature, top_k, top_p, vocab_size: int) -> tuple[float, int, float]:
    """Validate host-side sampling settings (Python or numpy scalars) and normalise them.

    Args:
      temperature: a finite real ``>= 0`` (0 = greedy).
      top_k: None (off) or an int in ``[0, vocab_size]`` (0 = off).
      top_p: None (off) or a real in ``(0, 1]`` (1 = off).
      vocab_size: a positive int.

    Returns ``(temperature, top_k, top_p)`` as ``(float, int, float)``, with None turned into ``0`` / ``1.0``.
    Raises ValueError naming the first bad value and what was expected.
    """
    if not isinstance(vocab_size, numbers.Integral) or isinstance(vocab_size, bool) or vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size!r}: expected a positive integer")
    if not _is_real(temperature) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature={temperature!r}: expected a finite real number >= 0 (0 = greedy)")
    if top_k is None:
        top_k = 0
    if not isinstance(top_k, numbers.Integral) or isinstance(top_k, bool) or not 0 <= top_k <= vocab_size:
        raise ValueError(f"top_k={top_k!r}: expected None or an integer in [0, {vocab_size}] (0 or None = off)")
    if top_p is None:
        top_p = 1.0
    if not _is_real(top_p) or not 0.0 < top_p <= 1.0:  # NaN fails the comparison too
        raise ValueError(f"top_p={top_p!r}: expected None or a real number in (0, 1] (1 or None = off)")
    return float(temperature), int(top_k), float(top_p)
