"""``python -m flaxzoo.train.tools.gpu_encoder_check``: the encoder-family attention on a real GPU, one JSON line per figure.

1. ``bias``: bidirectional attention ``[batch, seq, heads, 64]`` with an additive ``[batch, heads, seq, seq]`` bias
   (DeBERTa's disentangled scores are one) and right padding, through ``attend(impl="auto")`` (XLA today),
   ``impl="softmax"`` and cuDNN called directly (``jax.nn.dot_product_attention(implementation="cudnn")``, which
   folds the mask into the bias; the dispatcher does not send biased calls there until this check shows its bias
   gradient right on hardware), in bfloat16: the backend and why, the fused kernels in the compiled HLO, and the
   max error of the output and of the q / k / v / **bias** gradients against the definition in float32 at
   "highest" precision (the bias gradient is what trains DeBERTa's relative projections and table).
2. ``window``: ModernBERT's bidirectional sliding window (a query sees the ``window - 1`` keys on each side) the same
   way (no cuDNN: it takes only a left window).
3. ``timing``: forward + backward of the biased padded call at 8 × 512 tokens × 12 heads, bfloat16: what ``auto``
   runs, XLA and cuDNN, median of 10 calls after a warm-up.
4. ``deberta``: a 2-layer random DeBERTa-v3-shaped encoder in bfloat16 on a right-padded batch: the gradients of
   its relative table and positional projections (reached only through the bias) with ``attention_impl="auto"``
   and ``"softmax"`` against the float32 model, as relative errors.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from flaxzoo.models.jax_startup import quiet_jax_startup

quiet_jax_startup()  # before anything imports JAX: no CUDA plugin / libtpu start-up noise on a CPU machine

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from flaxzoo import models  # noqa: E402
from flaxzoo.models.layers.attention_core import attend, choose_backend  # noqa: E402
from flaxzoo.train.tools.hlo import attention_kernels  # noqa: E402

HEADS, HEAD_DIM = 12, 64
TINY = "--tiny" in sys.argv  # a CPU smoke run
BATCH, SEQ = (2, 64) if TINY else (8, 512)


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def padded_mask(batch: int, seq: int) -> jax.Array:
    """``[batch, 1, seq, seq]``: row ``b`` has its last ``b · seq / (2 · batch)`` keys padded."""
    lengths = seq - (np.arange(batch) * seq) // (2 * batch)
    keys = np.arange(seq)[None, :] < lengths[:, None]
    return jnp.asarray(keys[:, None, None, :].repeat(seq, axis=2))


def reference(q, k, v, bias, mask):
    """The definition in float32: scores + bias, masked, softmax, weighted sum."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(HEAD_DIM)
    if bias is not None:
        scores = scores + bias.astype(jnp.float32)
    scores = jnp.where(mask, scores, -1e30)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def inputs(dtype):
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((BATCH, SEQ, HEADS, HEAD_DIM)), dtype) for _ in range(3))
    bias = jnp.asarray(rng.standard_normal((BATCH, HEADS, SEQ, SEQ)), jnp.float32)
    return q, k, v, bias


def with_cotangents(fn, weights):
    """``(q, k, v, bias) -> (output, its q / k / v / bias cotangents of weights)``, jitted."""
    def run(q, k, v, bias):
        out, pullback = jax.vjp(lambda *xs: fn(*xs).astype(jnp.float32), q, k, v, bias)
        return out, pullback(weights)
    return jax.jit(run)


def attention_part(window: int | None) -> None:
    q, k, v, bias = inputs(jnp.bfloat16)
    mask = padded_mask(BATCH, SEQ)
    if window is not None:
        i, j = np.arange(SEQ)[:, None], np.arange(SEQ)[None, :]
        mask = jnp.logical_and(mask, jnp.asarray(np.abs(i - j) < window))
        bias = None
    weights = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape), jnp.float32)
    real = np.asarray(padded_mask(BATCH, SEQ)[:, 0, :, 0])[:, :, None, None]  # padded query rows are arbitrary
    bias_in = jnp.zeros((1, 1, 1, 1)) if bias is None else bias
    with jax.default_matmul_precision("highest"):
        want, want_grads = with_cotangents(lambda q, k, v, b: reference(q, k, v, None if bias is None else b, mask),
                                           weights)(q, k, v, bias_in)
    for impl in ("auto", "softmax") + (("cudnn",) if bias is not None and jax.default_backend() == "gpu" else ()):
        def ours(q, k, v, b):
            if impl == "cudnn":
                return jax.nn.dot_product_attention(q, k, v, bias=b.astype(q.dtype), mask=mask, implementation="cudnn")
            return attend(q, k, v, mask=mask, bias=None if bias is None else b, is_causal=False, impl=impl,
                          window=window)
        compiled = with_cotangents(ours, weights).lower(q, k, v, bias_in).compile()
        out, grads = compiled(q, k, v, bias_in)
        errors = {"out": float(jnp.max(jnp.abs(jnp.where(real, out - want, 0))))}
        for name, got, expected in zip(("dq", "dk", "dv", "dbias"), grads, want_grads):
            if name != "dbias" or bias is not None:
                errors[name] = float(jnp.max(jnp.abs(got.astype(jnp.float32) - expected)))
        backend, reason = ("cudnn", "called directly") if impl == "cudnn" else choose_backend(
            impl, dtype=jnp.bfloat16, head_dim=HEAD_DIM, heads=HEADS, kv_heads=HEADS, q_len=SEQ, k_len=SEQ,
            masked=True, biased=bias is not None, is_causal=False, dropout=False, windowed=window is not None)
        say(check="window" if window else "bias", impl=impl, backend=backend, reason=reason,
            kernels=attention_kernels(compiled.as_text()), max_abs_error=errors,
            max_abs_reference={"out": float(jnp.max(jnp.abs(want))),
                               "dbias": float(jnp.max(jnp.abs(want_grads[3])))})


