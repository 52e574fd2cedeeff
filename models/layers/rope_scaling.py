"""RoPE frequency scaling: the ``rope_scaling`` / ``rope_parameters`` variants of Hugging Face decoder configs.

Every variant changes only the inverse frequencies ``inv_freq[i]`` (``i < rotary_dim / 2``) that multiply the
positions, plus (YaRN, LongRoPE) a constant *attention factor* that multiplies ``cos`` and ``sin``:

* ``"default"``: ``inv_freq[i] = theta^(-2i / rotary_dim)`` (Su et al., 2021).
* ``"linear"``: position interpolation (Chen et al., 2023), ``inv_freq / factor``.
* ``"dynamic"``: dynamic NTK-aware scaling (bloc97 / emozilla, 2023): for a sequence of length
  ``L > max_position_embeddings = M`` the base becomes ``theta · (factor·L/M - (factor - 1))^(d / (d - 2))``.
* ``"llama3"``: Llama 3.1's wavelength bands (Meta, 2024): wavelengths below ``original / high_freq_factor`` are kept,
  those above ``original / low_freq_factor`` divided by ``factor``, those between blended with
  ``s = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)``.
* ``"yarn"``: YaRN (Peng et al., 2023): a ramp over the dimensions between the correction dims of ``beta_fast`` and
  ``beta_slow`` rotations blends the original and the interpolated (``/ factor``) frequencies; attention factor
  ``0.1 · ln(factor) + 1`` (eq. 21) or the ratio of the ``mscale`` / ``mscale_all_dim`` versions (DeepSeek-V2).
* ``"longrope"``: LongRoPE (Ding et al., 2024; Phi-3): ``inv_freq[i] / ext[i]`` with ``ext = short_factor`` or
  ``long_factor``; attention factor ``sqrt(1 + ln(factor) / ln(original))``.

Exponents ``2i / rotary_dim`` are rounded to float32 first, as the reference implementations (Meta's, Hugging
Face's) compute them; the rest is float64 and the frequencies are returned as float32.

**Normalised form.** :func:`normalize_rope_scaling` turns a config's dict into a sorted tuple of ``(key, value)``
pairs (``None`` for unscaled RoPE) that a frozen dataclass can hold and that ``jax.jit`` can take as a static
argument. Every other function here takes either that tuple or a raw dict (normalised on the way in).

**Length-dependent variants.** ``"dynamic"`` and ``"longrope"`` depend on the current sequence length ``L``, taken
as Hugging Face does: ``max(positions) + 1`` of the call (the whole batch). ``"longrope"`` uses ``short_factor`` for
``L <= original_max_position_embeddings`` and ``long_factor`` above; :func:`rope_frequencies` takes ``seq_len`` as a
Python int, :func:`longrope_inv_freq` and :func:`rope_angles_scaled` select under ``jit``. Either way the choice is
made per call: a cached step past the original length rotates its new tokens with the long factors, not the keys
already in a KV cache, so ``flaxzoo.models.inference.generate`` recomputes the cache at the step that crosses it (as Hugging
Face's Phi-3 ``generate`` drops its cache there); passing ``seq_len`` (e.g. the cache length) to
:func:`rope_angles_scaled` fixes one set for a whole generation instead.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# A normalised scaling: sorted ``(key, value)`` pairs, lists as tuples; ``None`` means unscaled RoPE.
RopeScaling = tuple[tuple[str, Any], ...]

ROPE_TYPES = ("default", "dynamic", "linear", "llama3", "longrope", "yarn")

# Per type: (required keys, optional keys), beyond "rope_type".
_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "default": (frozenset(), frozenset()),
    "linear": (frozenset({"factor"}), frozenset()),
    "dynamic": (frozenset({"factor"}), frozenset()),
    "llama3": (frozenset({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}),
               frozenset()),
    "yarn": (frozenset({"factor", "original_max_position_embeddings"}),
             frozenset({"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"})),
    "longrope": (frozenset({"short_factor", "long_factor", "original_max_position_embeddings"}),
                 frozenset({"factor", "attention_factor"})),
}
# Keys that are accepted and dropped: the caller owns theta and the rotary dim (``rope_theta`` and
# ``partial_rotary_factor`` sit in v5's ``rope_parameters`` and at the top level of config.json), and YaRN-Llama-2's
# ``finetuned`` flag changes nothing in the frequencies.
DROPPED_KEYS = frozenset({"rope_theta", "partial_rotary_factor", "finetuned"})
_ORIGINAL = "original_max_position_embeddings"


def _fail(rope_type: str | None, key: str, value: Any, expected: str) -> ValueError:
    where = "rope_scaling" if rope_type is None else f"rope_scaling (rope_type {rope_type!r})"
    return ValueError(f"{where}: {key!r} = {value!r}: expected {expected}")


def _number(rope_type: str | None, key: str, value: Any, *, positive: bool = True) -> float:
    """A finite real number (``> 0`` when ``positive``, else ``>= 0``) as a Python float."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if ok and math.isfinite(value) and (value > 0 if positive else value >= 0):
        return float(value)
    raise _fail(rope_type, key, value, "a finite number " + ("> 0" if positive else ">= 0"))


