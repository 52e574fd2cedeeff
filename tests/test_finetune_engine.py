"""The fine-tuner on the training engine's machinery, run as users run it (``python -m flaxzoo.train --config
finetune_cls``) in processes of its own: SIGTERM then SIGKILL mid-run, each followed by the same command, end with the
uninterrupted run's classifier, predictions and macro-F1 bit for bit (exit codes 75, then 0); 2 processes x 2 CPU
devices give the losses of 1 process x 4 devices; a batch the devices do not divide is refused naming both numbers."""

import json
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from flaxzoo import models
from flaxzoo.train.config import ConfigError
from flaxzoo.train.finetune.config import FinetuneConfig, base_config

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from test_finetune import synthetic_rows, write_csv  # noqa: E402
from train_helper import helper_process_env as env  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
STEPS = 18  # 3 epochs of 6 batches of 16 (96 training rows)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, minilm_dir):
    """A random tiny Hugging Face BERT encoder, CSV files, a data directory; the config overrides of a shortened
    run (3 epochs, the head alone for 4 steps, a checkpoint every 3 steps, a logged row every step)."""
    root = tmp_path_factory.mktemp("finetune_engine")
    torch.manual_seed(1)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64)
    transformers.BertModel(config).eval().save_pretrained(root / "encoder")
    train = write_csv(root / "train.csv", synthetic_rows(96, seed=3))
    test = write_csv(root / "test.csv", synthetic_rows(30, seed=4))
    values = {"init_from": root / "encoder", "tokenizer": minilm_dir, "epochs": 3, "batch_size": 16,
              "eval_batch_size": 16, "freeze_steps": 4, "log_every": 1, "checkpoint_every": 3, "optim.lr": 3e-3,
              "vocab.frequent": False, "data.source": "files", "data.train_path": train, "data.test_path": test,
              "data.data_dir": root / "data", "data.max_len": 32}
    return {"root": root, "values": values}


def command(inputs, workdir, **extra) -> list[str]:
    values = {**inputs["values"], **extra}
    return ["--config", "finetune_cls", "--workdir", str(workdir), *(f"--config.{k}={v}" for k, v in values.items())]


def run(args, timeout=300, **extra_env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "multihost_helper", "train", *args], cwd=REPO, env=env(**extra_env),
                          capture_output=True, text=True, timeout=timeout)


def run_until(args, line_start: str, signum: int, tmp_path) -> tuple[int, str]:
    """Run the fine-tune (0.3 s after each logged step), send ``signum`` when a line starts with ``line_start``;
    return ``(exit code, stdout)``."""
    with open(tmp_path / f"stderr{signum}", "w") as err_file:
        proc = subprocess.Popen([sys.executable, "-m", "multihost_helper", "train", *args], cwd=REPO,
                                env=env(FLAXZOO_TEST_STEP_DELAY="0.3"), stdout=subprocess.PIPE, stderr=err_file,
                                text=True)
        lines = []
        try:
            for line in proc.stdout:
                lines.append(line)
                if line.startswith(line_start):
                    proc.send_signal(signum)
                    break
            out, _ = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    return proc.returncode, "".join(lines) + out + (tmp_path / f"stderr{signum}").read_text()[-3000:]


def losses(workdir) -> dict[int, float]:
    rows = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    assert len({row["step"] for row in rows}) == len(rows), "a step logged twice"
    return {row["step"]: row["loss"] for row in rows}


