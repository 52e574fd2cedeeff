"""The one training loop (``flaxzoo.train.engine``) with a task of the test's own: least squares by SGD. Its steps
equal the same SGD written in numpy; evaluations come at ``eval_every`` and the last step; checkpoints at
``checkpoint_every``; a run continued from a checkpoint equals the uninterrupted run; a non-finite loss stops the run
at its step, after the last good checkpoint and before any later one."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from etils import epath

from flaxzoo.train.engine import LoopSettings, Task, run_task
from flaxzoo.train.hooks import NonFiniteLossError

ROWS, FEATURES, BATCH, LR = 64, 5, 8, 0.05


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    y = (x @ rng.normal(size=FEATURES) + 0.1 * rng.normal(size=ROWS)).astype(np.float32)
    return x, y


class Batches:
    """Batch ``g`` is rows ``g*BATCH..`` (mod ROWS): the data position is the step."""

    def __init__(self, x, y, position):
        self.x, self.y, self.position = x, y, position

    def __next__(self):
        rows = (np.arange(BATCH) + self.position * BATCH) % ROWS
        self.position += 1
        return {"x": self.x[rows], "y": self.y[rows]}


class LeastSquares(Task):
    def __init__(self, workdir, steps, nan_at=None, **settings):
        self.workdir = epath.Path(workdir)
        self.settings = LoopSettings(steps=steps, **{"log_every": 2, **settings})
        self.devices = jax.devices()[:1]
        self.replicated = jax.sharding.SingleDeviceSharding(self.devices[0])
        self.wall_start = 0.0
        self.x, self.y = data()
        self.tx = optax.sgd(LR)
        self.evaluated: list[int] = []
        params = {"w": jnp.zeros(FEATURES)}
        self.fresh = {"params": params, "opt_state": self.tx.init(params), "step": jnp.int32(0)}
        self.target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=self.replicated),
                                   self.fresh)
        nan_at = -1 if nan_at is None else nan_at

        def step(state, rest, batch, with_accuracy):
            def loss_fn(params):
                return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)

            loss, grads = jax.value_and_grad(loss_fn)(state["params"])
            loss = jnp.where(state["step"] + 1 == nan_at, jnp.nan, loss)
            updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
            metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), "lr": jnp.float32(LR),
                       "accuracy": jnp.where(with_accuracy, -loss, 0.0)}
            return ({"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state,
                     "step": state["step"] + 1}, metrics)

        self.step = jax.jit(step)

    def identity(self):
        return {"model_class": "LeastSquares", "config": {"features": FEATURES}, "data": None, "base": None}

    def initial(self):
        return self.fresh, None

    def resumed(self, restored):
        return restored.state, None

    def batches(self, position):
        return Batches(self.x, self.y, position)

    def place(self, batch):
        return batch

    def step_fn(self, step):
        return self.step

    def evaluate_at(self, step, state, rest, writer):
        self.evaluated.append(step)
        return {"val_loss": float(np.mean((self.x @ np.asarray(state["params"]["w"]) - self.y) ** 2))}

    def meta(self):
        return self.identity()


def numpy_sgd(steps: int) -> np.ndarray:
    x, y = data()
    w = np.zeros(FEATURES, np.float64)
    for g in range(steps):
        rows = (np.arange(BATCH) + g * BATCH) % ROWS
        w -= LR * 2 * x[rows].T @ (x[rows] @ w - y[rows]) / BATCH
    return w


def rows(workdir):
    return [json.loads(line) for line in (epath.Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def test_the_engine_runs_a_task_as_plain_sgd_with_its_cadences(tmp_path):
    task = LeastSquares(tmp_path, 14, eval_every=5, checkpoint_every=4)
    result = run_task(task)
    np.testing.assert_allclose(np.asarray(result.state["params"]["w"]), numpy_sgd(14), rtol=1e-5, atol=1e-6)
    assert result.last_step == 14 and result.stopped_by is None and task.evaluated == [5, 10, 14]
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [8, 12, 14]  # keep 3: 4 went
    logged = rows(tmp_path)
    assert [r["step"] for r in logged] == [2, 4, 5, 6, 8, 10, 12, 14]  # every 2nd step, and the evaluations
    assert logged[-1]["val_loss"] == result.final_eval["val_loss"] < logged[0]["loss"]


def test_a_run_continued_from_its_checkpoint_equals_the_uninterrupted_run(tmp_path):
    whole = run_task(LeastSquares(tmp_path / "whole", 12, checkpoint_every=3))
    first = run_task(LeastSquares(tmp_path / "parts", 7, checkpoint_every=3))
    assert first.last_step == 7
    resumed = run_task(LeastSquares(tmp_path / "parts", 12, checkpoint_every=3))
    assert resumed.resumed_from == 7 and resumed.start_step == 7
    np.testing.assert_array_equal(np.asarray(resumed.state["params"]["w"]), np.asarray(whole.state["params"]["w"]))
    # the same rows, each once, but step 7 (logged and evaluated as the end of the first part) and step 8 (its
    # window holds steps 7-8 in the uninterrupted run, step 8 alone after the resume)
    without_time = [[{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows(tmp_path / w)
                     if r["step"] not in (7, 8)]
                    for w in ("parts", "whole")]
    assert without_time[0] == without_time[1]


def test_a_non_finite_loss_stops_at_its_step_and_no_checkpoint_holds_it(tmp_path):
    with pytest.raises(NonFiniteLossError, match="step 6 .* the last good checkpoint is step 4"):
        run_task(LeastSquares(tmp_path, 12, nan_at=6, checkpoint_every=2, log_every=5))
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [2, 4]
