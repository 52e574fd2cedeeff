"""``t5_generate``: the ``t5-small`` preset (T5 v1.0: 6 + 6 layers × 512, ReLU, tied head, vocabulary 32,128; dropout
0) with random weights (``--seed``), a random source of 32 tokens per row (ids in ``[2, vocab)``: no pad, no EOS), 64
greedy new tokens (EOS does not stop it), at batch 1 and 8 (``--batch`` for one size; batch ``b`` takes the first
``b`` rows of the same sources). flaxzoo's ``generate`` runs the encoder once, then the compiled decode loop; the
figures are new tokens/s (``batch · 64`` / call time), the first call (compile + run) and the median of
``--generate-repeats`` calls after it.

``--compare transformers``: the same weights (flaxzoo's model written by ``save_pretrained`` into a temporary
directory, read by ``transformers.T5ForConditionalGeneration.from_pretrained``, ``eval()``), the same sources,
``generate(input_ids, attention_mask, max_new_tokens=64, min_new_tokens=64, do_sample=False, num_beams=1)`` under
``torch.no_grad()``, PyTorch on all cores (``transformers_side.py``'s setting); its generation config has no EOS, as
flaxzoo's call (``eos_token_id=None``), so neither side ever stops early nor suppresses a token. Each round runs
flaxzoo's batch sizes, then transformers'; the ratio is flaxzoo / transformers per round, the median over
``--rounds``. Both sides must produce the same tokens for the first row (greedy on identical weights):
``same_tokens``, checked every round, and a mismatch stops the run. ``--tiny``: the ``t5-tiny`` preset, an 8-token
source, 8 new tokens, batch 1 and 2."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

import jax
import numpy as np

from flaxzoo.models.architectures.encoder_decoder.model import Seq2SeqForConditionalGeneration
from flaxzoo.models.families import get_preset
from flaxzoo.models.inference.generate import generate
from flaxzoo.models.modeling import create_model, param_count
from flaxzoo.train.tools.bench.common import machine, peak_memory_bytes, timed

T5_PRESET, T5_SOURCE, T5_NEW_TOKENS, T5_BATCHES = "t5-small", 32, 64, (1, 8)
T5_TINY = ("t5-tiny", 8, 8, (1, 2))


def t5_spec(args: argparse.Namespace) -> dict[str, Any]:
    """``{"config", "source", "new_tokens", "batches"}`` of ``t5_generate`` with the command line's overrides
    (``--tiny``, ``--batch``, ``--new-tokens``)."""
    preset, source, new, batches = T5_TINY if args.tiny else (T5_PRESET, T5_SOURCE, T5_NEW_TOKENS, T5_BATCHES)
    config = get_preset(preset, dropout=0.0, attention_dropout=0.0)
    return dict(config=config, source=source, new_tokens=args.new_tokens or new,
                batches=[args.batch] if args.batch is not None else list(batches))


def t5_sources(spec: dict[str, Any], seed: int) -> np.ndarray:
    """The sources of every side: ``[max(batches), source]`` int32 ids drawn uniformly from ``[2, vocab)`` by
    ``np.random.default_rng(seed)`` (no pad id 0, no EOS id 1); batch ``b`` takes the first ``b`` rows."""
    return np.random.default_rng(seed).integers(2, spec["config"].vocab_size, (max(spec["batches"]), spec["source"]),
                                                dtype=np.int32)


def _time_calls(call, batch: int, new: int, repeats: int) -> dict[str, Any]:
    """The first call (compile + run, for flaxzoo) and the median of ``repeats`` calls after it."""
    start = time.perf_counter()
    first = call()
    first_s = time.perf_counter() - start
    call_s = statistics.median(timed(call, 0, repeats))
    return dict(tokens_per_s=batch * new / call_s, first_call_s=first_s, call_s=call_s, step_ms=1e3 * call_s / new,
                first_row=np.asarray(first)[0].tolist())


def run_flaxzoo_side(model, sources: np.ndarray, spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """flaxzoo's side of one round: ``{batch: timing}`` (``first_row``: the start id and the new tokens)."""
    new, rows = spec["new_tokens"], {}
    for batch in spec["batches"]:
        ids = sources[:batch]
        mask = np.ones_like(ids)
        rows[str(batch)] = _time_calls(
            lambda: generate(model, ids, new, attention_mask=mask, eos_token_id=None).block_until_ready(),
            batch, new, args.generate_repeats)
    return rows


def load_transformers_side(model, directory: str) -> Any:
    """flaxzoo's ``model`` written with ``save_pretrained`` into ``directory`` and read back by transformers'
    ``T5ForConditionalGeneration`` (eval mode, no EOS in its generation config)."""
    import torch
    import transformers

    from flaxzoo.models.io import save_pretrained

    torch.set_num_threads(os.cpu_count() or 1)  # as transformers_side.run_transformers
    save_pretrained(model, directory)
    theirs = transformers.T5ForConditionalGeneration.from_pretrained(directory)
    theirs.eval()
    theirs.generation_config.eos_token_id = None  # as flaxzoo's eos_token_id=None: never stop, never suppress EOS
    return theirs