def _length(rope_type: str | None, key: str, value: Any) -> int:
    """A positive integer (an integral float from a JSON file is accepted)."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if ok and math.isfinite(value) and float(value).is_integer() and value > 0:
        return int(value)
    raise _fail(rope_type, key, value, "a positive integer")


def _factor_list(key: str, value: Any, rotary_dim: int | None) -> tuple[float, ...]:
    if not isinstance(value, (list, tuple, np.ndarray)) or len(value) == 0:
        raise _fail("longrope", key, value, "a non-empty list of numbers > 0")
    factors = tuple(_number("longrope", f"{key}[{i}]", v) for i, v in enumerate(value))
    if rotary_dim is not None and len(factors) != rotary_dim // 2:
        raise ValueError(f"rope_scaling (rope_type 'longrope'): {key!r} has {len(factors)} entries: expected "
                         f"rotary_dim // 2 = {rotary_dim // 2} (rotary_dim {rotary_dim})")
    return factors


def _check_rotary_dim(rotary_dim: int) -> None:
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, (int, np.integer)) or rotary_dim <= 0 \
            or rotary_dim % 2:
        raise ValueError(f"rotary_dim = {rotary_dim!r}: expected a positive even integer")


def normalize_rope_scaling(raw: Mapping[str, Any] | RopeScaling | None, *, max_position_embeddings: int,
                           rotary_dim: int | None = None,
                           original_max_position_embeddings: int | None = None) -> RopeScaling | None:
    """Validates a Hugging Face ``rope_scaling`` (config.json) or ``rope_parameters`` (transformers v5) dict.

    Returns the sorted ``(key, value)`` pairs, ``("rope_type", ...)`` included, numbers as ``float`` (lengths as
    ``int``, ``truncate`` as ``bool``), lists as tuples; ``None`` for unscaled RoPE (``raw`` None or empty, or
    ``rope_type`` ``"default"``). Idempotent: a normalised tuple comes back unchanged.

    * ``"type"`` (the old key) is read as ``"rope_type"``; both present and different is an error.
    * ``rope_theta``, ``partial_rotary_factor`` and ``finetuned`` are dropped (:data:`DROPPED_KEYS`): theta and the
      rotary dim are the caller's own arguments. A key set to ``None`` counts as absent.
    * Any other key that the type does not read is refused, so that a misspelt key cannot silently leave the
      frequencies unscaled (transformers only warns).
    * ``original_max_position_embeddings``: a config's top-level value (Phi-3 writes it there) takes priority over
      the dict's, as in transformers; required for ``llama3``, ``yarn`` and ``longrope`` (one of the two places).
    * ``factor`` is required except for ``longrope``, where it defaults to ``max_position_embeddings / original``.
    * ``rotary_dim``: when given, the length of LongRoPE's factors is checked against ``rotary_dim // 2`` (
      :func:`rope_frequencies` always checks it).

    Raises ``ValueError`` naming the key, its value and what was expected.
    """
    _length(None, "max_position_embeddings", max_position_embeddings)
    if rotary_dim is not None:
        _check_rotary_dim(rotary_dim)
    if raw is None:
        return None
    params = dict(raw)
    if not params:
        return None
    rope_type = params.pop("rope_type", None)
    old_type = params.pop("type", None)
    if rope_type is not None and old_type is not None and rope_type != old_type:
        raise ValueError(f"rope_scaling: 'rope_type' = {rope_type!r} and 'type' = {old_type!r}: expected one value")
    rope_type = rope_type if rope_type is not None else (old_type if old_type is not None else "default")
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_scaling: 'rope_type' = {rope_type!r}: expected one of {ROPE_TYPES}")
    required, optional = _KEYS[rope_type]
    params = {k: v for k, v in params.items() if v is not None and k not in DROPPED_KEYS}
    if original_max_position_embeddings is not None and _ORIGINAL in required:
        params[_ORIGINAL] = original_max_position_embeddings
    for key in sorted(params):
        if key not in required | optional:
            raise _fail(rope_type, key, params[key], f"only the keys {sorted(required | optional)} (plus "
                        f"{sorted(DROPPED_KEYS)}, dropped)")
    missing = sorted(required - params.keys())
    if missing:
        raise _fail(rope_type, missing[0], None, "a value (the key is missing)")
    if rope_type == "default":
        return None

    out: dict[str, Any] = {"rope_type": rope_type}
    for key, value in sorted(params.items()):
        if key == _ORIGINAL:
            out[key] = _length(rope_type, key, value)
        elif key in ("short_factor", "long_factor"):
            out[key] = _factor_list(key, value, rotary_dim)
        elif key == "truncate":
            if not isinstance(value, (bool, np.bool_)):
                raise _fail(rope_type, key, value, "true or false")
            out[key] = bool(value)
        elif key in ("mscale", "mscale_all_dim"):
            out[key] = _number(rope_type, key, value, positive=False)
        else:  # factor, attention_factor, low/high_freq_factor, beta_fast/slow
            out[key] = _number(rope_type, key, value)
    if rope_type == "llama3" and out["high_freq_factor"] <= out["low_freq_factor"]:
        raise _fail(rope_type, "high_freq_factor", out["high_freq_factor"],
                    f"a value > low_freq_factor = {out['low_freq_factor']!r}")
    if rope_type == "longrope" and len(out["short_factor"]) != len(out["long_factor"]):
        raise _fail(rope_type, "long_factor", f"<{len(out['long_factor'])} entries>",
                    f"as many entries as short_factor ({len(out['short_factor'])})")
    return tuple(sorted(out.items()))


def _exponents(rotary_dim: int) -> np.ndarray:
    """``2i / rotary_dim`` rounded to float32 (as the reference code computes it), as float64 ``[rotary_dim // 2]``."""
    return (np.arange(0, rotary_dim, 2, dtype=np.float32) / np.float32(rotary_dim)).astype(np.float64)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's eq. 21, ``0.1 · mscale · ln(scale) + 1`` (1 for ``scale <= 1``)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_correction_dim(rotations: float, rotary_dim: int, theta: float, original: int) -> float:
    """The (fractional) dimension whose wavelength makes ``rotations`` turns over ``original`` positions."""
    return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def _yarn(rotary_dim: int, theta: float, p: dict[str, Any]) -> tuple[np.ndarray, float]:
    factor, original = p["factor"], p[_ORIGINAL]
    if "attention_factor" in p:
        attention = p["attention_factor"]
    elif p.get("mscale") and p.get("mscale_all_dim"):
        attention = float(_yarn_mscale(factor, p["mscale"]) / _yarn_mscale(factor, p["mscale_all_dim"]))
    else:
        attention = _yarn_mscale(factor)
    low = _yarn_correction_dim(p.get("beta_fast", 32.0), rotary_dim, theta, original)
    high = _yarn_correction_dim(p.get("beta_slow", 1.0), rotary_dim, theta, original)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # a step, not a division by zero
    ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolated = 1.0 / theta ** _exponents(rotary_dim)
    return extrapolated / factor * ramp + extrapolated * (1.0 - ramp), attention


def _llama3(rotary_dim: int, theta: float, p: dict[str, Any]) -> np.ndarray:
    factor, low, high, original = p["factor"], p["low_freq_factor"], p["high_freq_factor"], p[_ORIGINAL]
    inv_freq = 1.0 / theta ** _exponents(rotary_dim)
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - low) / (high - low)
    blended = (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
    return np.where(wavelength < original / high, inv_freq,
                    np.where(wavelength > original / low, inv_freq / factor, blended))


def _longrope_attention(p: dict[str, Any], max_position_embeddings: int) -> float:
    if "attention_factor" in p:
        return p["attention_factor"]
    original = p[_ORIGINAL]
    factor = p.get("factor", max_position_embeddings / original)
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def _dynamic_base(theta: float, factor: float, rotary_dim: int, max_position_embeddings: int, seq_len: int) -> float:
    length = max(seq_len, max_position_embeddings)
    return theta * (factor * length / max_position_embeddings - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))


