"""``gpt_generate``: the ``gpt_train`` model decoding greedily with its KV cache (batch 1, a 32-token prompt, 128 new
tokens): the first call (compile + run) and the median of ``--generate-repeats`` calls after it. Its FLOPs are
forward-only (``flaxzoo.train.flops.forward_flops_per_token``: ``2N + 4·L·T̄·d`` per new token, ``T̄`` the mean
context length); decoding at batch 1 is memory-bound, so its MFU is low by nature: the memory roofline
(``flaxzoo.train.tools.roofline``: bytes per new token, the bandwidth measured beside the work, the fraction achieved) is
the figure to read."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np

from flaxzoo.models.architectures.decoder import GPTForCausalLM
from flaxzoo.models.inference.generate import generate
from flaxzoo.models.modeling import create_model, param_count
from flaxzoo.train import flops as flopslib
from flaxzoo.train.tools.bench.common import peak_memory_bytes, timed
from flaxzoo.train.tools.bench.op_profile import profile_ops
from flaxzoo.train.tools.roofline import roofline_fields, time_memory_bandwidth


def generate_prompt(spec: dict[str, Any], seed: int) -> np.ndarray:
    """``gpt_generate``'s prompt, the same for every side: ``[spec["batch"], spec["prompt"]]`` int32 ids drawn
    uniformly from the vocabulary by ``np.random.default_rng(seed)``."""
    return np.random.default_rng(seed).integers(0, spec["config"].vocab_size, (spec["batch"], spec["prompt"]),
                                                dtype=np.int32)


def run_generate(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Time greedy generation of ``spec["new_tokens"]`` tokens after a random ``spec["prompt"]``-token prompt; the
    first 8 new tokens of the first row come back as ``tokens``."""
    config = spec["config"]
    model = create_model(config, GPTForCausalLM, seed=args.seed)
    prompt = generate_prompt(spec, args.seed)
    new = spec["new_tokens"]
    start = time.perf_counter()
    first = generate(model, prompt, new).block_until_ready()
    first_s = time.perf_counter() - start
    times = timed(lambda: generate(model, prompt, new).block_until_ready(), 0, args.generate_repeats)
    call_s = statistics.median(times)
    tokens_per_s = spec["batch"] * new / call_s
    fpt = flopslib.forward_flops_per_token(config, spec["prompt"] + new / 2, GPTForCausalLM)
    memory, memory_kind = peak_memory_bytes()
    profile = (profile_ops(lambda: generate(model, prompt, new).block_until_ready(),
                           os.path.join(args.profile, "gpt_generate"), 1) if args.profile else None)
    roofline = roofline_fields(model, spec["batch"], spec["prompt"] + new / 2, tokens_per_s, time_memory_bandwidth(),
                               "measured matrix-vector read (beside the work)")
    return dict(**roofline, profile=profile, step_ms=1e3 * call_s / new, tokens_per_s=tokens_per_s,
                compile_s=first_s - call_s, first_call_s=first_s, call_s=call_s, peak_memory_mb=memory / 2 ** 20,
                memory_kind=memory_kind, params=param_count(config, GPTForCausalLM), flops_per_token=fpt,
                tokens=np.asarray(first)[0, spec["prompt"]:spec["prompt"] + 8].tolist())
