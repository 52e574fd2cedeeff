"""``python -m flaxzoo.train.tools.gpu_check --tiny`` on CPU: every check prints one JSON line with finite positive figures; a part
that runs out of time becomes a failed figure, not a hang."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

from flaxzoo.train.tools import bench, gpu_check
from flaxzoo.train import flops as flopslib

REPO = pathlib.Path(__file__).resolve().parent.parent
CHECKS = ("versions", "gpt2_small_train", "bert_base_train", "train_cli", "smollm2_decode_b1", "smollm2_decode_b16")


@pytest.mark.slow
def test_tiny_check_prints_every_figure(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "flaxzoo.train.tools.gpu_check", "--tiny", "--logs", str(tmp_path)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=240)
    figures = {f["check"]: f for f in map(json.loads, proc.stdout.splitlines())}
    assert set(figures) == set(CHECKS), proc.stdout
    failed = {name: f.get("error") for name, f in figures.items() if not f["ok"]}
    assert not failed and proc.returncode == 0, (failed, proc.stdout[-3000:])
    assert figures["versions"]["device_count"] >= 1 and figures["versions"]["jax"]
    for name in CHECKS[1:]:
        assert math.isfinite(figures[name]["tokens_per_s"]) and figures[name]["tokens_per_s"] > 0, figures[name]
    for name in ("gpt2_small_train", "bert_base_train", "train_cli"):
        assert math.isfinite(figures[name]["mfu"]) and figures[name]["mfu"] > 0, figures[name]
    assert figures["gpt2_small_train"]["peak_memory_mb"] > 0 and figures["gpt2_small_train"]["attention"]
    assert figures["gpt2_small_train"]["fused_attention_in_hlo"] == []  # no cuDNN on CPU
    for name, work in (("gpt2_small_train", "gpt_train"), ("bert_base_train", "bert_train")):
        spec = bench.workload_spec(work, bench.parse_args(["--work", work, "--tiny"]))
        assert figures[name]["flops_per_token"] == pytest.approx(flopslib.flops_per_token(
            spec["config"], spec["seq"], spec["cls"], predictions=spec["predictions"])), name  # the loop's count
    train = figures["train_cli"]
    assert train["exit_code"] == 0 and math.isfinite(train["first_loss"]) and math.isfinite(train["last_loss"])
    assert train["last_step"] > train["first_step"]
    assert {p.stem for p in tmp_path.glob("*.log")} == {"versions", "gpt2_small_train", "bert_base_train",
                                                         "train_cli", "smollm2_decode"}


def test_a_part_past_its_time_is_a_failed_figure(tmp_path):
    command = [sys.executable, "-c", "import time; print('{\"check\": \"x\", \"tokens_per_s\": 1.0}', flush=True); "
                                     "time.sleep(60)"]
    figures = gpu_check.run_part("x", command, gpu_check.own_figures, ("x", "y"), tmp_path, 2.0, None)
    assert [(f["check"], f["ok"]) for f in figures] == [("x", False), ("y", False)]
    assert all(f["error"] == "timed out after 2 s" for f in figures)


@pytest.mark.slow
def test_encoder_check_on_cpu_matches_the_definition():
    """``gpu_encoder_check --tiny`` on CPU: the biased padded call (with its bias gradient), the bidirectional window
    and the DeBERTa relative-table gradients within bfloat16's error of the float32 definition."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "flaxzoo.train.tools.gpu_encoder_check", "--tiny", "--parts",
                           "bias,window,deberta"], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    figures = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and all(f.get("ok", True) for f in figures), proc.stdout[-3000:]
    by_check = {(f["check"], f.get("impl")): f for f in figures}
    for check in ("bias", "window"):
        errors = by_check[(check, "auto")]["max_abs_error"]
        assert set(errors) == ({"out", "dq", "dk", "dv", "dbias"} if check == "bias" else {"out", "dq", "dk", "dv"})
        assert max(errors.values()) < 0.1 and errors["out"] > 0, errors  # bfloat16 inputs: errors ~1e-2, not 0
    for impl in ("auto", "softmax"):
        deberta = by_check[("deberta", impl)]
        assert deberta["tensors"] >= 1 and deberta["max_relative_error"] < 0.05, deberta
