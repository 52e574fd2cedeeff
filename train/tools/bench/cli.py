"""The command line of ``python -m flaxzoo.train.bench`` (:func:`parse_args`) and the run (:func:`main`): each workload
``--rounds`` times, flaxzoo then (``--compare transformers,keras_hub``) each comparison within each round, the peak
measured beside every round (``flaxzoo.train.tools.bench.common``), each side's median round and the median per-round
ratio."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import jax

from flaxzoo.models.layers.attention_core import attention_backend
from flaxzoo.train import flops as flopslib
from flaxzoo.train.tools.bench.common import add_mfu, machine, median_round, report_line, round_peak
from flaxzoo.train.tools.bench.generation import run_generate
from flaxzoo.train.tools.bench.main_job import run_main_job
from flaxzoo.train.tools.bench.smollm2 import SMOLLM2_VARIANTS, run_smollm2_variant, run_smollm2_workload
from flaxzoo.train.tools.bench.t5 import run_t5_workload
from flaxzoo.train.tools.bench.training import run_train
from flaxzoo.train.tools.bench.workloads import CPU_WORKLOADS, WORKLOADS, workload_spec

DESCRIPTION = ("``python -m flaxzoo.train.bench --work NAME [--json] [--compare transformers,keras_hub]``: the "
               "benchmark workloads.")
COMPARES = ("transformers", "keras_hub", "llama.cpp")
KERAS_HUB_WORKLOADS = ("gpt_generate", "gpt_train", "bert_train")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: ``args.works`` holds the workload names (empty for ``gpu`` and ``classify``); a
    bad value exits with one line naming the flag and what it expects."""
    parser = argparse.ArgumentParser(prog="python -m flaxzoo.train.bench", description=DESCRIPTION)
    parser.add_argument("--work", default="gpt_train",
                        help=f"a workload or a comma-separated list: {', '.join(WORKLOADS)}; 'cpu' = the three CPU "
                             "ones; "
                             "'gpu' = the accelerator check of train/tools/gpu_check.py (--tiny passes on); 'classify' = "
                             "serving a headline classifier beside transformers (train/tools/bench/classify.py)")
    parser.add_argument("--json", action="store_true", help="print one JSON line per workload")
    parser.add_argument("--compare", help="also run, in this process, transformers (PyTorch) and/or (gpt_generate, "
                                          "gpt_train, bert_train) keras_hub (KerasHub on jax): one or a comma-separated list; "
                                          "smollm2_generate: llama.cpp (llama-cpp-python) on the same GGUF")
    parser.add_argument("--quantize", help="smollm2_generate: also run the model loaded with from_pretrained(..., "
                                           "quantize=QUANTIZE); accepted: int8")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # smollm2_generate: one side, in a subprocess
    parser.add_argument("--batch", type=int, help="batch size (default: the workload's)")
    parser.add_argument("--seq", type=int, help="sequence length (default: the workload's)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the workload (and the comparison) this many times; report each side's median "
                             "round and the median per-round ratio")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--generate-repeats", type=int, default=3, help="timed generate calls (median reported)")
    parser.add_argument("--new-tokens", type=int, help="gpt_generate: new tokens (default 128; t5_generate: 64)")
    parser.add_argument("--layers", type=int, help="override the number of layers")
    parser.add_argument("--hidden", type=int, help="override the width (MLP = 4x)")
    parser.add_argument("--heads", type=int, help="override the number of heads")
    parser.add_argument("--vocab", type=int, help="override the vocabulary size")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and batch (tests, smoke runs)")
    parser.add_argument("--remat", choices=["none", "full", "dots"],
                        help="layer remat policy (default: dots on CPU, none on accelerators)")
    parser.add_argument("--attention", choices=["auto", "softmax", "fused"],
                        help="attention core (default auto: cuDNN-capable jax.nn.dot_product_attention on GPU, the "
                             "closed-form-backward kernel elsewhere)")
    parser.add_argument("--scan-layers", action=argparse.BooleanOptionalAction,
                        help="run the layer stack as one lax.scan (default: on)")
    parser.add_argument("--profile", metavar="DIR",
                        help="after timing, trace 3 steps (1 generate call) into DIR and print the operations that "
                             "took the most time")
    parser.add_argument("--peak-size", type=int, default=flopslib.CPU_PEAK_SIZE,
                        help="CPU: matmul size of the peak measured beside each round (the training loop uses the "
                             "default)")
    parser.add_argument("--loss-chunk", type=int, default=0,
                        help="positions per cross-entropy chunk (0 = the whole sequence at once; see flaxzoo.train.losses)")
    parser.add_argument("--classifier", metavar="WORKDIR",
                        help="classify: a fine-tuned work directory (default: the packaged MiniLM with a 5-class head)")
    parser.add_argument("--headlines", type=int, default=256, help="classify: how many headlines to time")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.compares = tuple(c.strip() for c in args.compare.split(",")) if args.compare is not None else ()
    for side in args.compares:
        if side not in COMPARES or args.compares.count(side) > 1:
            parser.error(f"--compare {args.compare!r}: expected one of {', '.join(COMPARES)} or a comma-separated "
                         "list of them, each once")
    args.compare = ",".join(args.compares) or None
    if args.loss_chunk < 0:
        parser.error(f"--loss-chunk {args.loss_chunk}: expected 0 (off) or a positive number of positions")
    if args.work in ("gpu", "classify"):
        args.works = ()
        return args
    names = CPU_WORKLOADS if args.work == "cpu" else tuple(w.strip() for w in args.work.split(","))
    for name in names:
        if name not in WORKLOADS:
            parser.error(f"--work {name!r}: expected one of {', '.join(WORKLOADS)}, 'cpu' or 'gpu'")
    args.works = names
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: expected a positive integer")
    if args.generate_repeats < 1:
        parser.error(f"--generate-repeats {args.generate_repeats}: expected a positive integer")
    for flag, value in (("--batch", args.batch), ("--new-tokens", args.new_tokens)):
        if value is not None and value < 1:
            parser.error(f"{flag} {value}: expected a positive integer")
    smollm2 = "smollm2_generate" in names
    if args.quantize is not None:
        from flaxzoo.models.adapters.quantize import QUANTIZE_TYPES

        if not smollm2:
            parser.error(f"--quantize {args.quantize}: only the smollm2_generate workload loads quantised models")
        if args.quantize not in QUANTIZE_TYPES:
            parser.error(f"--quantize {args.quantize!r}: expected one of {', '.join(QUANTIZE_TYPES)}")
    if "llama.cpp" in args.compares and len(args.compares) > 1:
        parser.error(f"--compare {args.compare}: llama.cpp (smollm2_generate only) is compared alone")
    if "keras_hub" in args.compares and not set(names) <= set(KERAS_HUB_WORKLOADS):
        parser.error(f"--compare keras_hub: only the {', '.join(KERAS_HUB_WORKLOADS)} workloads have a KerasHub "
                     f"counterpart (got --work {args.work})")
    if args.compare == "llama.cpp" and set(names) != {"smollm2_generate"}:
        parser.error("--compare llama.cpp: only the smollm2_generate workload has a llama.cpp counterpart "
                     f"(got --work {args.work})")
    if "transformers" in args.compares and smollm2:
        parser.error("--compare transformers: smollm2_generate compares with llama.cpp (--compare llama.cpp)")
    if args.variant is not None and args.variant not in SMOLLM2_VARIANTS:
        parser.error(f"--variant {args.variant!r}: expected one of {', '.join(SMOLLM2_VARIANTS)}")
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Run the command line's workloads; print a summary per workload (one JSON line each with ``--json``) and
    return the results."""
    args = parse_args(argv)
    if args.work == "gpu":
        from flaxzoo.train.tools import gpu_check

        raise SystemExit(gpu_check.main(["--tiny"] if args.tiny else []))
    if args.work == "classify":
        from flaxzoo.train.tools.bench.classify import run_classify

        result = run_classify(args)
        if args.json:
            print(json.dumps(result), flush=True)
        return [result]
    if args.profile and "xla_cpu_enable_xprof_traceme" not in os.environ.get("XLA_FLAGS", ""):
        # Must be set before the backend starts (the first jax.devices() below): CPU ops then show in the trace.
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true").strip()
    if args.variant is not None:  # one side of smollm2_generate, in the subprocess the parent started
        result = run_smollm2_variant(args.variant, args)
        print(json.dumps(result), flush=True)
        return [result]
    runners = dict(smollm2_generate=run_smollm2_workload, t5_generate=run_t5_workload)
    return [runners[name](args) if name in runners else run_workload(name, args) for name in args.works]


def run_workload(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One workload, ``args.rounds`` rounds. A round measures the peak (on CPU: now, beside the work), runs flaxzoo,
    then each ``--compare`` side in the order given (transformers; keras_hub for gpt_generate, gpt_train, bert_train); each side's MFU is
    against that round's peak (``common.add_mfu``: never above 1). The result is flaxzoo's median round with, per
    side, its median round (``transformers``, ``keras_hub``), the median of the per-round tokens/s ratios flaxzoo /
    side (``ratio``, ``keras_hub_ratio``) and the ratios of every round (``round_ratios``,
    ``keras_hub_round_ratios``)."""
    spec = workload_spec(name, args)
    training = name != "gpt_generate"  # training batches are packed: segment_ids make a document mask
    backend, why = attention_backend(spec["config"], q_len=spec["seq"], masked=training, training=training)
    result = dict(work=name, framework="flaxzoo (jax)", machine=machine(), jax=jax.__version__,
                  dtype=spec["config"].dtype, attention=backend, attention_reason=why, remat=spec["config"].remat,
                  scan_layers=spec["config"].scan_layers, batch=spec["batch"], seq=spec["seq"])
    if not args.json:
        shape = (f"batch {spec['batch']}, prompt {spec['prompt']} + {spec['new_tokens']} new"
                 if name == "gpt_generate" else f"batch {spec['batch']} x {spec['seq']}")
        peak = ("measured beside each round" if jax.devices()[0].platform == "cpu"
                else f"{flopslib.device_peak(jax.devices()[:1])[0] / 1e9:,.0f} GFLOP/s")
        # Decoding runs its layers one by one whatever the training layout says (models/layers/DECODING.md).
        decoding = name == "gpt_generate"
        layers = ("decode: layers one by one, cached attention" if decoding
                  else f"remat {spec['config'].remat}, scan {spec['config'].scan_layers}")
        print(f"{name} [{machine()}, {shape}, {spec['config'].dtype}, {'prefill ' if decoding else ''}attention "
              f"{backend} ({why}), {layers}, peak {peak}]", flush=True)
    ours_rounds: list[dict[str, Any]] = []
    # --compare's sides in the order given (llama.cpp never reaches here: smollm2_generate runs in smollm2.py).
    theirs_rounds: dict[str, list[dict[str, Any]]] = {side: [] for side in args.compares}
    for round_index in range(args.rounds):
        peak, peak_kind = round_peak(args.peak_size)
        if name == "gpt_generate":
            ours = run_generate(spec, args)
        elif name == "main_gpt_train":
            ours = run_main_job(spec, args)
        else:
            ours = run_train(name, spec, args)
        ours_rounds.append(add_mfu(ours, peak, peak_kind, args.peak_size))
        if not args.json:
            label = f"round {round_index + 1}, flaxzoo:" if args.rounds > 1 else "flaxzoo:"
            print(f"  {label:<25s} {report_line(name, ours)}", flush=True)
            if ours["profile"]:
                print_profile(ours["profile"], os.path.join(args.profile, name),
                              "call" if name == "gpt_generate" else "step")
        for side, rounds in theirs_rounds.items():
            if side == "keras_hub":
                from flaxzoo.train.tools.bench.keras_side import run_keras_hub_round

                rounds.append(run_keras_hub_round(name, spec, args, peak, peak_kind))
            else:
                rounds.append(run_transformers_round(name, spec, args, peak, peak_kind))
            if not args.json:
                label = f"round {round_index + 1}, {side}:" if args.rounds > 1 else f"{side}:"
                print(f"  {label:<25s} {report_line(name, rounds[-1])}", flush=True)
                if rounds[-1].get("profile"):
                    print_profile(rounds[-1]["profile"], os.path.join(args.profile, f"{name}_{side}"), "step")
    # Each side's median round; a ratio is the median of the per-round ratios (a round's runs are seconds apart, so
    # a shared machine's slow phases cancel in its ratio).
    result.update(median_round(ours_rounds), rounds=args.rounds)
    for side, rounds in theirs_rounds.items():
        ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(ours_rounds, rounds)]
        prefix = "" if side == "transformers" else f"{side}_"  # transformers keeps the keys it always had
        result[side] = median_round(rounds)
        result[f"{prefix}ratio"] = statistics.median(ratios)
        result[f"{prefix}round_ratios"] = [round(r, 3) for r in ratios]
        if not args.json:
            print(f"  ratio (flaxzoo / {side}): {result[f'{prefix}ratio']:.2f}x"
                  + (f" (median of rounds: {', '.join(f'{r:.2f}' for r in ratios)})" if args.rounds > 1 else ""),
                  flush=True)
    if args.json:
        print(json.dumps(result), flush=True)
    return result


def print_profile(rows: list[dict[str, Any]], directory: str, unit: str) -> None:
    """``profile_ops``' rows, one line each."""
    print(f"  profile ({directory}), ms per {unit}:")
    for row in rows:
        print(f"    {row['ms_per_call']:9.2f} ms  x{row['count_per_call']:<6g} {row['op']}  {row['label']}")


def run_transformers_round(name: str, spec: dict[str, Any], args: argparse.Namespace, peak: float,
                           peak_kind: str) -> dict[str, Any]:
    """The transformers side of one round (imported only here), its MFU against the round's peak."""
    import torch
    import transformers

    from flaxzoo.train.tools.bench.transformers_side import run_transformers

    time.sleep(1.0)  # let the other framework's worker threads go idle
    theirs = run_transformers(name, spec, args)
    theirs.update(framework=f"transformers {transformers.__version__} + torch {torch.__version__}")
    return add_mfu(theirs, peak, peak_kind, args.peak_size)
