"""Sliding windows and attention soft-capping in every attention core, against a dense reference written here from
the definitions (scores ``q·kᵀ/√d``, capped ``c·tanh(s/c)``, then a mask where query ``i`` sees key ``j`` when
``i - window < j <= i`` within its own segment, softmax, weighted sum): forward and the gradients wrt query, key
and value, in float32 at "highest" matmul precision.

Backends: the closed-form-backward kernel ("softmax"), XLA ("fused" on CPU), TPU splash in Pallas interpret mode,
and the dispatcher's choices (Pallas GPU flash takes neither: calls fall back, and the reason says so). The layout
path (a window inside ``AttentionLayout.mask``, traced per layer as a scan over both kinds of layers passes it) is
checked against the same reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxzoo.models.layers.attention_core import attend, choose_backend
from flaxzoo.models.layers.attention_kernels import splash_attention
from flaxzoo.models.layers.masking import AttentionLayout

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
TOLERANCE = 2e-5


def inputs(seed: int, batch: int = 2, seq: int = 40):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, seq, HEADS, HEAD_DIM)) * 1.5
    k = rng.standard_normal((batch, seq, KV_HEADS, HEAD_DIM)) * 1.5
    v = rng.standard_normal((batch, seq, KV_HEADS, HEAD_DIM))
    return tuple(jnp.asarray(x, jnp.float32) for x in (q, k, v))


def segments(batch: int, seq: int) -> jax.Array:
    """Row 0: two documents then padding; row 1: one document."""
    first = [1] * (seq // 2) + [2] * (seq // 3)
    rows = [first + [0] * (seq - len(first)), [1] * seq]
    return jnp.asarray(rows[:batch], jnp.int32)


def reference(q, k, v, window, softcap, segment_ids=None):
    """The definition, dense, with autodiff: ``[batch, seq, heads, d]``."""
    seq = q.shape[1]
    k, v = (jnp.repeat(x, HEADS // KV_HEADS, axis=2) for x in (k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(HEAD_DIM)
    if softcap is not None:
        scores = softcap * jnp.tanh(scores / softcap)
    i, j = np.arange(seq)[:, None], np.arange(seq)[None, :]
    allowed = jnp.asarray((j <= i) & (j > i - (window or seq + 1)))[None, None]
    if segment_ids is not None:
        allowed = allowed & (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
    scores = jnp.where(allowed, scores, -1e30)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def forward_and_grads(fn, args):
    weights = jnp.asarray(np.random.default_rng(7).standard_normal(args[0].shape), jnp.float32)

    def run(q, k, v):
        out, vjp = jax.vjp(fn, q, k, v)
        return out, vjp(weights)
    with jax.default_matmul_precision("highest"):
        return jax.jit(run)(*args)


def assert_close(fn, expected_fn, args, segment_ids=None):
    out, grads = forward_and_grads(fn, args)
    want, want_grads = forward_and_grads(expected_fn, args)
    real = np.ones(out.shape[:2], bool) if segment_ids is None else np.asarray(segment_ids) > 0
    errors = {name: float(jnp.max(jnp.abs(a - b)[real])) for name, a, b in
              zip(("out", "dq", "dk", "dv"), (out, *grads), (want, *want_grads))}
    assert max(errors.values()) < TOLERANCE, errors


CASES = [(1, None), (5, None), (7, 3.0), (None, 2.0)]


@pytest.mark.slow_variants
@pytest.mark.parametrize("impl", ["softmax", "fused"])
@pytest.mark.parametrize("window, softcap", CASES)
def test_plain_causal_calls(impl, window, softcap):
    """No segments: the kernel's own causal path with its window (and XLA's ``local_window_size`` mask)."""
    if impl == "fused" and softcap is not None:
        assert choose_backend("fused", dtype=jnp.float32, head_dim=HEAD_DIM, heads=HEADS, kv_heads=KV_HEADS,
                              q_len=40, k_len=40, masked=False, biased=False, is_causal=True, dropout=False,
                              capped=True)[0] == "softmax"
    args = inputs(0, seq=130 if impl == "softmax" else 40)  # 130 queries: the softmax kernel's query blocks too
    assert_close(lambda q, k, v: attend(q, k, v, mask=None, bias=None, is_causal=True, impl=impl, window=window,
                                        softcap=softcap),
                 lambda q, k, v: reference(q, k, v, window, softcap), args)


@pytest.mark.slow_variants
@pytest.mark.parametrize("impl", ["softmax", "fused"])
@pytest.mark.parametrize("window, softcap", CASES)
def test_packed_documents_through_the_layout(impl, window, softcap):
    """Segments: the window lives in ``AttentionLayout.mask`` (slots relative to ``query_offset``)."""
    q, k, v = inputs(1)
    segment_ids = segments(2, q.shape[1])
    positions = jnp.broadcast_to(jnp.arange(q.shape[1]), segment_ids.shape)
    layout = AttentionLayout(positions, positions, 0, segment_ids, segment_ids)
    mask = layout.mask(True, window=window)
    assert_close(lambda q, k, v: attend(q, k, v, mask=mask, bias=None, is_causal=False, impl=impl,
                                        segments=(segment_ids, segment_ids), causal_segments=True, window=window,
                                        softcap=softcap),
                 lambda q, k, v: reference(q, k, v, window, softcap, segment_ids), (q, k, v), segment_ids)


@pytest.mark.slow_variants
@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
def test_a_traced_window_runs_the_core_of_its_kind(causal):
    """A scan over sliding and full layers passes ``sliding`` traced: ``lax.cond`` runs the windowed or the full
    core (each with its kernel), equal to the layer called with a Python bool, and the two kinds differ."""
    from flax import nnx

    from flaxzoo import models
    from flaxzoo.models.layers.attention import Attention
    from flaxzoo.models.layers.masking import full_sequence_layout

    preset = "llama-tiny" if causal else "bert-tiny"
    config = models.get_preset(preset).replace(sliding_window=4, num_layers=2, hidden_size=32, num_heads=2,
                                               num_kv_heads=2, intermediate_size=64)
    layer = Attention(config, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 16, 32)), jnp.float32)
    positions = jnp.broadcast_to(jnp.arange(16), (2, 16))
    layout = full_sequence_layout(config, positions, attention_mask=None, segment_ids=None)
    traced = nnx.jit(lambda layer, x, sliding: layer(x, layout, sliding=sliding)[0])
    for on in (True, False):
        np.testing.assert_allclose(np.asarray(traced(layer, x, jnp.asarray(on))),
                                   np.asarray(layer(x, layout, sliding=on)[0]), rtol=0, atol=TOLERANCE)
    assert np.abs(np.asarray(layer(x, layout, sliding=True)[0] - layer(x, layout, sliding=False)[0])).max() > 1e-3


@pytest.mark.slow_variants
@pytest.mark.parametrize("window, softcap", [(5, None), (9, 4.0), (None, 3.0)])
def test_splash_takes_windows_and_soft_caps(window, softcap):
    """TPU splash (interpret mode): a ``LocalMask`` for the window, its own logit soft cap; with packed segments."""
    q, k, v = inputs(3)
    segment_ids = segments(2, q.shape[1])
    assert_close(lambda q, k, v: splash_attention(q, k, v, q_segments=segment_ids, kv_segments=segment_ids,
                                                  causal=True, interpret=True, window=window, softcap=softcap),
                 lambda q, k, v: reference(q, k, v, window, softcap, segment_ids), (q, k, v), segment_ids)


def test_the_dispatcher_routes_windows_and_caps():
    common = dict(dtype=jnp.bfloat16, head_dim=64, heads=8, kv_heads=2, q_len=256, k_len=256, biased=False,
                  is_causal=True, dropout=False)
    assert choose_backend("auto", platform="tpu", masked=True, windowed=True, capped=True, **common)[0] == "splash"
    backend, reason = choose_backend("auto", platform="gpu", masked=True, windowed=True, **common)
    assert backend == "xla" and "sliding window" in reason
    assert choose_backend("auto", platform="gpu", masked=False, windowed=True, **common)[0] == "cudnn"
    backend, reason = choose_backend("auto", platform="gpu", masked=False, capped=True, **common)
    assert backend == "softmax" and "soft-capping" in reason
    assert choose_backend("fused", platform="cpu", masked=True, capped=True, **common)[0] == "softmax"
    # A window without causality is a bidirectional one (tests/test_bidirectional_windows.py checks its values).
    q, k, v = inputs(4)
    assert splash_attention(q, k, v, causal=False, interpret=True, window=4).shape == q.shape
