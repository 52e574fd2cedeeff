"""The training workloads (``gpt_train``, ``bert_train``, ``gpt2_small``, ``bert_base``): one step, timed.

**One step.** A training workload times ``flaxzoo.train.step.make_train_step``, the step of ``python -m flaxzoo.train``
(same losses: the MLM head on the gathered masked positions, the optional chunked cross-entropy; the gradient norm
once; the accuracy off as between logging steps), with ``optax.adamw`` (decay on every parameter, as
``torch.optim.AdamW`` does) at a constant learning rate. ``flaxzoo.train.step`` imports only jax, optax, flax, einops
and ``flaxzoo.train.batches`` (plain constants): no Grain, tensorflow-datasets or ml_collections, which the
accelerator image lacks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from flaxzoo.models.modeling import create_model, param_count
from flaxzoo.train.tools import hlo
from flaxzoo.train.tools.bench.batches import make_batch
from flaxzoo.train.tools.bench.common import peak_memory_bytes, timed
from flaxzoo.train.tools.bench.op_profile import hlo_annotations, profile_ops
from flaxzoo.train.tools.bench.workloads import LR, WEIGHT_DECAY, train_flops_per_token
from flaxzoo.train.step import make_train_step, new_train_state


def run_train(name: str, spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Time ``flaxzoo.train.step.make_train_step`` (the training loop's step) on the workload, with plain AdamW (decay on
    every parameter, as ``torch.optim.AdamW``) at a constant learning rate and the accuracy off (as the loop's
    steps between logging steps). MFU is added by the caller, against the round's peak."""
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

    def one_step() -> None:
        holder["state"], holder["metrics"] = compiled(holder["state"], rest, batch, no_accuracy)
        holder["metrics"]["loss"].block_until_ready()

    times = timed(one_step, args.warmup, args.steps)
    step_s = statistics.median(times)
    tokens = spec["batch"] * spec["seq"]
    fpt = train_flops_per_token(spec)
    memory, memory_kind = peak_memory_bytes()
    profile = (profile_ops(one_step, os.path.join(args.profile, name), 3, labels=hlo_annotations(compiled.as_text()))
               if args.profile else None)
    return dict(profile=profile, step_ms=1e3 * step_s, tokens_per_s=tokens / step_s, compile_s=compile_s,
                peak_memory_mb=memory / 2 ** 20, memory_kind=memory_kind,
                params=param_count(config, cls), flops_per_token=fpt, loss=float(holder["metrics"]["loss"]),
                step_ms_all=[round(1e3 * t, 2) for t in times], fused_attention_in_hlo=fused)