@functools.lru_cache(maxsize=256)
def _frequencies(rotary_dim: int, theta: float, scaling: RopeScaling | None, max_position_embeddings: int,
                 seq_len: int | None) -> tuple[np.ndarray, float]:
    """The float64 inverse frequencies (read-only) and the attention factor of a normalised ``scaling``."""
    p = dict(scaling or ())
    rope_type = p.get("rope_type", "default")
    attention = 1.0
    if rope_type == "default":
        inv_freq = 1.0 / theta ** _exponents(rotary_dim)
    elif rope_type == "linear":
        inv_freq = 1.0 / theta ** _exponents(rotary_dim) / p["factor"]
    elif rope_type == "dynamic":
        if rotary_dim < 4:
            raise ValueError(f"rotary_dim = {rotary_dim}: expected >= 4 for rope_type 'dynamic' (exponent d/(d-2))")
        base = _dynamic_base(theta, p["factor"], rotary_dim, max_position_embeddings,
                             max_position_embeddings if seq_len is None else seq_len)
        inv_freq = 1.0 / base ** _exponents(rotary_dim)
    elif rope_type == "llama3":
        inv_freq = _llama3(rotary_dim, theta, p)
    elif rope_type == "yarn":
        inv_freq, attention = _yarn(rotary_dim, theta, p)
    else:  # longrope
        long = seq_len is not None and seq_len > p[_ORIGINAL]
        ext = np.asarray(p["long_factor" if long else "short_factor"], np.float64)
        inv_freq = 1.0 / (ext * theta ** _exponents(rotary_dim))
        attention = _longrope_attention(p, max_position_embeddings)
    inv_freq = np.asarray(inv_freq, np.float64)
    inv_freq.flags.writeable = False
    return inv_freq, float(attention)


