"""Model FLOPs per token, accelerator peaks, and model FLOPs utilisation (MFU): the one definition the training loop,
the benchmark (``train/tools/bench/``) and the accelerator check (``train/tools/gpu_check.py``, through the bench) share.

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

Two refinements, both arguments of :func:`flops_per_token`:

- ``predictions`` (masked LM): the MLM loss (``flaxzoo.train.losses.masked_lm_loss``) gathers the ``P`` slots of
  ``masked_positions [batch, P]`` (``DataConfig.predictions``, padding slots included) before the head, so the head's
  parameters (:func:`mlm_head_params`: the transform dense and its norm, the vocabulary projection, i.e. the tied
  token table, and its bias) work on ``P / T`` of the positions: ``N = N_encoder + (P / T) · N_head``. Without it
  the head counts on every position (the model's plain forward). BERT base, ``T`` = 128: 668.9 MFLOP per token with
  the head everywhere, 547.1 with ``P`` = 20 (the loader's 15 %: ``ceil(0.15 · 128)``).
- ``trained`` (a frozen base, LoRA): the frozen weights cost their forward and the backward to the activations,
  ``4 N``, the ``N_trained`` trained ones ``6`` each: ``4 N + 6 N_trained + 12 L T d`` (with ``predictions``, ``N``
  as above).

Not counted: softmax, norms, activations, the loss, rematerialised recomputation (MFU counts model FLOPs, not hardware
FLOPs: recomputing with ``remat`` lowers MFU, as it should).

MFU = ``flops_per_token × tokens/s ÷ (peak FLOP/s per device × devices)``. Peaks are dense bf16 tensor-core numbers
from the vendors' data sheets. On CPU there is no data sheet: :func:`measure_cpu_peak` times a large matmul once.
"""

from __future__ import annotations

import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.modeling import abstract_model, default_model_class

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


@functools.lru_cache(maxsize=32)
def _matmul_leaves(config: TransformerConfig, cls: type | None) -> tuple[tuple[tuple[str, ...], int], ...]:
    """``(key path, size)`` of every parameter in ``N`` (lookup-only tables left out), on the abstract model (built
    once per config and class)."""
    params = nnx.to_pure_dict(nnx.state(abstract_model(config, cls), nnx.Param))
    leaves = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = tuple(str(getattr(p, "key", p)) for p in path)
        lookup_only = "positions" in keys or "token_types" in keys or (
            "tokens" in keys and not config.tie_word_embeddings)
        if not lookup_only:
            leaves.append((keys, int(np.prod(leaf.shape))))
    return tuple(leaves)


def matmul_params(config: TransformerConfig, cls: type | None = None) -> int:
    """``N`` of the convention above, counted on the abstract model (nothing is allocated); vocabulary tables with
    their padded rows (``config.padded_vocab_size``)."""
    return sum(size for _, size in _matmul_leaves(config, cls))


def mlm_head_params(config: TransformerConfig, cls: type | None = None) -> int:
    """The part of ``N`` in a masked-LM head (``BertForMaskedLM``): every matmul parameter outside the encoder
    (``model.backbone``: the transform dense and norm, the decoder's bias or untied kernel) plus the tied token table
    (the vocabulary projection). ValueError for a model without such a head."""
    cls = cls or default_model_class(config)
    leaves = _matmul_leaves(config, cls)
    if getattr(cls, "task", None) != "masked_lm":
        raise ValueError(f"{getattr(cls, '__name__', cls)} has no masked-LM head beside its encoder")
    return sum(size for keys, size in leaves if keys[0] != "backbone" or "tokens" in keys)


def flops_per_token(config: TransformerConfig, seq_len: int, cls: type | None = None, *,
                    trained: int | None = None, predictions: int | None = None) -> float:
    """Training FLOPs per token (see the module docstring): ``6 N + 12 L T d``, ``T = seq_len``.

    ``predictions``: the masked-LM head runs on ``predictions`` gathered positions of each ``[seq_len]`` row
    (``DataConfig.predictions``; ``masked_positions [batch, predictions]``), so its parameters count for
    ``predictions / seq_len`` of the tokens. ``trained``: the number of trained parameters when the base is frozen
    (LoRA): ``4 N + 6 N_trained + 12 L T d``."""
    n = float(matmul_params(config, cls))
    if predictions is not None:
        if not 1 <= predictions <= seq_len:
            raise ValueError(f"predictions={predictions}: expected a count of positions in [1, seq_len={seq_len}]")
        n -= mlm_head_params(config, cls) * (1.0 - predictions / seq_len)
    attention = 12.0 * config.num_layers * seq_len * config.num_heads * config.head_dim
    if trained is None:
        return 6.0 * n + attention
    return 4.0 * n + 6.0 * trained + attention


