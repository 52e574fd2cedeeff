"""``flaxzoo.models.inference.sampling`` against an independent float64 numpy reference, χ² fits of its draws, one compilation for
any traced temperature / top_k / top_p, per-row parameters, extreme logits and temperatures, argument checks."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxzoo.models.inference.sampling import check_sampling_args, sample_logits, sampling_probabilities

TEMPERATURES = (0.0, 0.3, 1.0, 2.5, 1e-30)
TOP_PS = (0.1, 0.5, 0.9, 1.0)
TOL = 1e-6


def reference_probabilities(row, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The sampling distribution of one ``[vocab]`` logits row, in float64 numpy, the Hugging Face order:
    temperature, top-k, then top-p on the renormalised top-k distribution. Ranking by a stable sort of -logits (ties
    to the lower index); a row with +inf entries shares the mass among them, a row of only -inf is uniform."""
    x = np.asarray(row, np.float64)
    vocab = x.size
    out = np.zeros(vocab)
    if temperature == 0:
        out[np.argmax(x)] = 1.0
        return out
    order = np.argsort(-x, kind="stable")
    xs = x[order]
    if xs[0] == np.inf:
        weights = (xs == np.inf).astype(np.float64)
    elif xs[0] == -np.inf:
        weights = np.ones(vocab)
    else:
        weights = np.exp((xs - xs[0]) / temperature)
    if 0 < top_k < vocab:
        weights[top_k:] = 0.0
    probs = weights / weights.sum()
    if top_p < 1:
        mass_before = np.concatenate([[0.0], np.cumsum(probs)[:-1]])
        keep = mass_before < top_p
        keep[0] = True
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum()
    out[order] = probs
    return out


def reference_batch(logits, temperature, top_k, top_p) -> np.ndarray:
    """``reference_probabilities`` row by row; parameters are scalars or one per row."""
    batch = len(logits)
    per_row = [np.broadcast_to(np.asarray(v), (batch,)) for v in (temperature, top_k, top_p)]
    return np.stack([reference_probabilities(logits[i], float(per_row[0][i]), int(per_row[1][i]),
                                             float(per_row[2][i])) for i in range(batch)])


# Compiled once per logits shape; parameters as strongly typed arrays so every value shares one signature.
_probs = jax.jit(sampling_probabilities)
_sample = jax.jit(sample_logits)


def params(temperature, top_k, top_p):
    return (np.asarray(temperature, np.float32), np.asarray(top_k, np.int32), np.asarray(top_p, np.float32))


def probs_of(logits, temperature, top_k, top_p) -> np.ndarray:
    return np.asarray(_probs(jnp.asarray(logits), *params(temperature, top_k, top_p)))


def sample_of(logits, seed, temperature, top_k, top_p) -> np.ndarray:
    return np.asarray(_sample(jnp.asarray(logits), jax.random.key(seed), *params(temperature, top_k, top_p)))


def assert_valid(probs: np.ndarray):
    assert probs.dtype == np.float32
    assert np.isfinite(probs).all() and (probs >= 0).all()
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=TOL)


def random_logits(seed: int = 0, vocab: int = 40) -> np.ndarray:
    """Distinct-valued rows, integer-valued rows (many ties, also at the top-k / top-p boundaries), a ±0.0 row."""
    rng = np.random.default_rng(seed)
    distinct = rng.normal(size=(24, vocab)) * 2.0
    tied = np.round(rng.normal(size=(8, vocab)) * 1.5)
    zeros = np.where(rng.random((1, vocab)) < 0.5, -0.0, 0.0)
    zeros[0, :3] = -1.0
    return np.concatenate([distinct, tied, zeros]).astype(np.float32)


def test_matches_reference_on_the_parameter_grid():
    logits = random_logits()
    vocab = logits.shape[1]
    for temperature, top_k, top_p in itertools.product(TEMPERATURES, (0, 1, 5, vocab), TOP_PS):
        got = probs_of(logits, temperature, top_k, top_p)
        assert_valid(got)
        want = reference_batch(logits, temperature, top_k, top_p)
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL, err_msg=f"{temperature=} {top_k=} {top_p=}")