def run_transformers_side(model, sources: np.ndarray, spec: dict[str, Any], args: argparse.Namespace
                          ) -> dict[str, Any]:
    """transformers' side of one round, timed as flaxzoo's."""
    import torch

    time.sleep(1.0)  # let the other framework's worker threads go idle
    new, rows = spec["new_tokens"], {}
    for batch in spec["batches"]:
        ids = torch.from_numpy(sources[:batch].astype(np.int64))
        mask = torch.ones_like(ids)

        def call():
            with torch.no_grad():
                return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                      do_sample=False, num_beams=1)

        rows[str(batch)] = _time_calls(call, batch, new, args.generate_repeats)
    return rows


def run_t5_workload(args: argparse.Namespace) -> dict[str, Any]:
    """``t5_generate``, ``args.rounds`` rounds: flaxzoo's batch sizes, then (``--compare transformers``) transformers';
    per batch each side's median round and the median per-round ratio flaxzoo / transformers."""
    spec = t5_spec(args)
    config, new = spec["config"], spec["new_tokens"]
    compare = "transformers" in args.compares
    host = machine()
    model = create_model(config, Seq2SeqForConditionalGeneration, seed=args.seed)
    sources = t5_sources(spec, args.seed)
    if not args.json:
        print(f"t5_generate [{host}, {T5_TINY[0] if args.tiny else T5_PRESET} random weights (seed {args.seed}), "
              f"source {spec['source']} + {new} greedy new tokens, batch {', '.join(map(str, spec['batches']))}, "
              f"{config.dtype}, {args.rounds} round(s)]", flush=True)
    theirs_model, framework = None, None
    with tempfile.TemporaryDirectory() as directory:
        if compare:
            import torch
            import transformers

            theirs_model = load_transformers_side(model, directory)
            framework = f"transformers {transformers.__version__} + torch {torch.__version__}"
        rounds: list[dict[str, Any]] = []
        for round_index in range(args.rounds):
            sides = {"flaxzoo": run_flaxzoo_side(model, sources, spec, args)}
            if compare:
                sides["transformers"] = run_transformers_side(theirs_model, sources, spec, args)
                for batch in spec["batches"]:
                    ours, theirs = (sides[s][str(batch)]["first_row"] for s in ("flaxzoo", "transformers"))
                    if ours != theirs:
                        at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours),
                                                                                                   len(theirs)))
                        raise AssertionError(f"t5_generate round {round_index + 1}, batch {batch}: the first row's "
                                             f"tokens differ from position {at} (flaxzoo {ours[at:at + 8]}, "
                                             f"transformers {theirs[at:at + 8]})")
            rounds.append(sides)
            if not args.json:
                for side, rows in sides.items():
                    for batch, row in rows.items():
                        print(f"  round {round_index + 1}, {side:<12s} batch {batch:>2s}: {row['tokens_per_s']:8.1f} "
                              f"new tokens/s, {row['step_ms']:.2f} ms/token, call {row['call_s']:.3f} s, first call "
                              f"{row['first_call_s']:.2f} s", flush=True)
    memory, memory_kind = peak_memory_bytes()
    summary: dict[str, Any] = dict(
        work="t5_generate", machine=host, jax=jax.__version__, framework="flaxzoo (jax)",
        model=T5_TINY[0] if args.tiny else T5_PRESET, dtype=config.dtype, params=param_count(
            config, Seq2SeqForConditionalGeneration), source=spec["source"], new_tokens=new, rounds=args.rounds,
        generate_repeats=args.generate_repeats, batches={}, peak_memory_mb=memory / 2 ** 20, memory_kind=memory_kind)
    if compare:
        summary.update(transformers=framework, same_tokens=True)
    for batch in map(str, spec["batches"]):
        entry: dict[str, Any] = {}
        for side in rounds[0]:
            rows = [r[side][batch] for r in rounds]
            median = sorted(rows, key=lambda r: r["tokens_per_s"])[(len(rows) - 1) // 2]  # common.median_round's
            entry[side] = dict(tokens_per_s=median["tokens_per_s"], call_s=median["call_s"],
                               step_ms=median["step_ms"], first_call_s=rows[0]["first_call_s"],
                               tokens_per_s_rounds=[round(r["tokens_per_s"], 2) for r in rows])
        entry["first_row"] = rounds[0]["flaxzoo"][batch]["first_row"][:9]  # the start id and 8 new tokens
        if compare:
            ratios = [r["flaxzoo"][batch]["tokens_per_s"] / r["transformers"][batch]["tokens_per_s"] for r in rounds]
            entry.update(ratio=statistics.median(ratios), round_ratios=[round(r, 3) for r in ratios])
        summary["batches"][batch] = entry
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        print(f"  median of {args.rounds} round(s) [{host}]:")
        for batch, entry in summary["batches"].items():
            for side in rounds[0]:
                row = entry[side]
                print(f"    {side:<12s} batch {batch:>2s}: {row['tokens_per_s']:8.1f} new tokens/s, first call "
                      f"{row['first_call_s']:.2f} s")
            if compare:
                print(f"    ratio (flaxzoo / transformers) batch {batch}: {entry['ratio']:.2f}x (rounds: "
                      f"{', '.join(f'{r:.2f}' for r in entry['round_ratios'])}); same tokens (first row): "
                      f"{summary['same_tokens']}")
    return summary
