"""``--compare keras_hub``: ``gpt_generate`` in KerasHub (``GPT2CausalLM``, Keras 3 on its JAX backend), in this
process on the same jax/XLA as flaxzoo: the ``gpt_train`` model's sizes (vocabulary, layers, heads, width, MLP 4x,
positions, tied embeddings, GELU-tanh, layer norm epsilon 1e-5, no dropout) with KerasHub's own random weights, the
prompt flaxzoo decodes from, ``compile(sampler="greedy")``, ``generate(..., stop_token_ids=None)``: every one of the
``spec["new_tokens"]`` positions after the prompt is generated. Timed as flaxzoo's: the first call (trace, compile,
run) and the median of ``--generate-repeats`` calls after it (``generate`` returns numpy arrays: each call ends on
the host). KerasHub's ``generate`` seeds its KV cache with one forward pass over the whole padded row (prompt + new
tokens), then decodes one token per step.

``gpt_train`` and ``bert_train`` in KerasHub: ``GPT2CausalLM`` / ``BertMaskedLM`` of the workload's sizes (KerasHub's
random weights, no dropout), compiled with ``keras.optimizers.AdamW`` at flaxzoo's learning rate, weight decay (on every
variable, as ``optax.adamw``) and epsilon, the sparse cross-entropy on logits, no metrics, ``jit_compile=True``; one
``train_on_batch`` per step (it returns the loss as a Python float: each step ends on the host) on the batch flaxzoo
trains on (``batches.make_batch``, same seed). The MLM head predicts the same ``masked_positions``, each weighted 1
where ``masked_labels`` holds a label (KerasHub's head gathers them, as flaxzoo's does); GPT-2 scores ``targets``
weighted 1 where not ``IGNORE_INDEX``. Where the two programs differ by design: KerasHub's attention sees the padding
mask only (it has no document mask: a packed row's documents attend to each other, flaxzoo's do not), and
``BertBackbone`` builds a pooler (a ``hidden x hidden`` dense on ``[CLS]``) that the MLM loss does not reach (its
parameters are counted in ``params``, its FLOPs in neither side's MFU). Keras and KerasHub are imported only here."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from flaxzoo.models.architectures.decoder import GPTForCausalLM
from flaxzoo.train import flops as flopslib
from flaxzoo.train.batches import IGNORE_INDEX
from flaxzoo.train.tools.bench.batches import make_batch
from flaxzoo.train.tools.bench.common import add_mfu, peak_memory_bytes, timed
from flaxzoo.train.tools.bench.generation import generate_prompt
from flaxzoo.train.tools.bench.op_profile import profile_ops
from flaxzoo.train.tools.bench.workloads import LR, WEIGHT_DECAY, train_flops_per_token

ADAM_EPSILON = 1e-8  # optax.adamw's default (Keras' is 1e-7)


def import_keras_hub() -> tuple[Any, Any]:
    """``(keras, keras_hub)`` on the JAX backend (``KERAS_BACKEND=jax`` unless already set); a clear error when Keras
    runs (or was asked to run) another backend, or when keras-hub is missing."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    if "keras" not in sys.modules and os.environ["KERAS_BACKEND"] != "jax":
        raise RuntimeError(f"--compare keras_hub runs Keras on JAX, but KERAS_BACKEND={os.environ['KERAS_BACKEND']}: "
                           "unset it or set KERAS_BACKEND=jax")
    try:
        import keras
        import keras_hub
    except ImportError as exc:
        raise SystemExit(f"--compare keras_hub needs keras and keras-hub (pip install 'flaxzoo[compare]'): {exc}")
    if keras.backend.backend() != "jax":
        raise RuntimeError(f"--compare keras_hub runs Keras on JAX, but keras was already imported with the "
                           f"{keras.backend.backend()!r} backend: start a fresh process with KERAS_BACKEND=jax")
    return keras, keras_hub


def backbone_sizes(config: Any) -> dict[str, Any]:
    """The arguments KerasHub's GPT-2 and BERT backbones share, from a flaxzoo ``TransformerConfig``; no dropout."""
    return dict(vocabulary_size=config.vocab_size, num_layers=config.num_layers, num_heads=config.num_heads,
                hidden_dim=config.hidden_size, intermediate_dim=config.intermediate_size, dropout=0.0,
                max_sequence_length=config.max_position_embeddings, dtype=config.dtype)