def test_filters_actually_filter():
    """Guards the grid test against a reference that agrees by doing nothing: on distinct logits top_k=5 leaves 5
    tokens, top_p=0.5 fewer than the vocabulary, temperature 0 one."""
    logits = random_logits()[:24]
    assert ((probs_of(logits, 1.0, 5, 1.0) > 0).sum(-1) == 5).all()
    nucleus = (probs_of(logits, 1.0, 0, 0.5) > 0).sum(-1)
    assert (nucleus >= 1).all() and (nucleus < logits.shape[1] // 2).all()
    assert ((probs_of(logits, 0.0, 0, 1.0) > 0).sum(-1) == 1).all()
    assert ((probs_of(logits, 1.0, 0, 1.0) > 0).sum(-1) == logits.shape[1]).all()


def test_per_row_parameters():
    """``[batch]`` temperature / top_k / top_p: each row gets its own distribution (the same logits row repeated
    with different settings, and different rows)."""
    rng = np.random.default_rng(1)
    base = random_logits(seed=1)
    vocab = base.shape[1]
    combos = list(itertools.product(TEMPERATURES, (0, 1, 5, vocab), TOP_PS))
    rows = rng.integers(0, len(base), len(combos))
    logits = base[rows]
    temperature, top_k, top_p = (np.array(v) for v in zip(*combos))
    got = probs_of(logits, temperature, top_k, top_p)
    assert_valid(got)
    np.testing.assert_allclose(got, reference_batch(logits, temperature, top_k, top_p), rtol=0, atol=TOL)
    # One row under four settings: four different distributions.
    same = np.repeat(base[:1], 4, axis=0)
    got = probs_of(same, [1.0, 0.0, 1.0, 1.0], [0, 0, 3, 0], [1.0, 1.0, 1.0, 0.5])
    np.testing.assert_allclose(got, reference_batch(same, [1.0, 0.0, 1.0, 1.0], [0, 0, 3, 0], [1.0, 1.0, 1.0, 0.5]),
                               rtol=0, atol=TOL)
    for i, j in itertools.combinations(range(4), 2):
        assert np.abs(got[i] - got[j]).max() > 0.01, (i, j)
    # Greedy rows of sample_logits are exactly argmax; the others are draws that differ from it somewhere.
    wide = np.repeat(base[:4], 64, axis=0)
    temps = np.tile([0.0, 2.5], len(wide) // 2)
    drawn = sample_of(wide, 3, temps, 0, 1.0)
    np.testing.assert_array_equal(drawn[temps == 0], wide[temps == 0].argmax(-1))
    assert (drawn[temps > 0] != wide[temps > 0].argmax(-1)).any()


@pytest.mark.parametrize("top_k, kept", [(1, [0]), (2, [0, 1]), (3, [0, 1, 2]), (4, [0, 1, 2, 3]),
                                         (5, [0, 1, 2, 3, 5]), (6, [0, 1, 2, 3, 4, 5])])
def test_top_k_ties_keep_exactly_k_lowest_index(top_k, kept):
    logits = np.array([[3.0, 2.0, 2.0, 2.0, 1.0, 2.0]], np.float32)  # four-way tie at 2.0
    got = probs_of(logits, 1.0, top_k, 1.0)
    assert np.flatnonzero(got[0]).tolist() == kept
    np.testing.assert_allclose(got, reference_batch(logits, 1.0, top_k, 1.0), rtol=0, atol=TOL)


def test_top_k_ties_at_the_maximum_and_signed_zeros():
    tied_max = np.array([[5.0, 1.0, 5.0, 5.0]], np.float32)
    np.testing.assert_allclose(probs_of(tied_max, 1e-30, 2, 1.0), [[0.5, 0.0, 0.5, 0.0]], atol=TOL)
    np.testing.assert_allclose(probs_of(tied_max, 1e-30, 0, 1.0), [[1 / 3, 0.0, 1 / 3, 1 / 3]], atol=TOL)
    zeros = np.array([[-1.0, -0.0, 0.0, -0.0, 0.0]], np.float32)  # -0.0 == 0.0: a four-way tie
    np.testing.assert_allclose(probs_of(zeros, 1e-30, 3, 1.0), [[0.0, 1 / 3, 1 / 3, 1 / 3, 0.0]], atol=TOL)


@pytest.mark.parametrize("probs, top_p, want", [
    ([0.4, 0.2, 0.2, 0.2], 0.55, [0.4, 0.2, 0, 0]),        # boundary inside a three-way tie: lower index kept
    ([0.4, 0.2, 0.2, 0.2], 0.65, [0.4, 0.2, 0.2, 0]),
    ([0.2, 0.4, 0.2, 0.2], 0.5, [0.2, 0.4, 0, 0]),
    ([0.2, 0.2, 0.2, 0.4], 0.7, [0.2, 0.2, 0, 0.4]),
    ([0.2, 0.2, 0.2, 0.4], 1e-6, [0, 0, 0, 1]),             # the first token is always kept
    ([0.2, 0.2, 0.2, 0.4], 0.95, [0.2, 0.2, 0.2, 0.4]),
])
def test_top_p_keeps_the_smallest_prefix_with_ties_by_index(probs, top_p, want):
    logits = np.log(np.array([probs], np.float32))
    want = np.array([want]) / np.sum(want)
    np.testing.assert_allclose(probs_of(logits, 1.0, 0, top_p), want, atol=TOL)
    np.testing.assert_allclose(reference_batch(logits, 1.0, 0, top_p), want, atol=TOL)


def test_top_p_applies_to_the_renormalised_top_k_distribution():
    """top-k 2 of [0.3, 0.25, 0.25, 0.2] renormalises to [0.545, 0.455]: top_p 0.5 then keeps only the first
    token (on the un-renormalised distribution the mass before token 1 would be 0.3 < 0.5 and it would stay)."""
    logits = np.log(np.array([[0.3, 0.25, 0.25, 0.2]], np.float32))
    np.testing.assert_allclose(probs_of(logits, 1.0, 2, 0.5), [[1.0, 0, 0, 0]], atol=TOL)
    np.testing.assert_allclose(probs_of(logits, 1.0, 2, 0.6), [[0.3 / 0.55, 0.25 / 0.55, 0, 0]], atol=TOL)
    np.testing.assert_allclose(probs_of(logits, 1.0, 0, 0.5), [[0.3 / 0.55, 0.25 / 0.55, 0, 0]], atol=TOL)


def test_tiny_temperatures_and_extreme_logits():
    inf = np.inf
    extreme = np.array([
        [1e30, -1e30, 0.0, -inf, 5e29, 1.0],
        [0.0, inf, 3.0, inf, -inf, 1e30],          # +inf tokens share the mass
        [3.4e38, -3.4e38, 0.0, 1.0, 2.0, -inf],    # near float32 max: x - max overflows to -inf, harmless
        [-inf, 2.0, 1.0, -inf, 0.5, -inf],         # banned tokens
        [-1e30, -1e30 + 1e24, -2e30, -inf, -3e30, -1e30 - 1e24],
    ], np.float32)
    logits = np.concatenate([extreme, random_logits()[:24, :6]])
    for temperature, top_k, top_p in itertools.product((1e-30, 1e-20, 1e-3, 1.0, 2.5), (0, 1, 2, 6), TOP_PS):
        got = probs_of(logits, temperature, top_k, top_p)
        assert_valid(got)
        np.testing.assert_allclose(got, reference_batch(logits, temperature, top_k, top_p), rtol=0, atol=TOL,
                                   err_msg=f"{temperature=} {top_k=} {top_p=}")
        assert (got[np.isneginf(logits)] == 0).all()
    # A tiny temperature is greedy (rows whose maximum is unique); so are the huge-gap rows at any temperature.
    unique_max = [0, 2, 3, 4] + list(range(len(extreme), len(logits)))
    greedy = np.eye(6, dtype=np.float32)[logits.argmax(-1)]
    for temperature in (1e-30, 1e-20):
        np.testing.assert_array_equal(probs_of(logits, temperature, 0, 1.0)[unique_max], greedy[unique_max])
        np.testing.assert_array_equal(sample_of(logits, 0, temperature, 0, 1.0)[unique_max],
                                      logits.argmax(-1)[unique_max])
    np.testing.assert_array_equal(probs_of(logits, 1.0, 0, 1.0)[[0, 2]], greedy[[0, 2]])
    np.testing.assert_allclose(probs_of(logits, 1e-30, 0, 1.0)[1], [0, 0.5, 0, 0.5, 0, 0], atol=TOL)
    np.testing.assert_array_equal(probs_of(logits, 0.0, 0, 1.0), greedy)  # temperature 0: first index of ties
    # Banned tokens are never drawn.
    drawn = sample_of(np.repeat(extreme[3:4], 2000, axis=0), 1, 1.0, 0, 1.0)
    assert set(np.unique(drawn).tolist()) == {1, 2, 4}


def test_all_banned_row_is_uniform_and_low_precision_input():
    row = np.full((1, 5), -np.inf, np.float32)
    for temperature, top_k in [(1.0, 0), (1e-30, 0), (1.0, 2)]:
        np.testing.assert_allclose(probs_of(row, temperature, top_k, 1.0), reference_batch(row, temperature, top_k, 1.0),
                                   atol=TOL)
    logits = random_logits()[:8]
    got = np.asarray(sampling_probabilities(jnp.asarray(logits, jnp.bfloat16), 0.7, 5, 0.9))
    assert_valid(got)
    want = reference_batch(np.asarray(jnp.asarray(logits, jnp.bfloat16).astype(jnp.float32)), 0.7, 5, 0.9)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


# χ² goodness of fit of the draws.

def wilson_hilferty_sf(x: float, df: int) -> float:
    """Survival function of χ²(df) at x: (χ²/df)^(1/3) is about normal, mean 1 - 2/(9 df), variance 2/(9 df)."""
    variance = 2.0 / (9.0 * df)
    z = ((x / df) ** (1.0 / 3.0) - (1.0 - variance)) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def chi2_sf(x: float, df: int) -> float:
    try:
        from scipy.stats import chi2
    except ImportError:
        return wilson_hilferty_sf(x, df)
    return float(chi2.sf(x, df))


def chi_square_p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's χ² of ``counts`` against ``probs`` over the tokens of positive probability; tokens expected fewer
    than 5 times are pooled into one bin (the χ² approximation needs it)."""
    positive = probs > 0
    expected, observed = counts.sum() * probs[positive], counts[positive].astype(np.float64)
    small = expected < 5
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    if len(expected) < 2:
        return 1.0
    statistic = float(np.sum((observed - expected) ** 2 / expected))
    return chi2_sf(statistic, len(expected) - 1)


DRAWS = 20_000
FIT_ROW = (np.random.default_rng(7).normal(size=(1, 12)) * 1.5).astype(np.float32)


def draw_counts(temperature, top_k, top_p, seed: int) -> np.ndarray:
    drawn = sample_of(np.repeat(FIT_ROW, DRAWS, axis=0), seed, temperature, top_k, top_p)
    assert drawn.dtype == np.int32 and drawn.shape == (DRAWS,)
    return np.bincount(drawn, minlength=FIT_ROW.shape[1])


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.6, 0, 1.0), (1.7, 5, 1.0),
                                                        (1.3, 0, 0.8), (0.9, 6, 0.7)])
def test_draws_fit_the_probabilities(temperature, top_k, top_p):
    counts = draw_counts(temperature, top_k, top_p, seed=11)
    probs = probs_of(FIT_ROW, temperature, top_k, top_p)[0]
    assert counts[probs == 0].sum() == 0
    if top_k or top_p < 1:
        assert (probs == 0).any()  # the setting does filter, so the line above can fail
    assert chi_square_p_value(counts, probs) > 1e-3


def test_chi_square_rejects_a_wrong_distribution():
    """The fit test has power: draws at temperature 1 against the temperature-1.15 probabilities are rejected."""
    counts = draw_counts(1.0, 0, 1.0, seed=11)
    assert chi_square_p_value(counts, probs_of(FIT_ROW, 1.15, 0, 1.0)[0]) < 1e-6
    assert chi_square_p_value(counts, probs_of(FIT_ROW, 1.0, 0, 1.0)[0]) > 1e-3


def test_wilson_hilferty_fallback_against_scipy():
    chi2 = pytest.importorskip("scipy.stats").chi2
    for df, q in itertools.product((3, 5, 11, 40), (0.5, 0.1, 1e-2, 1e-3)):
        assert abs(wilson_hilferty_sf(chi2.isf(q, df), df) / q - 1) < 0.25, (df, q)


# One compilation for every parameter value.

def test_traced_parameters_compile_once():
    traces = []

    @jax.jit
    def step(logits, rng, temperature, top_k, top_p):
        traces.append(None)
        return sampling_probabilities(logits, temperature, top_k, top_p), sample_logits(logits, rng, temperature,
                                                                                        top_k, top_p)

    logits = random_logits()
    for temperature, top_k, top_p in [(0.7, 3, 0.9), (1.5, 0, 0.5), (0.0, 10, 1.0)]:  # Python scalars
        probs, drawn = step(jnp.asarray(logits), jax.random.key(0), temperature, top_k, top_p)
        np.testing.assert_allclose(probs, reference_batch(logits, temperature, top_k, top_p), rtol=0, atol=TOL)
        assert (np.take_along_axis(np.asarray(probs), np.asarray(drawn)[:, None], 1) > 0).all()
    assert len(traces) == 1 and step._cache_size() == 1

    batch = len(logits)
    rng = np.random.default_rng(2)
    for _ in range(3):  # [batch] arrays
        per_row = params(rng.choice(TEMPERATURES, batch), rng.choice([0, 1, 5], batch), rng.choice(TOP_PS, batch))
        probs, _ = step(jnp.asarray(logits), jax.random.key(1), *per_row)
        np.testing.assert_allclose(probs, reference_batch(logits, *per_row), rtol=0, atol=TOL)
    assert len(traces) == 2 and step._cache_size() == 2  # one more signature (the [batch] shapes), traced once


def test_shape_errors():
    logits = jnp.zeros((2, 5))
    with pytest.raises(ValueError, match=r"logits has shape \(5,\): expected \[batch, vocab\]"):
        sampling_probabilities(jnp.zeros(5))
    with pytest.raises(ValueError, match=r"temperature has shape \(3,\): expected a scalar or one value per row, "
                                         r"shape \(2,\)"):
        sampling_probabilities(logits, jnp.ones(3))
    with pytest.raises(ValueError, match=r"top_k has shape \(2, 1\)"):
        sample_logits(logits, jax.random.key(0), 1.0, jnp.ones((2, 1), jnp.int32))
    with pytest.raises(ValueError, match=r"top_p has shape \(1,\)"):
        sampling_probabilities(logits, 1.0, 0, jnp.ones(1))


# Host-side argument checks.

@pytest.mark.parametrize("args, want", [
    ((0.7, None, None, 10), (0.7, 0, 1.0)),
    ((0, 10, 1, 10), (0.0, 10, 1.0)),
    ((1e-30, 0, 0.5, 10), (1e-30, 0, 0.5)),
    ((np.float32(0.5), np.int64(3), np.float64(0.25), 10), (0.5, 3, 0.25)),
])
def test_check_sampling_args_normalises(args, want):
    got = check_sampling_args(*args)
    assert got == want and [type(v) for v in got] == [float, int, float]


@pytest.mark.parametrize("args, message", [
    ((-0.1, None, None, 10), r"temperature=-0\.1: expected a finite real number >= 0"),
    ((float("nan"), None, None, 10), r"temperature=nan: expected a finite real number >= 0"),
    ((float("inf"), None, None, 10), r"temperature=inf: expected a finite real number >= 0"),
    (("hot", None, None, 10), r"temperature='hot': expected a finite real number"),
    ((None, None, None, 10), r"temperature=None: expected a finite real number"),
    ((True, None, None, 10), r"temperature=True: expected a finite real number"),
    ((1.0, -1, None, 10), r"top_k=-1: expected None or an integer in \[0, 10\]"),
    ((1.0, 11, None, 10), r"top_k=11: expected None or an integer in \[0, 10\]"),
    ((1.0, 2.0, None, 10), r"top_k=2\.0: expected None or an integer in \[0, 10\]"),
    ((1.0, "5", None, 10), r"top_k='5': expected None or an integer"),
    ((1.0, True, None, 10), r"top_k=True: expected None or an integer"),
    ((1.0, None, 0.0, 10), r"top_p=0\.0: expected None or a real number in \(0, 1\]"),
    ((1.0, None, -0.5, 10), r"top_p=-0\.5: expected None or a real number in \(0, 1\]"),
    ((1.0, None, 1.5, 10), r"top_p=1\.5: expected None or a real number in \(0, 1\]"),
    ((1.0, None, float("nan"), 10), r"top_p=nan: expected None or a real number in \(0, 1\]"),
    ((1.0, None, "0.9", 10), r"top_p='0\.9': expected None or a real number"),
    ((1.0, None, None, 0), r"vocab_size=0: expected a positive integer"),
    ((1.0, None, None, 3.5), r"vocab_size=3\.5: expected a positive integer"),
])
def test_check_sampling_args_rejects(args, message):
    with pytest.raises(ValueError, match=message):
        check_sampling_args(*args)