def encoder_decoder_flops(config: TransformerConfig, source_len: int, target_len: int,
                          cls: type | None = None) -> float:
    """Training FLOPs of one ``(source_len, target_len)`` pair through an encoder-decoder: ``6 N`` per token for the
    parameters each token meets (an encoder layer's for a source token; a decoder layer's, its cross-attention's
    query and output, and the head for a target token; the cross-attention's keys and values once per source
    token and decoder layer) plus the attention products, ``12 · heads · head_dim`` per query-key pair (encoder
    ``S²``, decoder ``T²``, cross ``T·S`` per layer)."""
    def params_of(prefix: str, *names: str) -> int:
        return sum(size for keys, size in _matmul_leaves(config, cls)
                   if keys[0] == prefix and (not names or any(name in keys for name in names)))

    cross_kv = sum(size for keys, size in _matmul_leaves(config, cls)
                   if keys[0] == "decoder" and "cross_attention" in keys and keys[-2] in ("key", "value"))
    per_source = params_of("encoder") + cross_kv
    # the shared token table is a matmul only as a tied head (as a lookup it costs nothing)
    head = params_of("lm_head") + (params_of("shared") if config.tie_word_embeddings else 0)
    per_target = params_of("decoder") - cross_kv + head
    width = config.num_heads * config.head_dim
    pairs = (config.num_layers * source_len ** 2
             + (config.num_decoder_layers or 0) * (target_len ** 2 + target_len * source_len))
    return 6.0 * (per_source * source_len + per_target * target_len) + 12.0 * width * pairs


def forward_flops_per_token(config: TransformerConfig, context: float, cls: type | None = None) -> float:
    """Forward-only model FLOPs per token (decoding): ``2 N + 4 L · context · d``, a third of the training count at
    ``T = context`` (the mean context length of the generated tokens)."""
    return 2.0 * matmul_params(config, cls) + 4.0 * config.num_layers * context * config.num_heads * config.head_dim


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
    several trainers in one process share it); :class:`PeakMeter` measures again when the work outruns it."""
    return time_cpu_matmul(size, dtype, repeats)


def time_cpu_matmul(size: int = CPU_PEAK_SIZE, dtype=jnp.float32, repeats: int = 5) -> float:
    """:func:`measure_cpu_peak`, measured now (not cached)."""
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


class PeakMeter:
    """MFU against a peak that can be trusted.

    An accelerator's peak is its data sheet's. A CPU's is measured (:func:`measure_cpu_peak`), and a host that was
    busy when it was measured (other processes, a test suite) reports a peak below what the work later achieves:
    an MFU over 100%. When a window's MFU exceeds 1 on a CPU, the peak is measured again, beside the work, and the
    higher of the two is kept; if the work still outruns it, :meth:`mfu` returns None (MFU left out) and
    :attr:`untrusted` says why. MFU is never above 1.
    """

    def __init__(self, devices: list, cpu_size: int = CPU_PEAK_SIZE):
        self.cpu = devices[0].platform == "cpu"
        self.cpu_size = cpu_size
        self.peak, self.source = device_peak(devices, cpu_size)
        self.untrusted: str | None = None

    def mfu(self, flops_per_token_: float, tokens_per_s: float) -> float | None:
        achieved = flops_per_token_ * tokens_per_s
        if not math.isfinite(self.peak) or self.peak <= 0:
            return None
        if achieved > self.peak and self.cpu:
            self.peak = max(self.peak, time_cpu_matmul(self.cpu_size))
            self.source = f"measured fp32 matmul peak ({self.cpu_size}^3, best of 5, measured again beside the work)"
        if achieved > self.peak:
            self.untrusted = (f"MFU left out: the work ran at {achieved / 1e9:.1f} GFLOP/s, above the measured peak of "
                              f"{self.peak / 1e9:.1f} GFLOP/s (a busy host when the peak was measured)")
            return None
        return achieved / self.peak