def timing_part() -> None:
    q, k, v, bias = inputs(jnp.bfloat16)
    mask = padded_mask(BATCH, SEQ)
    bias = bias.astype(jnp.bfloat16)
    calls = {"auto": lambda q, k, v, b: attend(q, k, v, mask=mask, bias=b, is_causal=False, impl="auto"),
             "xla": lambda q, k, v, b: jax.nn.dot_product_attention(q, k, v, bias=b, mask=mask,
                                                                    implementation="xla")}
    if jax.default_backend() == "gpu":
        calls["cudnn"] = lambda q, k, v, b: jax.nn.dot_product_attention(q, k, v, bias=b, mask=mask,
                                                                         implementation="cudnn")
    for name, fn in calls.items():
        step = with_cotangents(fn, jnp.ones(q.shape, jnp.float32))
        jax.block_until_ready(step(q, k, v, bias))
        times = []
        for _ in range(10):
            start = time.perf_counter()
            jax.block_until_ready(step(q, k, v, bias))
            times.append(time.perf_counter() - start)
        say(check="timing", call=name, shape=[BATCH, SEQ, HEADS, HEAD_DIM], fwd_bwd_ms=round(
            1e3 * statistics.median(times), 3), kernels=attention_kernels(step.lower(q, k, v, bias).compile()
                                                                          .as_text()))


def deberta_part() -> None:
    base = models.get_preset("deberta-v3-small").replace(num_layers=2, vocab_size=512, position_buckets=32)
    ids = np.random.default_rng(2).integers(3, 512, (4, 128))
    mask = np.ones_like(ids)
    mask[1, 100:], mask[3, 64:] = 0, 0
    ids = ids * mask

    def relative_grads(config):
        model = models.create_model(config, models.BertModel, seed=0)
        model.eval()  # no dropout: the three runs differ only in precision and attention core
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        weights = jnp.asarray(np.random.default_rng(3).standard_normal((4, 128, config.hidden_size)), jnp.float32)

        def loss(params):
            out = nnx.merge(graphdef, params, rest)(jnp.asarray(ids), jnp.asarray(mask)).last_hidden_state
            return jnp.sum(out.astype(jnp.float32) * weights * mask[..., None])
        grads = jax.jit(lambda p: jax.vjp(loss, p)[1](jnp.float32(1.0))[0])(params)
        flat = {".".join(map(str, path)): np.asarray(value, np.float32) for path, value in
                nnx.to_flat_state(grads)}
        return {name: value for name, value in flat.items() if "relative" in name or "pos_" in name}

    with jax.default_matmul_precision("highest"):
        want = relative_grads(base)
    for impl in ("auto", "softmax"):
        got = relative_grads(base.replace(dtype="bfloat16", attention_impl=impl))
        errors = {name: float(np.abs(got[name] - want[name]).max() / (np.abs(want[name]).max() + 1e-12))
                  for name in want}
        backend = models.attention_backend(base.replace(dtype="bfloat16", attention_impl=impl), q_len=128,
                                           masked=True)
        say(check="deberta", impl=impl, backend=backend[0], reason=backend[1], tensors=len(errors),
            max_relative_error=max(errors.values()), worst=max(errors, key=errors.get))


PARTS = {"bias": lambda: attention_part(None), "window": lambda: attention_part(64 if not TINY else 8),
         "timing": timing_part, "deberta": deberta_part}


def main() -> None:
    """``--parts bias,window,timing,deberta`` (default all); ``--tiny`` for a CPU smoke run."""
    say(check="versions", jax=jax.__version__, devices=[d.device_kind for d in jax.devices()])
    chosen = sys.argv[sys.argv.index("--parts") + 1].split(",") if "--parts" in sys.argv else list(PARTS)
    for name in chosen:
        try:
            PARTS[name]()
        except Exception as exc:  # report and go on: one JSON line per part that failed
            say(check=name, ok=False, error=f"{type(exc).__name__}: {exc}"[:2000])


if __name__ == "__main__":
    main()
