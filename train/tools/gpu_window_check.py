"""``python -m flaxzoo.train.tools.gpu_window_check``: the decoder-family mechanisms on a real GPU, one JSON line per figure.

1. ``attention``: causal grouped-query attention ``[batch, seq, heads, 128]`` with a sliding window and / or soft
   cap through ``attend(impl="auto")`` and ``impl="softmax"``, in float32 and bfloat16: the backend chosen and why,
   whether the compiled HLO holds cuDNN's fused attention (``__cudnn$fmha``), and the max error of the output and
   the q / k / v gradients against a dense float32 reference computed from the definition at "highest" precision.
2. ``timing``: forward + backward of that call at 8 × 4096 tokens in bfloat16, full causal vs a 512-token window
   (cuDNN takes both), median of timed calls after a warm-up.
3. ``families``: tiny random Qwen2 (sliding layers), Mistral (window on every layer) and Gemma-2-like (soft caps,
   sandwich norms, query scale) decoders in float32: logits on the GPU against the same model on the CPU, and 24
   greedy tokens after a left-padded batch, equal on both.
"""

from __future__ import annotations

import json
import statistics
import time

import sys

from flaxzoo.models.jax_startup import quiet_jax_startup

quiet_jax_startup()  # before anything imports JAX: no CUDA plugin / libtpu start-up noise on a CPU machine

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from flaxzoo import models  # noqa: E402
from flaxzoo.models.layers.attention_core import attend, choose_backend  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 16, 4, 128


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def reference(q, k, v, window, softcap):
    """The definition in float32: scores, cap, causal window mask, softmax, weighted sum."""
    seq = q.shape[1]
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    k, v = (jnp.repeat(x, HEADS // KV_HEADS, axis=2) for x in (k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(HEAD_DIM)
    if softcap is not None:
        scores = softcap * jnp.tanh(scores / softcap)
    i, j = jnp.arange(seq)[:, None], jnp.arange(seq)[None, :]
    allowed = (j <= i) & (j > i - (window or seq + 1))
    scores = jnp.where(allowed[None, None], scores, -1e30)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def inputs(batch: int, seq: int, dtype):
    rng = np.random.default_rng(0)
    shapes = ((batch, seq, HEADS, HEAD_DIM), (batch, seq, KV_HEADS, HEAD_DIM), (batch, seq, KV_HEADS, HEAD_DIM))
    return tuple(jnp.asarray(rng.standard_normal(s), dtype) for s in shapes)


SEQ = 128 if "--tiny" in sys.argv else 1024  # --tiny: a CPU smoke run
TIMING_SHAPE = (1, 256) if "--tiny" in sys.argv else (8, 4096)


def attention_figures() -> None:
    for dtype in (jnp.float32, jnp.bfloat16):
        for window, softcap in ((None, None), (64, None), (256, None), (None, 30.0), (64, 30.0)):
            for impl in ("auto", "softmax"):
                q, k, v = inputs(2, SEQ, dtype)
                weights = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape), jnp.float32)

                def run(fn):
                    def with_cotangents(q, k, v):  # the output and its q / k / v cotangents of ``weights``
                        out, pullback = jax.vjp(lambda q, k, v: fn(q, k, v).astype(jnp.float32), q, k, v)
                        return out, pullback(weights)
                    return jax.jit(with_cotangents)

                def ours(q, k, v):
                    return attend(q, k, v, mask=None, bias=None, is_causal=True, impl=impl, window=window,
                                  softcap=softcap)
                compiled = run(ours).lower(q, k, v).compile()
                out, grads = compiled(q, k, v)
                with jax.default_matmul_precision("highest"):
                    want, want_grads = run(lambda q, k, v: reference(q, k, v, window, softcap))(q, k, v)
                errors = {name: float(jnp.max(jnp.abs(a.astype(jnp.float32) - b)))
                          for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), (want, *want_grads))}
                backend, reason = choose_backend(impl, dtype=dtype, head_dim=HEAD_DIM, heads=HEADS,
                                                 kv_heads=KV_HEADS, q_len=SEQ, k_len=SEQ, masked=False,
                                                 biased=False, is_causal=True, dropout=False,
                                                 windowed=window is not None, capped=softcap is not None)
                say(check="attention", dtype=jnp.dtype(dtype).name, window=window, softcap=softcap, impl=impl,
                    backend=backend, reason=reason, cudnn_in_hlo="__cudnn$fmha" in compiled.as_text(),
                    max_abs_error=errors, max_abs_out=float(jnp.max(jnp.abs(want))))