def keras_gpt2(config: Any, seed: int = 0) -> Any:
    """A randomly initialised ``keras_hub.models.GPT2CausalLM`` of ``config``'s sizes (a flaxzoo GPT-2
    ``TransformerConfig``: tied embeddings, learned positions), no preprocessor, the greedy sampler. The weights come
    from ``keras.utils.set_random_seed(seed)``, which also seeds Python's ``random`` and NumPy's global generator."""
    keras, keras_hub = import_keras_hub()
    if not config.tie_word_embeddings or config.activation != "gelu_tanh" or config.norm_eps != 1e-5:
        raise ValueError("KerasHub's GPT-2 ties its embeddings, uses GELU-tanh and layer norm epsilon 1e-5; got "
                         f"tie_word_embeddings={config.tie_word_embeddings}, activation={config.activation}, "
                         f"norm_eps={config.norm_eps}")
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.GPT2Backbone(**backbone_sizes(config))
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    model.compile(sampler="greedy")
    return model


def keras_param_count(config: Any) -> int:
    """The parameters of KerasHub's GPT-2 of ``config``'s sizes, by formula: the tied token table once, the position
    table, per layer the attention's Q, K, V, output projections with biases, two layer norms, the MLP with biases;
    the final layer norm. flaxzoo's ``param_count`` of the same ``GPTForCausalLM`` counts exactly these."""
    v, p, d, f = config.vocab_size, config.max_position_embeddings, config.hidden_size, config.intermediate_size
    return v * d + p * d + config.num_layers * (4 * d * d + 4 * d + 2 * 2 * d + 2 * d * f + f + d) + 2 * d


