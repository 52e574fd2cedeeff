"""Position schemes against their papers' formulas, each computed independently here (plain Python / numpy)."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from flaxzoo.models.layers.positions import alibi_bias, alibi_slopes, apply_rope, sinusoidal_table

# ----------------------------------------------------------------------------------------------------- sinusoidal


@pytest.mark.parametrize("num_positions, dim", [(50, 16), (7, 6)])
def test_sinusoidal_table_is_vaswani_formula(num_positions, dim):
    # Vaswani et al. (2017), section 3.5, one scalar at a time.
    expected = np.zeros((num_positions, dim))
    for p in range(num_positions):
        for i in range(dim // 2):
            angle = p / 10000 ** (2 * i / dim)
            expected[p, 2 * i] = math.sin(angle)
            expected[p, 2 * i + 1] = math.cos(angle)
    table = sinusoidal_table(num_positions, dim)
    assert table.shape == (num_positions, dim)
    assert table.dtype == np.float32
    np.testing.assert_allclose(table, expected, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------------------------------------- RoPE

HEAD_DIM, THETA = 16, 10_000.0


def numpy_rope(x: np.ndarray, position: int, layout: str, theta: float = THETA) -> np.ndarray:
    """Su et al. (2021) as complex rotations: pair ``j`` is ``z_j = a + ib`` turned by ``position · theta^(-2j/d)``.

    ``half`` pairs dimensions ``(j, j + d/2)``; ``interleaved`` pairs ``(2j, 2j + 1)``. ``x: [d]``."""
    d = x.shape[-1]
    j = np.arange(d // 2)
    rotation = np.exp(1j * position * theta ** (-2.0 * j / d))
    if layout == "half":
        z = (x[: d // 2] + 1j * x[d // 2:]) * rotation
        return np.concatenate([z.real, z.imag])
    z = (x[0::2] + 1j * x[1::2]) * rotation
    out = np.empty(d)
    out[0::2], out[1::2] = z.real, z.imag
    return out


def rope_one(x: np.ndarray, position: int, layout: str) -> np.ndarray:
    """``apply_rope`` on one vector ``[d]`` at one position."""
    out = apply_rope(jnp.asarray(x, jnp.float32)[None, None, None, :], jnp.asarray([[position]]), theta=THETA,
                     layout=layout)
    return np.asarray(out)[0, 0, 0]


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_matches_complex_rotation_of_the_right_pairs(layout):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 2, HEAD_DIM)).astype(np.float32)  # [batch, seq, heads, head_dim]
    positions = rng.integers(0, 60, size=(3, 5))
    got = np.asarray(apply_rope(jnp.asarray(x), jnp.asarray(positions), theta=THETA, layout=layout))
    expected = np.stack([np.stack([np.stack([numpy_rope(x[b, s, h].astype(np.float64), positions[b, s], layout)
                                             for h in range(2)]) for s in range(5)]) for b in range(3)])
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    # The two layouts are different maps: a test pinned to one cannot pass for the other.
    other = "interleaved" if layout == "half" else "half"
    assert np.abs(numpy_rope(x[0, 0, 0].astype(np.float64), 7, other) - expected[0, 0, 0]).max() > 1e-2


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_scores_depend_only_on_offset(layout):
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, HEAD_DIM))
    q, k = q / np.linalg.norm(q), k / np.linalg.norm(k)

    def score(m: int, n: int) -> float:
        return float(np.dot(rope_one(q, m, layout), rope_one(k, n, layout)))

    for offset in (0, 1, 3, -2, 11):
        pairs = [(m, m - offset) for m in (15, 20, 27, 40) if m - offset >= 0]
        scores = [score(m, n) for m, n in pairs]
        np.testing.assert_allclose(scores, scores[0], atol=1e-5, rtol=0, err_msg=f"offset {offset}: {pairs}")
    # ... and the scores do depend on the offset (the rotation is not the identity).
    assert abs(score(10, 10) - score(10, 7)) > 1e-3


# ---------------------------------------------------------------------------------------------------------- ALiBi


def paper_slopes(n: int) -> list[float]:
    """Press et al. (2022): for n a power of two, the geometric sequence starting at 2^(-8/n) with ratio 2^(-8/n);
    otherwise the slopes of the closest smaller power of two m, then every other slope of the 2m-head sequence
    (the odd terms 1st, 3rd, ...), as many as are missing."""
    def geometric(count: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / count) for i in range(count)]

    m = 1
    while m * 2 <= n:
        m *= 2
    if m == n:
        return geometric(n)
    return geometric(m) + geometric(2 * m)[0::2][: n - m]


def test_alibi_slopes_8_heads():
    np.testing.assert_allclose(alibi_slopes(8), [2.0 ** -e for e in range(1, 9)], rtol=1e-7)


def test_alibi_slopes_12_heads_follow_the_paper_rule():
    expected = [2.0 ** -e for e in range(1, 9)] + [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5]
    np.testing.assert_allclose(paper_slopes(12), expected, rtol=1e-12)  # the rule as written above
    np.testing.assert_allclose(alibi_slopes(12), expected, rtol=1e-7)


@pytest.mark.parametrize("n", [1, 2, 4, 6, 12, 16, 20, 24])
def test_alibi_slopes_any_head_count(n):
    slopes = alibi_slopes(n)
    assert slopes.shape == (n,) and slopes.dtype == np.float32
    np.testing.assert_allclose(slopes, paper_slopes(n), rtol=1e-7)


def test_alibi_slopes_6_heads_by_hand():
    # m = 4: 2^-2, 2^-4, 2^-6, 2^-8; the 8-head sequence is 2^-1, 2^-2, ...; every other from the first: 2^-1, 2^-3.
    np.testing.assert_allclose(alibi_slopes(6), [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3],
                               rtol=1e-7)


@pytest.mark.parametrize("causal", [True, False])
def test_alibi_bias_is_minus_slope_times_distance(causal):
    heads = 6
    query_positions = np.array([[0, 1, 2, 3], [4, 5, 6, 7]])
    key_positions = np.array([[0, 1, 2, 3, 4], [2, 3, 4, 5, 6]])
    bias = np.asarray(alibi_bias(heads, jnp.asarray(query_positions), jnp.asarray(key_positions), causal=causal))
    assert bias.shape == (2, heads, 4, 5)
    slopes = paper_slopes(heads)
    for b in range(2):
        for h in range(heads):
            for i in range(4):
                for j in range(5):
                    distance = query_positions[b, i] - key_positions[b, j]
                    if not causal:
                        distance = abs(distance)
                    assert bias[b, h, i, j] == pytest.approx(-slopes[h] * distance, abs=1e-6)