def _check_theta(theta: float) -> None:
    if _number(None, "theta", theta) == 1.0:
        raise _fail(None, "theta", theta, "a base != 1")


def _normalized(scaling: Mapping[str, Any] | RopeScaling | None, rotary_dim: int, theta: float,
                max_position_embeddings: int) -> RopeScaling | None:
    _check_rotary_dim(rotary_dim)
    _check_theta(theta)
    return normalize_rope_scaling(scaling, max_position_embeddings=max_position_embeddings, rotary_dim=rotary_dim)


def rope_frequencies(rotary_dim: int, theta: float, scaling: Mapping[str, Any] | RopeScaling | None,
                     max_position_embeddings: int, *, seq_len: int | None = None) -> tuple[np.ndarray, float]:
    """The inverse frequencies ``[rotary_dim // 2]`` float32 and the attention factor (a Python float).

    ``rotary_dim`` is the rotated part of a head (``int(head_dim · partial_rotary_factor)``), ``theta`` the base
    (``rope_theta``), ``scaling`` a raw or normalised ``rope_scaling`` (``None``: default RoPE). The attention
    factor multiplies ``cos`` and ``sin`` (Hugging Face's ``attention_scaling``): YaRN's and LongRoPE's, else 1.0.

    ``seq_len`` (a Python int, the current ``max(positions) + 1``) matters only to the length-dependent types:
    ``"longrope"`` takes ``long_factor`` when ``seq_len > original_max_position_embeddings``, else (and when None)
    ``short_factor``; ``"dynamic"`` stretches the base when ``seq_len > max_position_embeddings`` (None: no
    stretch). Under ``jit``, where the length is a traced value, use :func:`rope_inv_freq` instead.
    """
    normalized = _normalized(scaling, rotary_dim, theta, max_position_embeddings)
    inv_freq, attention = _frequencies(rotary_dim, float(theta), normalized, max_position_embeddings,
                                       None if seq_len is None else int(seq_len))
    return inv_freq.astype(np.float32), attention


