"""``--compare transformers``: the same workload in transformers (PyTorch, fp32, eager, its default ``sdpa``
attention) in this process, on the same batch: the training step with ``torch.optim.AdamW``, or ``generate`` greedy.
transformers computes the MLM head on every position and ignores 85% of it, which counts as wasted work, not as model
FLOPs (its MFU uses the same FLOPs per token as flaxzoo's). PyTorch and transformers are imported only here."""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from typing import Any

import numpy as np

from flaxzoo.models.architectures.decoder import GPTForCausalLM
from flaxzoo.train import flops as flopslib
from flaxzoo.train.batches import IGNORE_INDEX
from flaxzoo.train.tools.bench.batches import make_batch
from flaxzoo.train.tools.bench.common import timed
from flaxzoo.train.tools.bench.workloads import LR, WEIGHT_DECAY, train_flops_per_token


def torch_models(name: str, spec: dict[str, Any]) -> Any:
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


def run_transformers(name: str, spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The workload's transformers side, timed as flaxzoo's (same warm-up, steps, repeats); MFU is added by the
    caller."""
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
        return dict(step_ms=1e3 * call_s / new, tokens_per_s=tokens_per_s, flops_per_token=fpt,
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
    return dict(step_ms=1e3 * step_s, tokens_per_s=tokens / step_s, flops_per_token=fpt,
                params=params, loss=losses[-1],
                peak_memory_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                memory_kind="process max RSS (both frameworks)", step_ms_all=[round(1e3 * t, 2) for t in times])
