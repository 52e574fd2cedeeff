"""Model FLOPs per token, accelerator peaks, and model FLOPs utilisation (MFU).

Convention (Kaplan et al., 2020; PaLM, Chowdhery et al., 2022, appendix B), for one training token:

    flops_per_token = 6 · N + 12 · L · T · d

- ``N``: parameters that take part in a matrix multiply: every parameter except lookup-only tables (learned position
  and token-type tables; the token table too when the output projection is untied; a tied token table counts once,
  as the output projection). Biases and norm scales are counted (they are tiny). A padded vocabulary
  (``config.pad_vocab_to``) is counted with its padded rows, ``config.padded_vocab_size`` (GPT-2 with
  ``pad_vocab_to=128``: 50,304, not 50,257): the output projection multiplies every row, padding included, so that is
  the work the device does (0.03 % more FLOPs per token for GPT-2 small at 1,024 tokens).
- ``6 · N``: a multiply-add is 2 FLOPs; the forward pass does one per weight per token (2N), the backward pass two
  (gradients with respect to the activations and to the weights: 4N).
- ``12 · L · T · d``: attention scores ``Q·Kᵀ`` and the weighted sum ``A·V`` cost ``2 · T · d`` multiply-adds per token
  and layer each (``T`` = sequence length, ``d`` = heads × head_dim), i.e. ``4 · T · d`` FLOPs forward, ×3 with the
  backward pass. The causal mask is not discounted (the usual convention; nanoGPT and PaLM do the same).

Not counted: softmax, norms, activations, the loss, rematerialised recomputation (MFU counts model FLOPs, not hardware
FLOPs: recomputing with ``remat`` lowers MFU, as it should).

MFU = ``flops_per_token × tokens/s ÷ (peak FLOP/s per device × devices)``. Peaks are dense bf16 tensor-core numbers
from the vendors' data sheets. On CPU there is no data sheet: :func:`measure_cpu_peak` times a large matmul once.
"""

from __future__ import annotations

import functools

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.config import TransformerConfig
from models.modeling import abstract_model

# Dense bf16 peak FLOP/s per device (chip), by a lower-case substring of jax's ``device.device_kind``; first match
# wins, so the more specific names come first.
PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("h200", 989e12),
    ("h100", 989e12),
    ("gh200", 989e12),
    ("a100", 312e12),
    ("tpu v6 lite", 918e12),  # v6e (Trillium)
    ("tpu v6e", 918e12),
    ("tpu v5 lite", 197e12),  # v5e
    ("tpu v5e", 197e12),
    ("tpu v5p", 459e12),
    ("tpu v5", 459e12),       # v5p reports "TPU v5"
    ("tpu v4", 275e12),
)


def matmul_params(config: TransformerConfig, cls: type | None = None) -> int:
    """``N`` of the convention above, counted on the abstract model (nothing is allocated); vocabulary tables with
    their padded rows (``config.padded_vocab_size``)."""
    params = nnx.to_pure_dict(nnx.state(abstract_model(config, cls), nnx.Param))
    total = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = [getattr(p, "key", None) for p in path]
        lookup_only = "positions" in keys or "token_types" in keys or (
            "tokens" in keys and not config.tie_word_embeddings)
        if not lookup_only:
            total += int(np.prod(leaf.shape))
    return total


def flops_per_token(config: TransformerConfig, seq_len: int, cls: type | None = None, *,
                    trained: int | None = None) -> float:
    """Training FLOPs per token: ``6 N + 12 L T d`` (see the module docstring). ``trained``: the number of trained
    parameters when the base is frozen (LoRA): the frozen weights cost their forward and the backward to the
    activations, ``4 N``, the trained ones ``6`` each: ``4 N + 6 N_trained + 12 L T d``."""
    d_attn = config.num_heads * config.head_dim
    attention = 12.0 * config.num_layers * seq_len * d_attn
    if trained is None:
        return 6.0 * matmul_params(config, cls) + attention
    return 4.0 * matmul_params(config, cls) + 6.0 * trained + attention


def peak_flops(device: jax.Device) -> float | None:
    """Dense bf16 peak FLOP/s of an accelerator from the table, or None when unknown (and for CPUs)."""
    kind = device.device_kind.lower()
    for name, peak in PEAK_FLOPS:
        if name in kind:
            return peak
    return None


CPU_PEAK_SIZE = 2048  # the matmul the CPU peak is measured on, for the training loop and the benchmark alike


@functools.lru_cache(maxsize=None)
def measure_cpu_peak(size: int = CPU_PEAK_SIZE, dtype=jnp.float32, repeats: int = 5) -> float:
    """FLOP/s of the best of ``repeats`` timed ``[size, size] @ [size, size]`` matmuls on the default device (all of
    the host's cores, as XLA's CPU backend uses them). Measured once per process and settings (runs that build
    several trainers in one process share it)."""
    a = jnp.asarray(np.random.default_rng(0).standard_normal((size, size)), dtype)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size ** 3 / best


def device_peak(devices: list[jax.Device], cpu_size: int = CPU_PEAK_SIZE) -> tuple[float, str]:
    """``(total peak FLOP/s of devices, how it was obtained)``. CPU devices share one host: its measured matmul
    peak (``[cpu_size]²`` float32, best of 5) is the total, however many (simulated) CPU devices there are."""
    if devices[0].platform == "cpu":
        return measure_cpu_peak(cpu_size), f"measured fp32 matmul peak ({cpu_size}^3, best of 5)"
    peak = peak_flops(devices[0])
    if peak is None:
        return float("nan"), f"unknown peak for {devices[0].device_kind!r}"
    return peak * len(devices), f"{devices[0].device_kind} bf16 peak x {len(devices)}"


def mfu(flops_per_token_: float, tokens_per_s: float, total_peak: float) -> float:
    return flops_per_token_ * tokens_per_s / total_peak
