"""Bidirectional sliding windows (an encoder's ``sliding_window`` W: query ``i`` sees key ``j`` when ``|i - j| < W``,
ModernBERT's local layers) in every attention core, against a dense reference written here from the definition
(scores ``q·kᵀ/√d``, the window and segment mask, softmax, weighted sum); the layout's mask against a numpy mask;
and the cores that cannot take the window falling back with the reason."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxzoo.models import TransformerConfig
from flaxzoo.models.layers.attention_core import attend, choose_backend
from flaxzoo.models.layers.attention_kernels import splash_attention
from flaxzoo.models.layers.masking import AttentionLayout, symmetric_band

HEADS, KV_HEADS, HEAD_DIM, SEQ, WINDOW = 4, 2, 16, 24, 4
TOLERANCE = 2e-5


def inputs(seed: int = 0, batch: int = 2):
    rng = np.random.default_rng(seed)
    shapes = ((batch, SEQ, HEADS, HEAD_DIM), (batch, SEQ, KV_HEADS, HEAD_DIM), (batch, SEQ, KV_HEADS, HEAD_DIM))
    return tuple(jnp.asarray(rng.standard_normal(s) * 1.5, jnp.float32) for s in shapes)


def reference_mask(segments: np.ndarray | None, window: int, batch: int = 2) -> np.ndarray:
    """``[batch, q, k]``: ``|i - j| < window`` and, with ``segments``, the same document."""
    i = np.arange(SEQ)
    allowed = np.broadcast_to(np.abs(i[:, None] - i[None, :]) < window, (batch, SEQ, SEQ))
    if segments is not None:
        allowed = allowed & (segments[:, :, None] == segments[:, None, :])
    return allowed


def reference(q, k, v, allowed: np.ndarray) -> np.ndarray:
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    k, v = np.repeat(k, HEADS // KV_HEADS, axis=2), np.repeat(v, HEADS // KV_HEADS, axis=2)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(HEAD_DIM)
    scores = np.where(allowed[:, None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", probs, v)


SEGMENTS = np.array([[1] * 10 + [2] * 9 + [0] * 5, [1] * SEQ], np.int32)  # row 0: two documents, then padding


def test_symmetric_band_is_the_numpy_window():
    for offset in (0, 3):
        i, j = np.arange(5)[:, None] + offset, np.arange(9)[None, :]
        assert np.array_equal(np.asarray(symmetric_band(5, 9, offset, 3)), np.abs(j - i) < 3)


@pytest.mark.parametrize("packed", [False, True], ids=["one-document", "packed"])
def test_layout_mask_is_the_reference(packed):
    positions = jnp.zeros((2, SEQ), jnp.int32)
    segments = jnp.asarray(SEGMENTS) if packed else None
    layout = AttentionLayout(positions, positions, 0, segments, segments)
    mask = layout.mask(False, window=WINDOW, dense=True)  # [batch | 1, 1, q, k]
    expected = reference_mask(SEGMENTS if packed else None, WINDOW)
    assert np.array_equal(np.broadcast_to(np.asarray(mask)[:, 0], expected.shape), expected)
    off = layout.mask(False, dense=True)  # a global layer
    expected = reference_mask(SEGMENTS if packed else None, SEQ + 1)
    assert np.array_equal(np.broadcast_to(np.asarray(off)[:, 0], expected.shape), expected)
    assert layout.mask(True, window=WINDOW, dense=True) is not None  # causal windows are unchanged


@pytest.mark.slow_variants
@pytest.mark.parametrize("impl", ["softmax", "fused", "splash"])
@pytest.mark.parametrize("packed", [False, True], ids=["one-document", "packed"])
def test_every_core_takes_the_window(impl, packed):
    q, k, v = inputs()
    segments = jnp.asarray(SEGMENTS) if packed else None
    allowed = reference_mask(SEGMENTS if packed else None, WINDOW)
    want = reference(q, k, v, allowed)
    if impl == "splash":
        got = splash_attention(q, k, v, q_segments=segments, kv_segments=segments, causal=False, interpret=True,
                               window=WINDOW)
    else:
        mask = None
        if packed:
            layout = AttentionLayout(jnp.zeros((2, SEQ), jnp.int32), jnp.zeros((2, SEQ), jnp.int32), 0, segments,
                                     segments)
            mask = layout.mask(False, window=WINDOW)
        with jax.default_matmul_precision("highest"):
            got = attend(q, k, v, mask=mask, bias=None, is_causal=False, impl=impl, window=WINDOW,
                         segments=None if segments is None else (segments, segments))
    real = allowed.any(-1)  # padding queries of row 0 see padding keys only: compared where a key is allowed
    assert np.abs(np.asarray(got) - want)[real].max() <= TOLERANCE


def test_the_window_changes_the_output():
    q, k, v = inputs()
    windowed = attend(q, k, v, mask=None, bias=None, is_causal=False, impl="softmax", window=WINDOW)
    full = attend(q, k, v, mask=None, bias=None, is_causal=False, impl="softmax")
    assert np.abs(np.asarray(windowed - full)).max() > 0.1


def test_cores_that_cannot_take_it_fall_back_with_the_reason():
    common = dict(dtype=jnp.bfloat16, head_dim=64, heads=4, kv_heads=4, q_len=128, k_len=128, biased=False,
                  is_causal=False, dropout=False, platform="gpu", windowed=True)
    backend, reason = choose_backend("fused", masked=False, **common)
    assert backend == "xla" and "bidirectional sliding window" in reason
    backend, reason = choose_backend("gpu_flash", masked=True, **common)
    assert backend == "xla" and "gpu_flash does not take a sliding window" in reason
    assert choose_backend("fused", masked=False, **(common | dict(is_causal=True)))[0] == "cudnn"


def test_an_encoder_config_takes_a_window():
    config = TransformerConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                               causal=False, position="rope", sliding_window=3,
                               layer_types=("full_attention", "sliding_attention"))
    assert config.sliding_layers == (False, True)
    with pytest.raises(ValueError, match="sliding_window=0"):
        config.replace(sliding_window=0)


def test_attention_backend_reports_both_kinds_of_layers():
    """ModernBERT on a GPU in bfloat16: cuDNN takes its full layers but not the bidirectional window of its local ones
    (XLA); the report names the local layers' core and both reasons. On TPU splash takes both kinds."""
    from flaxzoo.models import attention_backend, get_preset

    config = get_preset("modernbert-base").replace(dtype="bfloat16")
    backend, reason = attention_backend(config, q_len=512, platform="gpu")
    assert backend == "xla" and "sliding-window layers: xla" in reason and "full layers: cudnn" in reason, reason
    assert attention_backend(config, q_len=512, platform="tpu", masked=True)[0] == "splash"
    assert attention_backend(config.replace(sliding_window=None, layer_types=None), q_len=512,
                             platform="gpu") == ("cudnn", "cuDNN flash attention")
