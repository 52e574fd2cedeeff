"""``--compare keras_hub``: ``gpt_generate`` in KerasHub (``GPT2CausalLM``, Keras 3 on its JAX backend), in this
process on the same jax/XLA as flaxzoo: the ``gpt_train`` model's sizes (vocabulary, layers, heads, width, MLP 4x,
positions, tied embeddings, GELU-tanh, layer norm epsilon 1e-5, no dropout) with KerasHub's own random weights, the
prompt flaxzoo decodes from, ``compile(sampler="greedy")``, ``generate(..., stop_token_ids=None)``: every one of the
``spec["new_tokens"]`` positions after the prompt is generated. Timed as flaxzoo's: the first call (trace, compile,
run) and the median of ``--generate-repeats`` calls after it (``generate`` returns numpy arrays: each call ends on
the host). KerasHub's ``generate`` seeds its KV cache with one forward pass over the whole padded row (prompt + new
tokens), then decodes one token per step. Keras and KerasHub are imported only here."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from flaxzoo.models.families.gpt2 import GPTForCausalLM
from flaxzoo.train import flops as flopslib
from flaxzoo.train.bench.common import add_mfu, peak_memory_bytes, timed
from flaxzoo.train.bench.generation import generate_prompt


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
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=config.vocab_size, num_layers=config.num_layers, num_heads=config.num_heads,
        hidden_dim=config.hidden_size, intermediate_dim=config.intermediate_size, dropout=0.0,
        max_sequence_length=config.max_position_embeddings, dtype=config.dtype)
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


def run_keras_hub_round(spec: dict[str, Any], args: argparse.Namespace, peak: float, peak_kind: str
                        ) -> dict[str, Any]:
    """The KerasHub side of one ``gpt_generate`` round, its MFU against the round's peak."""
    keras, keras_hub = import_keras_hub()
    theirs = run_keras_hub(spec, args)
    theirs.update(framework=f"keras_hub {keras_hub.__version__} + keras {keras.__version__} (jax backend)")
    return add_mfu(theirs, peak, peak_kind, args.peak_size)