def dynamic_ntk_inv_freq(rotary_dim: int, theta: float, factor: float, max_position_embeddings: int,
                         seq_len: jax.Array | int) -> jax.Array:
    """Traceable dynamic-NTK inverse frequencies ``[rotary_dim // 2]`` float32 for a run-time ``seq_len`` (scalar).

    ``theta' = theta · s^(d/(d-2))`` with ``s = 1 + factor · (L - M) / M``, ``L = max(seq_len, M)``,
    ``M = max_position_embeddings``; written as ``inv_freq_default · exp(-(2i/d) · d/(d-2) · log1p(...))`` so that
    float32 loses nothing for ``L <= M`` (exactly the default frequencies) and little above.
    """
    _check_rotary_dim(rotary_dim)
    if rotary_dim < 4:
        raise ValueError(f"rotary_dim = {rotary_dim}: expected >= 4 for rope_type 'dynamic' (exponent d/(d-2))")
    _check_theta(theta)
    factor = _number("dynamic", "factor", factor)
    _length(None, "max_position_embeddings", max_position_embeddings)
    exponents = _exponents(rotary_dim)
    default = jnp.asarray(1.0 / float(theta) ** exponents, jnp.float32)
    stretch = jnp.asarray(exponents * rotary_dim / (rotary_dim - 2), jnp.float32)
    excess = jnp.maximum(jnp.asarray(seq_len, jnp.float32) - max_position_embeddings, 0.0)
    return default * jnp.exp(-stretch * jnp.log1p(factor * excess / max_position_embeddings))


def longrope_inv_freq(rotary_dim: int, theta: float, scaling: Mapping[str, Any] | RopeScaling,
                      max_position_embeddings: int, seq_len: jax.Array | int) -> jax.Array:
    """Traceable LongRoPE selection ``[rotary_dim // 2]`` float32: long factors iff ``seq_len > original``."""
    normalized = _normalized(scaling, rotary_dim, theta, max_position_embeddings)
    p = dict(normalized or ())
    if p.get("rope_type") != "longrope":
        raise ValueError(f"rope_scaling 'rope_type' = {p.get('rope_type', 'default')!r}: expected 'longrope'")
    short, _ = _frequencies(rotary_dim, float(theta), normalized, max_position_embeddings, None)
    long, _ = _frequencies(rotary_dim, float(theta), normalized, max_position_embeddings, p[_ORIGINAL] + 1)
    choose_long = jnp.asarray(seq_len) > p[_ORIGINAL]
    return jnp.where(choose_long, jnp.asarray(long, jnp.float32), jnp.asarray(short, jnp.float32))


def rope_inv_freq(rotary_dim: int, theta: float, scaling: Mapping[str, Any] | RopeScaling | None,
                  max_position_embeddings: int, seq_len: jax.Array | int | None = None) -> tuple[jax.Array, float]:
    """Every type, traceable: inverse frequencies ``[rotary_dim // 2]`` float32 and the attention factor.

    The static types give constants; ``"dynamic"`` and ``"longrope"`` depend on ``seq_len`` (a scalar, traced or
    not; None as in :func:`rope_frequencies`). The attention factor never depends on ``seq_len``.
    """
    normalized = _normalized(scaling, rotary_dim, theta, max_position_embeddings)
    p = dict(normalized or ())
    rope_type = p.get("rope_type", "default")
    inv_freq, attention = _frequencies(rotary_dim, float(theta), normalized, max_position_embeddings, None)
    if seq_len is None or rope_type not in ("dynamic", "longrope"):
        return jnp.asarray(inv_freq, jnp.float32), attention
    if rope_type == "dynamic":
        return dynamic_ntk_inv_freq(rotary_dim, theta, p["factor"], max_position_embeddings, seq_len), attention
    return longrope_inv_freq(rotary_dim, theta, normalized, max_position_embeddings, seq_len), attention


def rope_angles_scaled(positions: jax.Array, rotary_dim: int, theta: float,
                       scaling: Mapping[str, Any] | RopeScaling | None, max_position_embeddings: int, *,
                       seq_len: jax.Array | int | None = None) -> tuple[jax.Array, float]:
    """Rotation angles ``positions · inv_freq``: ``[batch, seq]`` int → ``[batch, seq, rotary_dim // 2]`` float32.

    Returns the angles and the attention factor (a Python float); the rotation uses ``cos(angles) · factor`` and
    ``sin(angles) · factor``. Traceable (``scaling`` must then be static: a normalised tuple is hashable).

    ``seq_len`` defaults to ``max(positions) + 1`` over the whole call, as Hugging Face computes it per forward
    pass; it only matters to ``"dynamic"`` and ``"longrope"``. Positions of padding must not exceed the real ones.
    """
    positions = jnp.asarray(positions)
    if seq_len is None:
        seq_len = jnp.max(positions) + 1
    inv_freq, attention = rope_inv_freq(rotary_dim, theta, scaling, max_position_embeddings, seq_len)
    return positions.astype(jnp.float32)[..., None] * inv_freq, attention