def timing_figures() -> None:
    q, k, v = inputs(*TIMING_SHAPE, jnp.bfloat16)
    for window in (None, 512):
        def forward_backward(q, k, v):
            out, pullback = jax.vjp(lambda q, k, v: attend(q, k, v, mask=None, bias=None, is_causal=True,
                                                           impl="auto", window=window), q, k, v)
            return pullback(jnp.ones_like(out))
        step = jax.jit(forward_backward)
        jax.block_until_ready(step(q, k, v))
        times = []
        for _ in range(10):
            start = time.perf_counter()
            jax.block_until_ready(step(q, k, v))
            times.append(time.perf_counter() - start)
        say(check="timing", shape=[*TIMING_SHAPE, HEADS, HEAD_DIM], window=window,
            fwd_bwd_ms=round(1e3 * statistics.median(times), 3))


def family_configs() -> dict[str, models.TransformerConfig]:
    base = models.get_preset("llama-tiny").replace(vocab_size=512, num_layers=3, max_position_embeddings=128,
                                                   initializer_range=0.2)
    return {
        "qwen2": base.replace(model_type="qwen2", attention_bias=True, attention_out_bias=False, sliding_window=6,
                              layer_types=("full_attention", "sliding_attention", "sliding_attention")),
        "mistral": base.replace(model_type="mistral", sliding_window=5),
        "gemma2_like": base.replace(model_type="llama", norm_placement="sandwich", norm_unit_offset=True,
                                    embedding_multiplier=8.0, attention_softcap=20.0, final_logit_softcap=15.0,
                                    query_scale=0.3, sliding_window=7, activation="gelu_tanh",
                                    layer_types=("sliding_attention", "full_attention", "sliding_attention")),
    }


def family_figures() -> None:
    with jax.default_matmul_precision("highest"):
        _family_figures()


def _family_figures() -> None:
    cpu = jax.devices("cpu")[0]
    rng = np.random.default_rng(2)
    ids = rng.integers(3, 512, (2, 10))
    mask = np.ones((2, 10), np.int32)
    ids[1, :3], mask[1, :3] = 0, 0
    for name, config in family_configs().items():
        for scan in (False, True):
            cls = models.GPTForCausalLM
            real = cls(config.replace(scan_layers=scan), rngs=nnx.Rngs(0))
            # float32 at full precision: a GPU's default float32 matmul is TF32 (about 1e-3 off on these logits)
            gpu_logits = np.asarray(real(jnp.asarray(ids), jnp.asarray(mask)))
            gpu_tokens = np.asarray(models.generate(real, ids, 24, attention_mask=mask))
            with jax.default_device(cpu):
                cpu_model = cls(config.replace(scan_layers=scan), rngs=nnx.Rngs(0))
                cpu_logits = np.asarray(cpu_model(jnp.asarray(ids), jnp.asarray(mask)))
                cpu_tokens = np.asarray(models.generate(cpu_model, ids, 24, attention_mask=mask))
            real_rows = mask.astype(bool)
            say(check="families", family=name, scan_layers=scan, platform=jax.default_backend(),
                max_abs_logit_diff=float(np.max(np.abs(gpu_logits - cpu_logits)[real_rows])),
                greedy_24_equal=bool((gpu_tokens == cpu_tokens).all()),
                first_difference=None if (gpu_tokens == cpu_tokens).all() else
                int(np.argmax((gpu_tokens != cpu_tokens).any(axis=0))))


PARTS = {"attention": lambda: attention_figures(), "timing": lambda: timing_figures(),
         "families": lambda: family_figures()}


def main() -> None:
    """``--parts attention,timing,families`` (default all)."""
    say(check="versions", jax=jax.__version__, devices=[d.device_kind for d in jax.devices()])
    chosen = sys.argv[sys.argv.index("--parts") + 1].split(",") if "--parts" in sys.argv else list(PARTS)
    for name in chosen:
        part = PARTS[name]
        try:
            part()
        except Exception as exc:  # report and go on: one JSON line per part that failed
            say(check=name, ok=False, error=f"{type(exc).__name__}: {exc}"[:2000])


if __name__ == "__main__":
    main()
