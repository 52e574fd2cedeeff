"""The attention layout (models/layers/masking.py) and what it guarantees: packed documents behave as if run alone
(BERT, GPT-2, Llama, ALiBi, sinusoidal; per-layer and stacked parameters), positions against a numpy count, the
causal mask aligned bottom-right for q != k on every attention core, attention-probability dropout against an
explicit formula, the cuDNN / XLA / kernel choice, stacked layers, and the bad-input messages at the boundary."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxzoo import models
from flaxzoo.models import BertForMaskedLM, GPTForCausalLM, get_preset
from flaxzoo.models.layers.attention_core import attend, attention_with_weights, choose_backend, softmax_attention
from flaxzoo.models.layers.masking import document_positions

PACKED_KINDS = {
    "bert": ("bert-tiny", {}, BertForMaskedLM),
    "gpt2": ("gpt2-tiny", {}, GPTForCausalLM),
    "llama": ("llama-tiny", {}, GPTForCausalLM),
    "alibi": ("gpt2-tiny", {"position": "alibi"}, GPTForCausalLM),
    "sinusoidal-encoder": ("bert-tiny", {"position": "sinusoidal"}, BertForMaskedLM),
}


@functools.lru_cache(maxsize=None)
def scaled_model(kind: str, scan_layers: bool):
    """A tiny model with its matrices scaled ×3 (far from uniform attention), in either parameter layout."""
    name, overrides, cls = PACKED_KINDS[kind]
    model = models.create_model(get_preset(name, scan_layers=scan_layers, **overrides), cls, seed=3)
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(lambda x: x * 3.0 if x.ndim >= 2 else x, state))


def numpy_document_positions(segments: np.ndarray) -> np.ndarray:
    out = np.zeros_like(segments)
    for b, row in enumerate(segments):
        seen: dict[int, int] = {}
        for i, s in enumerate(row):
            if s:
                out[b, i] = seen.get(s, 0)
                seen[s] = out[b, i] + 1
    return out


def test_document_positions_count_real_tokens_of_each_document():
    segments = np.array([[1, 1, 1, 2, 2, 3, 0, 0], [0, 0, 1, 1, 1, 1, 2, 2], [1, 1, 0, 2, 2, 2, 0, 3]])
    got = np.asarray(document_positions(jnp.asarray(segments != 0), jnp.asarray(segments)))
    np.testing.assert_array_equal(got, numpy_document_positions(segments))
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])  # no segments: count the real tokens of the row
    np.testing.assert_array_equal(np.asarray(document_positions(jnp.asarray(mask))), [[0, 0, 0, 1, 2], [0, 1, 2, 0, 0]])


@pytest.mark.slow_variants
@pytest.mark.parametrize("scan_layers", [False, True], ids=["per-layer", "stacked"])
@pytest.mark.parametrize("kind", list(PACKED_KINDS))
def test_packed_documents_give_each_document_its_own_logits(kind, scan_layers):
    model = scaled_model(kind, scan_layers)
    rng = np.random.default_rng(7)
    lengths = [[5, 3, 4], [7, 2]]  # row 0: three documents and padding; row 1: two documents and padding
    seq = 14
    ids = np.zeros((2, seq), np.int32)
    segments = np.zeros((2, seq), np.int32)
    docs = []
    for row, row_lengths in enumerate(lengths):
        start = 0
        for number, length in enumerate(row_lengths, start=1):
            doc = rng.integers(3, 1000, length).astype(np.int32)
            ids[row, start:start + length] = doc
            segments[row, start:start + length] = number
            docs.append((row, start, doc))
            start += length
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, ids, segments: nnx.merge(graphdef, state)(ids, segment_ids=segments))
    packed = np.asarray(forward(state, ids, segments))
    for row, start, doc in docs:  # one program per length: fewer compiles than running op by op
        alone = np.asarray(forward(state, doc[None], None))[0]
        np.testing.assert_allclose(packed[row, start:start + len(doc)], alone, atol=1e-5, rtol=0,
                                   err_msg=f"{kind}: document at row {row}, slot {start}")


def test_segment_ids_combine_with_attention_mask():
    """A zero in attention_mask turns that token into padding whatever its segment id."""
    model = scaled_model("gpt2", False)
    ids = np.random.default_rng(1).integers(3, 1000, (1, 8)).astype(np.int32)
    segments = np.array([[1, 1, 1, 1, 2, 2, 2, 2]])
    mask = np.array([[1, 1, 1, 1, 1, 1, 0, 0]])
    both = np.asarray(model(ids, mask, segment_ids=segments))
    np.testing.assert_allclose(both[0, :6], np.asarray(model(ids, segment_ids=segments * mask))[0, :6], atol=1e-6)


# ----------------------------------------------------------------------------------- causality, q != k, backends


def numpy_attention(q, k, v, causal_offset=None, multiplier=None):
    """``[q, heads, d]`` queries over ``[k, heads, d]`` keys; causal_offset: query i sees keys <= i + offset."""
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(q.shape[-1])
    if causal_offset is not None:
        allowed = np.arange(k.shape[0])[None, :] <= np.arange(q.shape[0])[:, None] + causal_offset
        scores = np.where(allowed, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    if multiplier is not None:
        probs = probs * multiplier
    return np.einsum("hqk,khd->qhd", probs, v)


@pytest.mark.slow_variants
@pytest.mark.parametrize("impl", ["softmax", "fused", "auto"])
@pytest.mark.parametrize("q_len, k_len", [(3, 5), (1, 6), (4, 4)])
def test_causal_attention_is_bottom_right_aligned_on_every_core(impl, q_len, k_len):
    rng = np.random.default_rng(q_len * 10 + k_len)
    q = rng.standard_normal((1, q_len, 4, 8)).astype(np.float32) * 2
    k = rng.standard_normal((1, k_len, 4, 8)).astype(np.float32) * 2
    v = rng.standard_normal((1, k_len, 4, 8)).astype(np.float32)
    got = np.asarray(attend(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), mask=None, bias=None, is_causal=True,
                            impl=impl))
    np.testing.assert_allclose(got[0], numpy_attention(q[0], k[0], v[0], causal_offset=k_len - q_len), atol=1e-5)


def test_attention_dropout_is_the_explicit_formula_forward_and_backward():
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in
               ((2, 5, 4, 8), (2, 5, 2, 8), (2, 5, 2, 8)))  # grouped-query: 4 heads over 2 KV heads
    multiplier = jnp.asarray((rng.random((2, 4, 5, 5)) > 0.3) / 0.7, jnp.float32)
    got = np.asarray(softmax_attention(q, k, v, None, None, True, multiplier))
    for b in range(2):
        expected = numpy_attention(np.asarray(q[b]), np.repeat(np.asarray(k[b]), 2, 1),
                                   np.repeat(np.asarray(v[b]), 2, 1), causal_offset=0, multiplier=np.asarray(multiplier[b]))
        np.testing.assert_allclose(got[b], expected, atol=1e-5)
    cotangent = jnp.asarray(rng.standard_normal((2, 5, 4, 8)).astype(np.float32))

    def loss(kernel, q, k, v):
        out = (softmax_attention(q, k, v, None, None, True, multiplier) if kernel else
               attention_with_weights(q, k, v, None, None, True, multiplier)[0])
        return jnp.sum(out * cotangent)

    ours = jax.grad(functools.partial(loss, True), argnums=(0, 1, 2))(q, k, v)
    autodiff = jax.grad(functools.partial(loss, False), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(ours, autodiff):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_attention_dropout_drops_at_its_rate_in_training_mode_only():
    config = get_preset("gpt2-tiny", attention_dropout=0.25)
    model = models.create_model(config, seed=0)
    ids = np.random.default_rng(0).integers(3, 1000, (4, 32)).astype(np.int32)
    model.eval()
    evaluated = np.asarray(model(ids))
    model.train()
    attention = model.backbone.layers[0].attention
    multiplier = np.asarray(attention._dropout_multiplier(64, 32, 32))
    assert abs((multiplier == 0).mean() - 0.25) < 0.01
    np.testing.assert_allclose(np.unique(multiplier), [0.0, 1 / 0.75], rtol=1e-6)
    trained = np.asarray(model(ids))
    assert np.abs(trained - evaluated).max() > 1e-3
    model.eval()
    np.testing.assert_array_equal(np.asarray(model(ids)), evaluated)


@pytest.mark.parametrize("kwargs, expected", [
    (dict(impl="auto", platform="cpu"), ("softmax", "kernel")),
    (dict(impl="fused", platform="cpu"), ("xla", "needs a GPU")),
    (dict(impl="auto", platform="gpu"), ("cudnn", "cuDNN flash attention")),
    (dict(impl="fused", platform="gpu"), ("cudnn", "cuDNN flash attention")),
    (dict(impl="auto", platform="gpu", dtype=jnp.float32), ("xla", "dtype float32")),
    (dict(impl="auto", platform="gpu", head_dim=12), ("xla", "head_dim=12")),
    (dict(impl="auto", platform="gpu", head_dim=512), ("xla", "head_dim=512")),
    (dict(impl="auto", platform="gpu", biased=True), ("xla", "bias")),
    (dict(impl="auto", platform="gpu", masked=True), ("gpu_flash", "Pallas GPU flash attention")),
    (dict(impl="auto", platform="gpu", masked=True, shared_segments=False), ("xla", "mask")),
    (dict(impl="fused", platform="gpu", masked=True), ("xla", "mask")),
    (dict(impl="auto", platform="tpu"), ("splash", "splash attention")),
    (dict(impl="auto", platform="tpu", masked=True, shared_segments=False), ("splash", "splash attention")),
    (dict(impl="auto", platform="tpu", biased=True), ("xla", "bias")),
    (dict(impl="auto", platform="tpu", q_len=1), ("xla", "full-sequence")),
    (dict(impl="auto", platform="tpu", dropout=True), ("softmax", "dropout")),
    (dict(impl="splash", platform="cpu"), ("splash", "interpret mode")),
    (dict(impl="gpu_flash", platform="cpu", masked=True), ("gpu_flash", "interpret mode")),
    (dict(impl="auto", platform="gpu", q_len=1), ("xla", "query length 1 != key length 64")),
    (dict(impl="auto", platform="gpu", dropout=True), ("softmax", "dropout")),
    (dict(impl="softmax", platform="gpu"), ("softmax", "kernel")),
])
def test_backend_choice(kwargs, expected):
    call = dict(dtype=jnp.bfloat16, head_dim=64, heads=4, kv_heads=2, q_len=64, k_len=64, masked=False, biased=False,
                is_causal=True, dropout=False) | kwargs
    backend, why = choose_backend(call.pop("impl"), **call)
    assert backend == expected[0] and expected[1] in why, (backend, why)


def test_attention_backend_of_a_config():
    config = get_preset("gpt2", dtype="bfloat16", attention_impl="auto")
    assert models.attention_backend(config, q_len=1024, platform="gpu")[0] == "cudnn"
    assert models.attention_backend(config, q_len=1024, platform="gpu", training=True)[0] == "softmax"  # p = 0.1
    assert models.attention_backend(config.replace(position="alibi"), q_len=1024, platform="gpu")[0] == "xla"


# ------------------------------------------------------------------------------------------------ stacked layers


def test_stacked_layers_hold_the_per_layer_values_in_one_array():
    per_layer = models.create_model(get_preset("llama-tiny"), seed=5)
    stacked = models.create_model(get_preset("llama-tiny", scan_layers=True), seed=5)
    layers = stacked.backbone.layers
    kernel = layers.attention.query.kernel
    assert kernel.shape == (2, 64, 4, 16) and kernel.get_metadata()["out_sharding"] == (
        "layers", "embed", "heads", "head_dim")
    for i in range(2):
        np.testing.assert_array_equal(np.asarray(kernel[...][i]),
                                      np.asarray(per_layer.backbone.layers[i].attention.query.kernel[...]))
    ids = np.random.default_rng(2).integers(3, 1000, (2, 9)).astype(np.int32)
    np.testing.assert_allclose(np.asarray(stacked(ids)), np.asarray(per_layer(ids)), atol=1e-6)


# ----------------------------------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def gpt2_tiny():
    return models.create_model(get_preset("gpt2-tiny"), seed=0)


def test_lists_of_ints_and_torch_tensors_are_accepted(gpt2_tiny):
    import torch

    expected = np.asarray(gpt2_tiny(np.array([[1, 2, 3]])))
    np.testing.assert_allclose(np.asarray(gpt2_tiny([[1, 2, 3]])), expected)
    np.testing.assert_allclose(np.asarray(gpt2_tiny(torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.bool))),
                               expected)


@pytest.mark.parametrize("bad, message", [
    ([1, 2, 3], r"input_ids has shape \(3,\): expected \[batch, seq\] \(for one sequence pass \[ids\]\)"),
    (np.ones((1, 2, 3), np.int32), r"input_ids has shape \(1, 2, 3\): expected \[batch, seq\]"),
    (np.array([[1.0, 2.0]]), r"input_ids has dtype float64: expected integers \[batch, seq\]"),
    ([[1, 2], [3]], r"input_ids is a ragged list: expected \[batch, seq\] integers"),
    ("hello", r"input_ids is a str: expected an integer array \[batch, seq\]"),
    (np.array([[True, False]]), r"input_ids has dtype bool: expected integers \[batch, seq\]"),
    ([[]], r"input_ids has shape \(1, 0\) \[batch, seq\]: expected at least one row and one token"),
])
def test_bad_input_ids_are_named(gpt2_tiny, bad, message):
    with pytest.raises(ValueError, match=message):
        gpt2_tiny(bad)


def test_segment_ids_out_of_order_are_named(gpt2_tiny):
    with pytest.raises(ValueError, match=r"segment_ids row 0 goes back to document 1 at position 3 after document 2"):
        gpt2_tiny([[1, 2, 3, 4]], segment_ids=[[1, 1, 2, 1]])
    with pytest.raises(ValueError, match=r"segment_ids contains -1: expected document numbers >= 1"):
        gpt2_tiny([[1, 2]], segment_ids=[[1, -1]])


@pytest.mark.parametrize("bad", [1000, -1, -100])
def test_out_of_range_ids_inside_jit_give_a_nan_row_not_another_token(gpt2_tiny, bad):
    graphdef, state = nnx.split(gpt2_tiny)
    run = jax.jit(lambda state, ids: nnx.merge(graphdef, state)(ids))
    ids = np.array([[5, 6, 7, 8], [5, 6, 7, 8]], np.int32)
    clean = np.asarray(run(state, ids))
    ids[1, 2] = bad
    logits = np.asarray(run(state, ids))
    assert np.isnan(logits[1]).all()  # its value vector is NaN, and 0 · NaN reaches every query of the row
    np.testing.assert_array_equal(logits[0], clean[0])
    with pytest.raises(ValueError, match=rf"input_ids contains {bad}: expected token ids in \[0, 1000\) "
                                         r"\(vocab_size=1000\)"):
        models.check_token_ids(ids, gpt2_tiny.config)


def test_cached_decode_checks_its_ids(gpt2_tiny):
    state = gpt2_tiny.init_state(1, 4)
    with pytest.raises(ValueError, match=r"input_ids contains 1000: expected token ids in \[0, 1000\)"):
        gpt2_tiny.decode(np.array([[1, 1000]]), state)
    with pytest.raises(ValueError, match=r"input_ids has shape \(2, 1\): the decode state holds 1 rows"):
        gpt2_tiny.decode(np.array([[1], [2]]), state)
