"""The int8 matmul forms of ``train/tools/bench/int8_forms.py`` compute the same chain as numpy (the A/B of
``models/QUANTIZE.md`` compares forms that agree), and the command runs."""
import jax.numpy as jnp
import numpy as np
import pytest

from flaxzoo.train.tools.bench import int8_forms


def numpy_chain(x: np.ndarray, weights: list[np.ndarray], steps: int) -> np.ndarray:
    x = x.astype(np.float64)
    for _ in range(steps):
        for w in weights:
            x = np.tanh(x @ w)
    return x


def test_quantize_columns_round_trips_within_half_a_step():
    w = np.random.default_rng(3).standard_normal((24, 40)).astype(np.float32)
    q, scale = int8_forms.quantize_columns(w)
    assert q.dtype == np.int8 and np.abs(q).max() == 127
    assert np.all(np.abs(q * scale - w) <= scale / 2 + 1e-7)


@pytest.mark.slow_variants
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", list(int8_forms.FORMS))
def test_every_form_computes_the_chain(name, batch):
    # std 0.2 ≈ 1 / sqrt(fan-in): the activations stay of order one through the chain, so the tolerances bite.
    floats, int8 = int8_forms.make_weights(layers=1, hidden=32, mlp=48, seed=batch, std=0.2)
    x = np.random.default_rng(batch).standard_normal((batch, 32)).astype(np.float32)
    matmul, kind, barrier = int8_forms.FORMS[name]
    bfloat16 = [jnp.asarray(w, jnp.bfloat16) for w in floats]
    stored = dict(float32=floats, int8=int8, bfloat16=bfloat16)[kind]
    got = np.asarray(int8_forms.decode_like(matmul, 2, barrier)(x, stored))
    read = dict(float32=floats, int8=[np.asarray(q, np.float64) * np.asarray(s, np.float64) for q, s in int8],
                bfloat16=[np.asarray(w, np.float64) for w in bfloat16])[kind]
    expected = numpy_chain(x, read, 2)
    # Outputs are of order 0.4. int8 x int8 rounds the activations to 8 bits per row (2.9e-2 measured), bfloat16 to
    # 8 significant bits (5e-3); the others differ only by float32 rounding (7e-7; int8 read as float32 would be
    # 2e-2 off).
    atol = {"int8 x int8": 6e-2, "bfloat16": 1.5e-2}.get(name, 2e-5)
    np.testing.assert_allclose(got, expected, atol=atol)


def test_every_form_reads_a_known_kind_of_weights():
    assert {kind for _, kind, _ in int8_forms.FORMS.values()} == set(int8_forms.WEIGHT_KINDS)


def test_main_times_every_form(capsys):
    results = int8_forms.main(["--layers", "1", "--hidden", "32", "--mlp", "48", "--steps", "2", "--repeats", "1",
                                "--rounds", "2"])
    assert set(results) == set(int8_forms.FORMS) and all(t > 0 for t in results.values())
    assert capsys.readouterr().out.count("ms/step") == len(int8_forms.FORMS)


def test_main_refuses_a_non_positive_size(capsys):
    with pytest.raises(SystemExit):
        int8_forms.main(["--steps", "0"])
    assert "--steps 0: expected a positive integer" in capsys.readouterr().err
