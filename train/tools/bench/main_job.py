"""``main_gpt_train``: the main job, ``python -m flaxzoo.train --config gpt_train`` (the ``gpt_train`` model and batch
on the embedded corpus: real data, the loop's metrics, its final evaluation), in a subprocess; its tokens/s is the
median of the loop's logging windows after the first, its MFU recomputed against this process's peak (measured beside
it). Put it beside ``gpt_train`` in one run (``--work gpt_train,main_gpt_train --rounds 3``) to compare the two."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from flaxzoo.models.modeling import param_count
from flaxzoo.train.tools.bench.workloads import train_flops_per_token


def run_main_job(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``python -m flaxzoo.train --config gpt_train`` for ``args.steps`` × 4 steps (logging every ``args.steps``) in a
    subprocess and a temporary work directory; the figures come from its ``metrics.jsonl``."""
    steps = max(args.steps, 2)
    with tempfile.TemporaryDirectory() as workdir:
        command = [sys.executable, "-m", "flaxzoo.train", "--config", "gpt_train", "--workdir", workdir,
                   f"--config.steps={4 * steps}", f"--config.log_every={steps}", f"--config.seed={args.seed}"]
        if args.tiny:
            command += ["--config.model.num_layers=2", "--config.model.hidden_size=64", "--config.model.num_heads=4",
                        "--config.model.vocab_size=512", "--config.data.vocab_size=512", "--config.batch_size=2",
                        "--config.model.intermediate_size=256", "--config.seq_len=32",
                        "--config.model.max_position_embeddings=32"]
        start = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True)
        wall_s = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited with {proc.returncode}: {proc.stderr[-2000:]}")
        with open(os.path.join(workdir, "metrics.jsonl")) as handle:
            rows = [json.loads(line) for line in handle if '"tokens_per_s"' in line]
    steady = [row["tokens_per_s"] for row in rows[1:]] or [rows[-1]["tokens_per_s"]]
    tokens_per_s = statistics.median(steady)
    fpt = train_flops_per_token(spec)
    return dict(profile=None, step_ms=1e3 * spec["batch"] * spec["seq"] / tokens_per_s, tokens_per_s=tokens_per_s,
                wall_s=wall_s, peak_memory_mb=float("nan"),
                memory_kind="not measured (subprocess)", params=param_count(spec["config"], spec["cls"]),
                flops_per_token=fpt, loss=rows[-1]["loss"], windows=[round(t, 1) for t in steady])