def classifier_params(workdir) -> dict:
    model = models.from_pretrained(str(workdir))
    return {".".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.fixture(scope="module")
def uninterrupted(inputs):
    workdir = inputs["root"] / "uninterrupted"
    proc = run(command(inputs, workdir))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "results in" in proc.stdout and "tensorboard --logdir" in proc.stdout
    return workdir


@pytest.mark.slow
def test_sigterm_then_sigkill_then_rerun_ends_as_the_uninterrupted_run(inputs, uninterrupted, tmp_path):
    workdir = tmp_path / "interrupted"
    args = command(inputs, workdir)
    # SIGTERM inside the head-only phase: the run stops after a step with a checkpoint, exit code 75
    code, out = run_until(args, "step 2/", signal.SIGTERM, tmp_path)
    assert code == 75, out[-4000:]
    stopped = int(out.split("SIGTERM received: stopped after step ")[1].split(",")[0])
    assert 2 <= stopped < STEPS
    saved = sorted(int(p.name) for p in (workdir / "train_checkpoints").iterdir() if p.name.isdigit())
    assert saved[-1] == stopped and not (workdir / "eval" / "metrics.json").exists()
    # SIGKILL after the resume, past the freeze: nothing runs on the way out
    code, out = run_until(args, "step 9/", signal.SIGKILL, tmp_path)
    assert code == -signal.SIGKILL, out[-4000:]
    assert f"resumed from checkpoint at step {stopped}" in out
    proc = run(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed from checkpoint at step" in proc.stdout

    assert losses(workdir) == losses(uninterrupted)  # every step, bit for bit, logged once
    got, want = (json.loads((w / "eval" / "metrics.json").read_text()) for w in (workdir, uninterrupted))
    for key in ("macro_f1", "accuracy", "confusion_matrix", "report", "errors"):
        assert got[key] == want[key], key
    assert (workdir / "eval" / "errors.jsonl").read_text() == (uninterrupted / "eval" / "errors.jsonl").read_text()
    a, b = classifier_params(workdir), classifier_params(uninterrupted)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    # the finished work directory is left as it is by another run of the command
    again = run(args)
    assert again.returncode == 0 and "nothing to do" in again.stdout


@pytest.mark.multiprocess
def test_two_processes_of_two_devices_give_the_losses_of_one_process_of_four(inputs, tmp_path):
    """FSDP over the 4 devices of 2 processes: each process reads only the half of each stored matrix its devices
    hold (the encoder's init_from, shard by shard), and the run equals 1 process x 4 devices."""
    extra = {"epochs": 1, "freeze_steps": 2, "checkpoint_every": 0, "mesh.data": 1, "mesh.fsdp": 4}
    one = run(command(inputs, tmp_path / "one", **extra), JAX_NUM_CPU_DEVICES="4")
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "flaxzoo.train.launch", "--processes", "2", "--devices-per-process",
                          "2", "--module", "multihost_helper", "--", "train",
                          *command(inputs, tmp_path / "two", **extra)],
                         cwd=REPO, env=env(FLAXZOO_TEST_READS=str(tmp_path / "reads")), capture_output=True,
                         text=True, timeout=400)
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-5000:]
    assert "(2 process(es))" in two.stdout and "mesh data=1 x fsdp=4 x tensor=1" in two.stdout
    assert "sharding: backbone.embeddings.tokens.embedding (30522, 32): dimension 30522 (vocab) not split" in two.stdout
    from safetensors import safe_open

    with safe_open(inputs["root"] / "encoder" / "model.safetensors", "np") as stored:
        sizes = {name: stored.get_slice(name).get_shape() for name in stored.keys()}
    for i in range(2):
        reads = json.loads((tmp_path / f"reads.p{i}").read_text())
        matrices = {n: int(np.prod(shape)) for n, shape in sizes.items() if len(shape) == 2 and n in reads}
        assert len(matrices) >= 2 * 6  # per layer: q, k, v, o, up, down; and the embeddings
        for name, size in matrices.items():  # its half, read once; the token table (split over its rows only,
            whole = name == "embeddings.word_embeddings.weight"  # which 4 devices do not divide) whole everywhere
            assert reads[name] == (size if whole else size // 2), (i, name, reads[name], size)
        assert all(reads[n] <= int(np.prod(sizes[n])) for n in reads)  # nothing read twice
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert a.keys() == b.keys() == set(range(1, 7))
    assert max(abs(a[s] - b[s]) for s in a) <= 1e-5, (a, b)
    got, want = (json.loads((w / "eval" / "metrics.json").read_text()) for w in (tmp_path / "two", tmp_path / "one"))
    assert abs(got["macro_f1"] - want["macro_f1"]) <= 1e-6 and got["processes"] == 2 and want["processes"] == 1


@pytest.mark.parametrize("devices,mesh,batch,split_over", [(6, {"data": -1}, 32, 6), (4, {"data": 2, "fsdp": 2}, 18, 4),
                                                          (8, {"data": 2, "tensor": 4}, 15, 2)])
def test_a_batch_the_devices_do_not_divide_is_refused_naming_both_numbers(devices, mesh, batch, split_over):
    c = base_config()
    c.batch_size = batch
    c.mesh.update(mesh)
    with pytest.raises(ConfigError) as info:
        FinetuneConfig.from_config_dict(c, device_count=devices)
    message = str(info.value)
    assert message.startswith("batch_size") and f"{batch} is not divisible" in message, message
    assert f"= {split_over} devices" in message, message