def run_keras_hub(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``gpt_generate``'s KerasHub side, timed as flaxzoo's ``run_generate`` (first call, median of
    ``args.generate_repeats``); MFU is added by the caller. The prompt is flaxzoo's (``generation.generate_prompt``)."""
    import jax

    config = spec["config"]
    model = keras_gpt2(config, args.seed)
    prompt_len, new = spec["prompt"], spec["new_tokens"]
    total = prompt_len + new
    if total > config.max_position_embeddings:
        raise ValueError(f"prompt {prompt_len} + {new} new tokens exceed the model's {config.max_position_embeddings} "
                         "positions")
    prompt = generate_prompt(spec, args.seed)
    token_ids = np.zeros((spec["batch"], total), np.int32)
    token_ids[:, :prompt_len] = prompt
    inputs = {"token_ids": token_ids, "padding_mask": np.arange(total)[None, :].repeat(spec["batch"], 0) < prompt_len}

    def call() -> np.ndarray:
        return np.asarray(model.generate(inputs, stop_token_ids=None)["token_ids"])

    start = time.perf_counter()
    first = call()
    first_s = time.perf_counter() - start
    if first.shape != (spec["batch"], total) or not np.array_equal(first[:, :prompt_len], prompt):
        raise RuntimeError(f"KerasHub generate returned {first.shape} ids, expected the prompt then {new} new tokens")
    times = timed(call, 0, args.generate_repeats)
    call_s = statistics.median(times)
    params = int(model.count_params())
    if params != keras_param_count(config):
        raise RuntimeError(f"KerasHub's GPT-2 has {params:,} parameters, the formula {keras_param_count(config):,}")
    memory, memory_kind = peak_memory_bytes()
    return dict(step_ms=1e3 * call_s / new, tokens_per_s=spec["batch"] * new / call_s, compile_s=first_s - call_s,
                first_call_s=first_s, call_s=call_s, params=params, sampler=type(model.sampler).__name__,
                flops_per_token=flopslib.forward_flops_per_token(config, prompt_len + new / 2, GPTForCausalLM),
                peak_memory_mb=memory / 2 ** 20, memory_kind=f"{memory_kind} (flaxzoo and KerasHub, one process)",
                backend=f"keras {model.dtype_policy.name} on jax {jax.__version__}",
                tokens=first[0, prompt_len:prompt_len + 8].tolist())


def keras_bert_mlm(config: Any, seed: int = 0) -> Any:
    """A randomly initialised ``keras_hub.models.BertMaskedLM`` of ``config``'s sizes (a flaxzoo BERT
    ``TransformerConfig``: exact GELU, layer norm epsilon 1e-12, as KerasHub's BERT), no preprocessor, no dropout.
    Seeds as :func:`keras_gpt2`."""
    keras, keras_hub = import_keras_hub()
    if config.activation != "gelu" or config.norm_eps != 1e-12 or config.position != "learned":
        raise ValueError("KerasHub's BERT uses exact GELU, layer norm epsilon 1e-12 and learned positions; got "
                         f"activation={config.activation}, norm_eps={config.norm_eps}, "
                         f"position={config.position}")
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.BertBackbone(**backbone_sizes(config), num_segments=config.type_vocab_size)
    return keras_hub.models.BertMaskedLM(backbone=backbone, preprocessor=None)


def keras_train_inputs(spec: dict[str, Any], seed: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """``(x, y, sample_weight)`` for KerasHub's ``train_on_batch`` from flaxzoo's batch (``make_batch(spec, seed)``):
    labels where flaxzoo scores a token (0 elsewhere, weight 0), the loss the mean over the scored tokens."""
    batch = make_batch(spec, seed)
    if spec["predictions"] is None:
        x = {"token_ids": batch["input_ids"], "padding_mask": np.ones_like(batch["input_ids"], bool)}
        labels = batch["targets"]
    else:
        x = {"token_ids": batch["input_ids"], "segment_ids": batch["token_type_ids"],
             "padding_mask": batch["attention_mask"] > 0, "mask_positions": batch["masked_positions"]}
        labels = batch["masked_labels"]
    scored = labels != IGNORE_INDEX
    # Keras' loss divides the weighted sum by every position, scored or not: weights of N / scored make it the mean
    # over the scored tokens, flaxzoo's loss.
    return x, np.where(scored, labels, 0).astype(np.int32), (scored / scored.mean()).astype(np.float32)


def run_keras_hub_train(name: str, spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``gpt_train`` / ``bert_train`` in KerasHub, timed as flaxzoo's ``run_train`` (``args.warmup`` steps, the
    median of ``args.steps``; ``--profile DIR``: 3 more steps traced into ``DIR/<name>_keras_hub``); MFU is added by
    the caller, with flaxzoo's FLOPs per token."""
    import jax

    keras, _ = import_keras_hub()
    config = spec["config"]
    if name == "gpt_train":
        model = keras_gpt2(config, args.seed)
    elif name == "bert_train":
        model = keras_bert_mlm(config, args.seed)
    else:
        raise ValueError(f"--compare keras_hub has no KerasHub counterpart of {name!r}; expected gpt_generate, "
                         "gpt_train or bert_train")
    model.compile(optimizer=keras.optimizers.AdamW(learning_rate=LR, weight_decay=WEIGHT_DECAY, epsilon=ADAM_EPSILON),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), weighted_metrics=[],
                  jit_compile=True)
    x, y, weight = keras_train_inputs(spec, args.seed)
    losses: list[float] = []

    def step() -> None:
        losses.append(float(model.train_on_batch(x, y, sample_weight=weight, return_dict=True)["loss"]))

    start = time.perf_counter()
    step()
    first_s = time.perf_counter() - start
    times = timed(step, max(0, args.warmup - 1), args.steps)
    step_s = statistics.median(times)
    if not all(np.isfinite(losses)):
        raise RuntimeError(f"KerasHub's {name} step gave losses {losses}")
    memory, memory_kind = peak_memory_bytes()
    profile = profile_ops(step, os.path.join(args.profile, f"{name}_keras_hub"), 3) if args.profile else None
    return dict(profile=profile, step_ms=1e3 * step_s, tokens_per_s=spec["batch"] * spec["seq"] / step_s,
                compile_s=first_s - step_s, params=int(model.count_params()), first_loss=losses[0], loss=losses[-1],
                flops_per_token=train_flops_per_token(spec), peak_memory_mb=memory / 2 ** 20,
                memory_kind=f"{memory_kind} (flaxzoo and KerasHub, one process)",
                backend=f"keras {model.dtype_policy.name} on jax {jax.__version__}",
                step_ms_all=[round(1e3 * t, 2) for t in times])


def run_keras_hub_round(name: str, spec: dict[str, Any], args: argparse.Namespace, peak: float, peak_kind: str
                        ) -> dict[str, Any]:
    """The KerasHub side of one round of ``name`` (``gpt_generate``, ``gpt_train`` or ``bert_train``), its MFU
    against the round's peak."""
    keras, keras_hub = import_keras_hub()
    theirs = run_keras_hub(spec, args) if name == "gpt_generate" else run_keras_hub_train(name, spec, args)
    theirs.update(framework=f"keras_hub {keras_hub.__version__} + keras {keras.__version__} (jax backend)")
    return add_mfu(theirs, peak, peak_kind, args.peak_size)
