"""The workloads' models and sizes (:func:`workload_spec`) and their training FLOPs per token.

Execution defaults: the layers run as one ``lax.scan`` and, on CPU, with ``remat="dots"`` (the fastest ``gpt_train``
step measured on the 2-core CPU; see the README's Performance section); attention goes through the config's
``attention_impl="auto"`` (on GPU ``jax.nn.dot_product_attention``: cuDNN flash attention where cuDNN takes the call,
which excludes the packed batches' document mask, else its XLA path; the closed-form-backward kernel of
``models/layers/attention_core.py`` elsewhere); the reported backend is the one chosen for a masked (packed) call, as
``python -m flaxzoo.train``'s. ``--remat``, ``--no-scan-layers`` and ``--attention`` change them; none changes the
parameters or the outputs.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import jax

from flaxzoo.models.architectures.decoder import GPTForCausalLM
from flaxzoo.models.architectures.encoder import BertForMaskedLM
from flaxzoo.models.families import get_preset
from flaxzoo.train import flops as flopslib
from flaxzoo.train.tools.bench.batches import MLM_PROB

WORKLOADS = ("gpt_train", "bert_train", "gpt_generate", "gpt2_small", "bert_base", "main_gpt_train",
             "smollm2_generate", "t5_generate")
CPU_WORKLOADS = ("gpt_train", "bert_train", "gpt_generate")
LR, WEIGHT_DECAY = 3e-4, 0.1


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
