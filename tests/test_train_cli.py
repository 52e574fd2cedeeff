"""``python -m flaxzoo.train`` end to end with shortened settings: metrics, checkpoints, samples, exact resume after SIGKILL,
SIGTERM, damaged checkpoints, a non-finite loss, masked-LM pre-training."""

import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys

import pytest

from flaxzoo.train import exit_codes

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from train_helper import TINY_MODEL_XLA_FLAGS, as_flags, overrides  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
STEPS = 40


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.getbasetemp() / "train_data")


def command(workdir, data_dir, kind="gpt", **extra):
    return [sys.executable, "-m", "flaxzoo.train", *as_flags(kind, overrides(kind, data_dir, **extra)), "--workdir",
            str(workdir)]


def env():
    return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1", "XLA_FLAGS": TINY_MODEL_XLA_FLAGS}


def run(workdir, data_dir, kind="gpt", timeout=300, **extra):
    proc = subprocess.run(command(workdir, data_dir, kind, **extra), cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=timeout)
    return proc


def metrics(workdir):
    return [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def losses(workdir):
    return {row["step"]: row["loss"] for row in metrics(workdir)}


def checkpoint_steps(workdir):
    root = pathlib.Path(workdir) / "checkpoints"
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())


def run_until(workdir, data_dir, step, sig, **extra):
    """Start a run, send ``sig`` once it has logged ``step``; returns (returncode, stdout, stderr)."""
    proc = subprocess.Popen(command(workdir, data_dir, **extra), cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(f"step {step}/"):
                proc.send_signal(sig)
                break
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, "".join(lines) + out, err


@pytest.fixture(scope="session")
def baseline(tmp_path_factory, data_dir):
    """40 uninterrupted steps of the tiny GPT (the reference for the resume tests), steps 2..3 profiled."""
    workdir = tmp_path_factory.mktemp("baseline")
    proc = run(workdir, data_dir, profile_steps="2:3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return workdir, proc


def test_end_to_end_metrics_checkpoints_sample(baseline):
    workdir, proc = baseline
    rows = metrics(workdir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all({"step", "loss", "tokens_per_s", "mfu", "lr", "grad_norm"} <= r.keys() for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5
    assert "val_loss" in rows[-1] and rows[-1]["val_perplexity"] > 1
    assert checkpoint_steps(workdir) == [30, 35, 40]  # every 5 steps, the last 3 kept
    step_dir = pathlib.Path(workdir) / "checkpoints" / "40"
    assert {"state", "meta"} <= {p.name for p in step_dir.iterdir()}
    meta = json.loads((step_dir / "meta" / "metadata").read_text())
    assert meta["format"] == "flaxzoo" and meta["version"] == 1 and meta["model_class"] == "GPTForCausalLM"
    assert meta["config"]["hidden_size"] == 32 and meta["train_config"]["steps"] == STEPS and meta["step"] == 40
    assert meta["data_position"] == 40  # the next global batch: the data position is the step
    assert (pathlib.Path(workdir) / "tokenizer.json").is_file()
    assert list((pathlib.Path(workdir) / "tensorboard").glob("events.out.tfevents.*"))
    assert "sample at step 40: 'Return the" in proc.stdout
    assert "eval at step 40: loss" in proc.stdout and "unigram baseline" in proc.stdout
    assert "done: steps 1..40" in proc.stdout and "MFU" in proc.stdout
    assert "profile of steps 2..3" in proc.stdout
    # The tiny model has 2 layers: precision "auto" on CPU is unrolled without remat, said at start-up.
    assert "remat none (auto), scan_layers False (auto)" in proc.stdout
    assert meta["train_config"]["precision"]["scan_layers"] is False and meta["train_config"]["mesh"]["data"] == 1
    assert list((pathlib.Path(workdir) / "profile").glob("plugins/profile/*/*.xplane.pb"))


def test_parameters_load_from_the_checkpoint(baseline):
    import numpy as np

    from flaxzoo.train.checkpoint import load_params

    model, step = load_params(baseline[0])
    assert step == 40 and type(model).__name__ == "GPTForCausalLM"
    logits = model(np.array([[1, 2, 3]]))
    assert logits.shape == (1, 3, 512) and bool(np.isfinite(np.asarray(logits)).all())


@pytest.mark.slow
def test_sigkill_then_restart_gives_bit_identical_losses(baseline, data_dir, tmp_path):
    kill_at = random.Random(1234).randint(10, 30)
    print(f"SIGKILL at step {kill_at}")
    workdir = tmp_path / "w"
    code, out, err = run_until(workdir, data_dir, kill_at, signal.SIGKILL)
    assert code == -signal.SIGKILL, (code, out[-2000:], err[-3000:])
    killed_after = max(losses(workdir))
    assert killed_after < STEPS
    proc = run(workdir, data_dir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    resumed = [line for line in proc.stdout.splitlines() if line.startswith("resumed from checkpoint at step")]
    assert resumed, proc.stdout[-2000:]
    restart = int(resumed[0].split()[5])
    print(f"killed after step {killed_after}, restarted from the checkpoint of step {restart}")
    assert 5 <= restart <= max(kill_at + 5, 30) and restart % 5 == 0
    expected, got = losses(baseline[0]), losses(workdir)
    assert sorted(got) == list(range(1, STEPS + 1))
    after = [s for s in range(restart + 1, STEPS + 1)]
    assert after and [got[s] for s in after] == [expected[s] for s in after]  # bit-identical floats
    # The steps before the restart (from the killed run) agree too.
    assert [got[s] for s in range(1, restart + 1)] == [expected[s] for s in range(1, restart + 1)]


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_75_then_the_rerun_finishes_with_0(baseline, data_dir, tmp_path):
    workdir = tmp_path / "w"
    code, out, err = run_until(workdir, data_dir, 12, signal.SIGTERM)
    assert code == exit_codes.PREEMPTED == 75, (out[-2000:], err[-3000:])
    assert "SIGTERM received" in out and "resume with the same command" in out
    last = max(losses(workdir))
    assert last < STEPS and last in checkpoint_steps(workdir)
    proc = run(workdir, data_dir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert f"resumed from checkpoint at step {last}" in proc.stdout
    assert f"results in {workdir}" in proc.stdout and "tensorboard --logdir" in proc.stdout
    assert losses(workdir)[STEPS] == losses(baseline[0])[STEPS]


def truncate_largest_file(step_dir):
    files = [p for p in pathlib.Path(step_dir).rglob("*") if p.is_file()]
    largest = max(files, key=lambda p: p.stat().st_size)
    size = largest.stat().st_size
    with open(largest, "r+b") as fh:
        fh.truncate(size // 2)
    return largest


@pytest.mark.slow
def test_damaged_latest_checkpoint_resumes_from_the_previous_one(baseline, data_dir, tmp_path):
    workdir = tmp_path / "w"
    shutil.copytree(baseline[0], workdir)
    truncate_largest_file(workdir / "checkpoints" / "40" / "state")
    proc = run(workdir, data_dir, steps=STEPS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "checkpoint at step 40 is damaged" in proc.stdout
    assert "resumed from checkpoint at step 35" in proc.stdout
    assert checkpoint_steps(workdir) == [30, 35, 40]  # the good ones untouched, 40 written afresh
    assert (workdir / "damaged_checkpoints" / "40").is_dir()  # kept, not deleted
    expected = losses(baseline[0])
    assert [losses(workdir)[s] for s in range(36, 41)] == [expected[s] for s in range(36, 41)]


@pytest.mark.slow  # a training process of its own
def test_no_good_checkpoint_stops_with_a_clear_message(baseline, data_dir, tmp_path):
    workdir = tmp_path / "w"
    shutil.copytree(baseline[0], workdir)
    for step in (30, 35, 40):
        truncate_largest_file(workdir / "checkpoints" / str(step) / "state")
    proc = run(workdir, data_dir, steps=STEPS + 5)
    assert proc.returncode == 1
    assert "no good checkpoint" in proc.stderr and "30, " not in proc.stderr.split("step(s)")[0]
    assert sorted(p.name for p in (workdir / "damaged_checkpoints").iterdir()) == ["30", "35", "40"]
    assert not (workdir / "checkpoints" / "45").exists()


@pytest.mark.slow
def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(baseline, data_dir, tmp_path):
    workdir = tmp_path / "w"
    shutil.copytree(baseline[0], workdir)
    proc = run(workdir, data_dir, steps=STEPS + 10, **{"optim.lr": 1e30, "optim.warmup_steps": 0,
                                                      "optim.grad_clip": 0.0})
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    message = [line for line in proc.stderr.splitlines() if "non-finite training loss at step" in line]
    assert message and "the last good checkpoint is step 40" in message[0]
    step = int(message[0].split("at step ")[1].split()[0])
    assert 41 <= step <= STEPS + 10
    assert checkpoint_steps(workdir) == [30, 35, 40]


@pytest.mark.slow
def test_bert_pretraining_reports_masked_token_accuracy(data_dir, tmp_path):
    proc = run(tmp_path / "w", data_dir, kind="bert", steps=10, checkpoint_every=0, eval_every=10)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "masked-token accuracy" in proc.stdout
    assert "sample at step 10: 'masked positions as [predicted|original]" in proc.stdout
    rows = metrics(tmp_path / "w")
    assert 0.0 <= rows[-1]["val_accuracy"] <= 1.0
    assert checkpoint_steps(tmp_path / "w") == [10]


@pytest.mark.slow  # a training process of its own
def test_an_error_after_the_first_step_exits_1_and_before_it_2(data_dir, tmp_path):
    """Exit code 2 means nothing was computed (a bad config or input); a ValueError once training runs is a run
    failure (1). The failure is simulated by a metrics writer that raises, in a real ``python -m flaxzoo.train`` process."""
    failing = ("import sys, flaxzoo.train.pretrain as pretrain\n"
               "def write(self, row):\n    raise ValueError('disk full (simulated)')\n"
               "pretrain.MetricsWriter.write = write\n"
               "from flaxzoo.train.__main__ import main\nsys.exit(main(sys.argv))\n")
    flags = [*as_flags("gpt", overrides("gpt", data_dir, steps=3)), "--workdir", str(tmp_path / "a")]
    proc = subprocess.run([sys.executable, "-c", failing, *flags], cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "error: disk full (simulated)" in proc.stderr
    proc = run(tmp_path / "b", data_dir, **{"data.source": "files", "data.paths": "/nonexistent/*.txt"})
    assert proc.returncode == 2, proc.stderr[-3000:]


def test_closing_line_says_when_nothing_was_left_to_do():
    """Resumed at or past the last step: no "steps 801..800"; a normal or stopped run keeps its step range."""
    from flaxzoo.train.__main__ import steps_done
    from flaxzoo.train.pretrain import Summary

    def line(start: int, last: int, stopped_by: str | None = None) -> str:
        return steps_done(Summary(workdir="w", start_step=start, last_step=last, stopped_by=stopped_by), 800, 12.3)

    assert line(800, 800) == "done: nothing to do, already at step 800 of 800"
    assert line(900, 900) == "done: nothing to do, already at step 900 of 800"
    assert line(0, 800) == "done: steps 1..800 in 12 s wall time"
    assert line(600, 800) == "done: steps 601..800 in 12 s wall time"
    assert line(0, 40, "SIGTERM") == "stopped by SIGTERM: steps 1..40 of 800 in 12 s wall time"
    assert line(40, 40, "SIGTERM") == "stopped by SIGTERM: before any step, at step 40 of 800 in 12 s wall time"
