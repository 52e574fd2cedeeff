"""The train step (train/step.py) on one device: gradient accumulation, remat and scan-over-layers equivalence,
losses, dropout randomness that depends only on (seed, step)."""

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from train_helper import flat_state, make_config, run_steps  # noqa: E402

from flaxzoo.train.pretrain import Trainer  # noqa: E402
from flaxzoo.train.sharding import global_batch  # noqa: E402
from flaxzoo.train.losses import token_cross_entropy  # noqa: E402


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.getbasetemp() / "train_data")


def trainer(data_dir, tmp_path, kind="gpt", **extra):
    return Trainer(make_config(kind, data_dir, **extra), tmp_path / "w", devices=jax.devices()[:1])


def max_diff(a, b):
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def test_token_cross_entropy_matches_a_numpy_reference():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 3, 7)).astype(np.float32)
    labels = rng.integers(0, 7, (2, 3))
    valid = np.array([[1, 1, 0], [1, 0, 1]], bool)
    loss_sum, count, correct = token_cross_entropy(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(valid))
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0][valid].sum()
    assert abs(float(loss_sum) - expected) < 1e-5 and float(count) == 4
    assert float(correct) == float((logits.argmax(-1) == labels)[valid].sum())


@pytest.mark.slow_variants
@pytest.mark.parametrize("kind", ["gpt", "bert"])
def test_gradient_accumulation_equals_the_whole_batch(data_dir, tmp_path, kind):
    """4 micro-batches of 2 rows = one batch of 8 (MLM micro-batches hold different numbers of masked tokens)."""
    whole = trainer(data_dir, tmp_path / "a", kind)
    accumulated = trainer(data_dir, tmp_path / "b", kind, **{"optim.accum_steps": 4})
    state_a, losses_a = run_steps(whole, 2)
    state_b, losses_b = run_steps(accumulated, 2)
    np.testing.assert_allclose(losses_a, losses_b, atol=1e-5, rtol=0)
    assert max_diff(flat_state(state_a["params"]), flat_state(state_b["params"])) < 1e-5


@pytest.mark.slow_variants
@pytest.mark.parametrize("kind, remat, scan", [
    ("gpt", "full", False), ("gpt", "dots", False), ("gpt", "none", True), ("gpt", "full", True),
    ("bert", "dots", True),
])
def test_remat_and_scan_give_the_plain_losses(data_dir, tmp_path, kind, remat, scan):
    plain = trainer(data_dir, tmp_path / "a", kind)
    other = trainer(data_dir, tmp_path / "b", kind, **{"precision.remat": remat, "precision.scan_layers": scan})
    state_a, losses_a = run_steps(plain, 3)
    state_b, losses_b = run_steps(other, 3)
    np.testing.assert_allclose(losses_a, losses_b, atol=1e-5, rtol=0)
    assert max_diff(flat_state(state_a["params"]), per_layer(flat_state(state_b["params"]))) < 1e-5


def per_layer(flat: dict) -> dict:
    """Stacked-layer entries (``….layers.<name>``, ``[L, ...]``) split into ``….layers.<i>.<name>``."""
    out = {}
    for name, value in flat.items():
        head, sep, rest = name.partition(".layers.")
        if sep and not rest.split(".")[0].isdigit():
            out.update({f"{head}.layers.{i}.{rest}": value[i] for i in range(value.shape[0])})
        else:
            out[name] = value
    return out


def test_dropout_depends_on_seed_and_step_only(data_dir, tmp_path):
    """Two runs of the same step give the same loss; different steps (or seeds) draw different masks."""
    t = trainer(data_dir, tmp_path, "gpt", **{"model.dropout": 0.3, "precision.scan_layers": True})
    state, rest = t.initial_state()
    batch = global_batch(next(t.train_iterator()), t.batch_sharding)
    copy = jax.tree.map(jnp.copy, state)
    _, first = t._train_step(state, rest, batch, jnp.bool_(True))
    _, again = t._train_step(jax.tree.map(jnp.copy, copy), rest, batch, jnp.bool_(True))
    assert float(first["loss"]) == float(again["loss"])
    later = {**jax.tree.map(jnp.copy, copy), "step": jnp.int32(7)}
    _, other = t._train_step(later, rest, batch, jnp.bool_(True))
    assert float(other["loss"]) != float(first["loss"])
    # Dropout on: a different loss than the deterministic evaluation of the same parameters.
    evaluated = t._eval_step(copy["params"], rest, batch)
    assert abs(float(evaluated["loss_sum"] / evaluated["tokens"]) - float(first["loss"])) > 1e-4


def test_compute_dtype_bfloat16_runs_with_fp32_parameters(data_dir, tmp_path):
    t = trainer(data_dir, tmp_path, "gpt", **{"precision.compute_dtype": "bfloat16"})
    state, losses = run_steps(t, 2)
    assert all(np.isfinite(losses))
    assert {leaf.dtype for leaf in jax.tree.leaves(state["params"])} == {jnp.dtype("float32")}


@pytest.mark.slow_variants
@pytest.mark.parametrize("kind", ["gpt", "bert"])
def test_evaluation_covers_a_split_smaller_than_one_batch(data_dir, tmp_path, kind):
    """The tiny run's validation split (hundreds of examples of 32 tokens) is smaller than a batch of 2,048: it is
    still evaluated, every scored token counted once, padding rows weighted out (the same loss as batches of 8)."""
    small = trainer(data_dir, tmp_path / "a", kind, eval_batches=0)
    big = trainer(data_dir, tmp_path / "b", kind, batch_size=2048, eval_batches=0)
    assert len(big.sources["validation"]) < 2048
    state, rest = small.initial_state()
    expected = small.evaluate(state["params"], rest)
    got = big.evaluate(state["params"], rest)
    assert got is not None and got["val_tokens"] == expected["val_tokens"] > 0
    np.testing.assert_allclose(got["val_loss"], expected["val_loss"], rtol=1e-5)
    if kind == "gpt":  # every position is scored but a document's last one (its target opens the next document)
        records = small.sources["validation"]
        segments = np.stack([records[i]["segment_ids"] for i in range(len(records))])
        assert got["val_tokens"] == int((segments[:, 1:] == segments[:, :-1]).sum()) > len(records) * 24



@pytest.mark.slow_variants
@pytest.mark.parametrize("kind, chunk", [("gpt", 12), ("bert", 3)])
def test_chunked_loss_in_the_loop_gives_the_plain_losses(data_dir, tmp_path, kind, chunk):
    """``precision.loss_chunk`` changes how the loss is computed, not its value or the update."""
    plain = trainer(data_dir, tmp_path / "a", kind)
    chunked = trainer(data_dir, tmp_path / "b", kind, **{"precision.loss_chunk": chunk})
    state_a, losses_a = run_steps(plain, 2)
    state_b, losses_b = run_steps(chunked, 2)
    np.testing.assert_allclose(losses_a, losses_b, atol=1e-5, rtol=0)
    assert max_diff(flat_state(state_a["params"]), flat_state(state_b["params"])) < 1e-5
