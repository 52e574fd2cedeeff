"""The attention core (models/layers/softmax_kernel.py, dispatched by attention_core.py) against independent references:
``softmax_attention``'s forward pass and hand-written backward pass against ``jax.nn.dot_product_attention``'s XLA
path (on keys and values repeated to every head) and a numpy softmax, over MHA / GQA / MQA, masks with fully masked
rows, shared and per-batch biases, causal and cross-shaped attention; bfloat16; the ``impl`` choices and their
validation; whole models with ``attention_impl="softmax"`` against ``"fused"`` (logits and every parameter gradient);
and the names a remat policy keeps."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxzoo import models
from flaxzoo.models import get_preset
from flaxzoo.models.layers.attention_core import attend, attention_with_weights, causal_blocks, softmax_attention
from flaxzoo.models.layers.stack import REMAT_POLICIES

BATCH, HEADS, HEAD_DIM = 2, 4, 8


def random_inputs(seed: int, q_len: int, k_len: int, kv_heads: int, dtype=jnp.float32):
    """``query [batch, q, heads, d]``, ``key`` / ``value [batch, k, kv_heads, d]``, scaled so that the softmax is far
    from uniform (differences in the backward pass then show)."""
    rng = np.random.default_rng(seed)
    query = rng.standard_normal((BATCH, q_len, HEADS, HEAD_DIM)) * 1.5
    key = rng.standard_normal((BATCH, k_len, kv_heads, HEAD_DIM)) * 1.5
    value = rng.standard_normal((BATCH, k_len, kv_heads, HEAD_DIM))
    return tuple(jnp.asarray(x, dtype) for x in (query, key, value))


def random_mask(seed: int, q_len: int, k_len: int, kind: str = "keys") -> jax.Array:
    """A boolean mask, ``[batch, 1, q, k]`` (``"keys"``) or ``[1, heads, q, k]`` (``"heads"``), with about a third
    masked, one fully masked row (batch 0 or head 2, query 1), and every other row keeping at least one key."""
    rng = np.random.default_rng(seed)
    shape = {"keys": (BATCH, 1, q_len, k_len), "heads": (1, HEADS, q_len, k_len)}[kind]
    mask = rng.random(shape) > 0.35
    mask[:, :, :, 0] |= True  # one key per row at least...
    if kind == "keys":  # ...except a fully masked row
        mask[0, :, 1, :] = False
    else:
        mask[:, 2, 1, :] = False
    return jnp.asarray(mask)


def random_bias(seed: int, kind: str | None, q_len: int, k_len: int) -> jax.Array | None:
    if kind is None:
        return None
    shape = {"shared": (1, HEADS, q_len, k_len), "full": (BATCH, HEADS, q_len, k_len)}[kind]
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def repeat_heads(x: jax.Array) -> jax.Array:
    """``[batch, k, kv_heads, d]`` → ``[batch, k, heads, d]``; KV head ``j`` serves query heads ``j·g .. j·g+g-1``
    (``g = heads // kv_heads``)."""
    return jnp.repeat(x, HEADS // x.shape[2], axis=2)


def reference_attention(query, key, value, bias, *, mask, is_causal):
    """``jax.nn.dot_product_attention`` (XLA) on keys and values copied to every query head."""
    return jax.nn.dot_product_attention(query, repeat_heads(key), repeat_heads(value), bias=bias, mask=mask,
                                        is_causal=is_causal, implementation="xla")


def numpy_attention(query, key, value, mask, bias, is_causal, *, with_weights=False):
    """``softmax(q·kᵀ/√d + bias, masked) · v`` written out in float64 numpy (fully masked rows: uniform); with the
    ``[batch, heads, q, k]`` weights when asked."""
    q, k, v = (np.asarray(x, np.float64) for x in (query, key, value))
    groups = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + np.asarray(bias, np.float64)
    allowed = np.ones(scores.shape, bool)
    if mask is not None:
        allowed &= np.asarray(mask, bool)
    if is_causal:
        q_len, k_len = scores.shape[-2:]
        allowed &= np.arange(k_len)[None, :] <= np.arange(q_len)[:, None] + (k_len - q_len)
    scores = np.where(allowed, scores, -np.inf)
    empty = ~allowed.any(-1, keepdims=True)
    scores = np.where(empty, 0.0, scores)  # fully masked rows attend uniformly
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    context = np.einsum("bhqk,bkhd->bqhd", weights, v)
    return (context, weights) if with_weights else context


def vjp_all(fn, query, key, value, bias, seed: int = 7):
    """``fn``'s output and its gradients w.r.t. query, key, value (and bias when given) for one random cotangent."""
    args = (query, key, value) if bias is None else (query, key, value, bias)
    out, pullback = jax.vjp(fn, *args)
    cotangent = jnp.asarray(np.random.default_rng(seed).standard_normal(out.shape), out.dtype)
    return out, pullback(cotangent)


def vjps(*calls):
    """``vjp_all`` of each ``(fn, (query, key, value, bias))``, compiled together as one program (compiling is most of
    the time on a CPU: one program costs far less than the hundred small ones eager mode would compile)."""
    fns = [fn for fn, _ in calls]
    return jax.jit(lambda args: [vjp_all(fn, *a) for fn, a in zip(fns, args)])([a for _, a in calls])


def assert_close(actual, expected, atol, what=""):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64), atol=atol, rtol=0,
                               err_msg=what)


# --------------------------------------------------------------------------------- kernel: forward and backward

KV_HEADS = {"mha": HEADS, "gqa": 2, "mqa": 1}
LAYOUTS = {"causal": (6, 6, True), "cross": (3, 7, False)}  # (q, k, is_causal); jax.nn is top-left aligned
CASES = {"-".join(str(part) for part in case): case
         for case in itertools.product(sorted(KV_HEADS), [None, "keys", "heads"], [None, "shared", "full"],
                                       sorted(LAYOUTS))}  # (heads, mask kind, bias kind, layout)


def case_inputs(heads: str, mask_kind: str | None, bias_kind: str | None, layout: str):
    q_len, k_len, _ = LAYOUTS[layout]
    query, key, value = random_inputs(0, q_len, k_len, KV_HEADS[heads])
    mask = None if mask_kind is None else random_mask(1, q_len, k_len, mask_kind)
    return query, key, value, mask, random_bias(2, bias_kind, q_len, k_len)


@pytest.fixture(scope="module")
def kernel_and_reference():
    """Per case: the inputs and ``(output, gradients)`` of ``softmax_attention`` and of the reference, all cases
    traced into one jitted program (one compilation instead of a hundred: compiling dominates on a CPU)."""
    inputs = {case_id: case_inputs(*case) for case_id, case in CASES.items()}

    @jax.jit
    def run(inputs):
        results = {}
        for case_id, (query, key, value, mask, bias) in inputs.items():
            is_causal = LAYOUTS[CASES[case_id][3]][2]

            def ours(q, k, v, b=None):
                return softmax_attention(q, k, v, mask, b, is_causal)

            def ref(q, k, v, b=None):
                return reference_attention(q, k, v, b, mask=mask, is_causal=is_causal)

            results[case_id] = (vjp_all(ours, query, key, value, bias), vjp_all(ref, query, key, value, bias))
        return results

    return inputs, run(inputs)


@pytest.mark.slow_variants
@pytest.mark.parametrize("case_id", list(CASES))
def test_softmax_attention_matches_dot_product_attention(kernel_and_reference, case_id):
    """Forward and gradients w.r.t. query, key, value and bias, for MHA / GQA / MQA; no mask, a ``[batch, 1, q, k]``
    or a ``[1, heads, q, k]`` mask (each with a fully masked row); no bias, a ``[1, heads, q, k]`` or a ``[batch,
    heads, q, k]`` bias; causal with ``q == k`` or non-causal with ``q != k``."""
    inputs, results = kernel_and_reference
    query, key, value, mask, bias = inputs[case_id]
    (out, grads), (ref_out, ref_grads) = results[case_id]
    assert out.shape == query.shape and out.dtype == jnp.float32
    assert_close(out, ref_out, 1e-5, "output")
    assert len(grads) == len(ref_grads) == (3 if bias is None else 4)
    for name, grad, ref_grad, primal in zip(("query", "key", "value", "bias"), grads, ref_grads,
                                            (query, key, value, bias)):
        assert grad.shape == primal.shape and grad.dtype == primal.dtype, name
        assert_close(grad, ref_grad, 1e-5, f"d/d{name}")
        assert float(np.abs(np.asarray(ref_grad)).max()) > 1e-2, name  # the comparison is not between zeros


@pytest.mark.parametrize("heads", ["mha", "gqa"])
def test_forward_matches_a_numpy_softmax(heads):
    q_len, k_len = 5, 5
    query, key, value = random_inputs(3, q_len, k_len, KV_HEADS[heads])
    mask, bias = random_mask(4, q_len, k_len), random_bias(5, "shared", q_len, k_len)
    out, (context, weights) = jax.jit(lambda *args: (softmax_attention(*args, True), attention_with_weights(
        *args, True)))(query, key, value, mask, bias)
    expected, expected_weights = numpy_attention(query, key, value, mask, bias, True, with_weights=True)
    assert_close(out, expected, 1e-5)
    # attention_with_weights (the autodiff path): the same context, and the weights per query head
    assert weights.shape == (BATCH, HEADS, q_len, k_len)
    assert_close(context, expected, 1e-5)
    assert_close(weights, expected_weights, 1e-6)


@pytest.mark.parametrize("q_len, k_len", [(3, 7), (7, 4)])
def test_causal_mask_is_bottom_right_aligned(q_len, k_len):
    """With ``q != k`` query ``i`` sees keys ``<= i + (k - q)`` (a query block at the end of the keys); for ``q > k``
    the first ``q - k`` queries see no key and attend uniformly. Checked against an explicit mask."""
    query, key, value = random_inputs(6, q_len, k_len, 2)
    bottom_right = jnp.tril(jnp.ones((q_len, k_len), bool), k_len - q_len)[None, None]

    def ours(q, k, v):
        return softmax_attention(q, k, v, None, None, True)

    def ref(q, k, v):
        return reference_attention(q, k, v, None, mask=bottom_right, is_causal=False)

    (out, grads), (ref_out, ref_grads) = vjps((ours, (query, key, value, None)), (ref, (query, key, value, None)))
    assert_close(out, ref_out, 1e-5)
    assert_close(out, numpy_attention(query, key, value, None, None, True), 1e-5)
    for grad, ref_grad in zip(grads, ref_grads):
        assert_close(grad, ref_grad, 1e-5)


def test_fully_masked_row_gets_uniform_weights_and_zero_score_gradient():
    q_len, k_len = 4, 6
    query, key, value = random_inputs(8, q_len, k_len, 2)
    mask = random_mask(9, q_len, k_len)  # batch 0, query 1: fully masked
    bias = random_bias(10, "full", q_len, k_len)

    def ours(q, k, v, b):
        return softmax_attention(q, k, v, mask, b, False)

    def ref(q, k, v, b):
        return reference_attention(q, k, v, b, mask=mask, is_causal=False)

    (out, (query_grad, _, _, bias_grad)), (ref_out, (ref_query_grad, _, _, ref_bias_grad)) = vjps(
        (ours, (query, key, value, bias)), (ref, (query, key, value, bias)))
    # the fully masked row is the mean of the values (of the KV head its query head reads)
    assert_close(np.asarray(out)[0, 1], np.repeat(np.asarray(value)[0].mean(0), HEADS // 2, axis=0), 1e-5)
    # every masked score: exactly zero gradient, here and in the reference
    masked = ~np.broadcast_to(np.asarray(mask), bias_grad.shape)
    assert masked[0, :, 1].all() and masked.sum() > BATCH * HEADS * k_len
    assert np.all(np.asarray(bias_grad)[masked] == 0.0)
    assert np.all(np.asarray(ref_bias_grad)[masked] == 0.0)
    assert_close(bias_grad, ref_bias_grad, 1e-5)
    # the fully masked row's query has no effect on anything
    assert np.all(np.asarray(query_grad)[0, 1] == 0.0)
    assert_close(query_grad, ref_query_grad, 1e-5)
    # the unmasked scores of the other rows do get gradients
    assert np.abs(np.asarray(bias_grad)[~masked]).min() > 0.0


@pytest.mark.slow_variants
@pytest.mark.parametrize("shape", [(BATCH, 1, 4, 6), (1, 1, 1, 6), (BATCH, HEADS, 1, 6)],
                         ids=["per-batch", "keys-only", "per-head-row"])
def test_broadcast_bias_gets_its_gradient_summed_to_its_shape(shape):
    """A bias broadcast over heads / batch / queries gets the sum of the per-score gradients, in its own shape."""
    query, key, value = random_inputs(20, 4, 6, 2)
    mask = random_mask(21, 4, 6)
    bias = jnp.asarray(np.random.default_rng(22).standard_normal(shape), jnp.float32)
    (_, grads), (_, ref_grads) = vjps(
        (lambda q, k, v, b: softmax_attention(q, k, v, mask, b, False), (query, key, value, bias)),
        (lambda q, k, v, b: reference_attention(q, k, v, b, mask=mask, is_causal=False), (query, key, value, bias)))
    assert grads[3].shape == shape
    for grad, ref_grad in zip(grads, ref_grads):
        assert_close(grad, ref_grad, 1e-5)


@pytest.mark.slow_variants
@pytest.mark.parametrize("mask_shape, bias_shape", [((4, 6), (4, 6)), ((1, 4, 6), (HEADS, 4, 6)), ((6,), (6,))],
                         ids=["2d", "3d", "keys-vector"])
def test_masks_and_biases_with_fewer_axes_broadcast_like_dot_product_attention(mask_shape, bias_shape):
    """``[q, k]`` / ``[heads, q, k]`` / ``[k]`` masks and biases broadcast from the right, as in ``jax.nn``; the bias
    gradient comes back in the bias's own shape."""
    query, key, value = random_inputs(23, 4, 6, 2)
    mask_values = np.random.default_rng(24).random(mask_shape) > 0.3
    mask_values[..., 0] = True
    mask = jnp.asarray(mask_values)
    bias = (None if bias_shape is None
            else jnp.asarray(np.random.default_rng(25).standard_normal(bias_shape), jnp.float32))
    ref_mask = jnp.broadcast_to(mask, (BATCH, HEADS, 4, 6))
    (out, grads), (ref_out, ref_grads) = vjps(
        (lambda q, k, v, b: softmax_attention(q, k, v, mask, b, False), (query, key, value, bias)),
        (lambda q, k, v, b: reference_attention(q, k, v, b, mask=ref_mask, is_causal=False),
         (query, key, value, bias)))
    assert_close(out, ref_out, 1e-5)
    if bias is not None:
        assert grads[3].shape == bias.shape
    for grad, ref_grad in zip(grads, ref_grads):
        assert_close(grad, ref_grad, 1e-5)


def test_mixed_input_dtypes_get_gradients_in_their_own_dtypes():
    query, key, value = random_inputs(26, 4, 4, 2)
    grads = jax.grad(lambda q, k, v: softmax_attention(q, k, v, None, None, True).astype(jnp.float32).sum(),
                     argnums=(0, 1, 2))(query.astype(jnp.bfloat16), key, value)
    assert [g.dtype for g in grads] == [jnp.bfloat16, jnp.float32, jnp.float32]


# ------------------------------------------------------------------------------------------------------ bfloat16


@pytest.mark.parametrize("heads", ["mha", "gqa"])
def test_bfloat16_output_and_gradients_follow_float32(heads):
    q_len, k_len = 6, 6
    query, key, value = random_inputs(11, q_len, k_len, KV_HEADS[heads], jnp.bfloat16)
    mask = random_mask(12, q_len, k_len)
    bias = random_bias(13, "shared", q_len, k_len)

    def ours(q, k, v, b):
        return softmax_attention(q, k, v, mask, b, True)

    as_f32 = tuple(x.astype(jnp.float32) for x in (query, key, value))
    (out, grads), (out32, grads32) = vjps((ours, (query, key, value, bias)), (ours, (*as_f32, bias)))
    assert out.dtype == jnp.bfloat16
    assert_close(out, out32, 2e-2, "output")
    for name, grad, grad32, primal in zip(("query", "key", "value", "bias"), grads, grads32,
                                          (query, key, value, bias)):
        assert grad.dtype == primal.dtype, name
        scale = float(np.abs(np.asarray(grad32)).max())
        assert_close(np.asarray(grad, np.float64) / scale, np.asarray(grad32) / scale, 3e-2, f"d/d{name}")


# ----------------------------------------------------------------------------------------- attend and the config


def test_attend_implementations_agree_and_auto_picks_by_backend():
    query, key, value = random_inputs(14, 5, 5, 2)
    mask = random_mask(15, 5, 5)
    outs = jax.jit(lambda q, k, v, m: {impl: attend(q, k, v, mask=m, bias=None, is_causal=True, impl=impl)
                                       for impl in ("auto", "softmax", "fused")})(query, key, value, mask)
    assert_close(outs["softmax"], outs["fused"], 1e-5)
    expected = "fused" if jax.default_backend() == "gpu" else "softmax"
    np.testing.assert_array_equal(np.asarray(outs["auto"]), np.asarray(outs[expected]))


def test_bad_attention_impl_is_rejected():
    query, key, value = random_inputs(16, 3, 3, 4)
    with pytest.raises(ValueError, match="'flash'"):
        attend(query, key, value, mask=None, bias=None, is_causal=False, impl="flash")
    with pytest.raises(ValueError, match="attention_impl='nope'"):
        get_preset("gpt2-tiny", attention_impl="nope")
    with pytest.raises(ValueError, match="attention_impl"):
        get_preset("gpt2-tiny").replace(attention_impl="Softmax")
    for impl in ("auto", "softmax", "fused"):
        assert get_preset("gpt2-tiny", attention_impl=impl).attention_impl == impl


# ------------------------------------------------------------------------------------------------- whole models

MODELS = {
    "gpt2": ("gpt2-tiny", None),  # causal, no padding: the is_causal path
    "llama": ("llama-tiny", [[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8]),  # GQA, RoPE; left padding: fully masked rows
    "bert": ("bert-tiny", [[1, 1, 1, 1, 1, 0, 0, 0], [1] * 8]),  # bidirectional, right padding
}


@pytest.mark.slow_variants
@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_give_the_same_logits_and_gradients_with_either_impl(name):
    """Logits and the gradients of every parameter (of a random linear function of the logits) with
    ``attention_impl="softmax"`` and ``"fused"``: the seed-0 parameters under both configs (one initialisation, merged
    into each config's graph: identical parameters, and one initialiser to compile instead of two)."""
    preset, attention_mask = MODELS[name]
    config = get_preset(preset, attention_impl="softmax")
    model = models.create_model(config, seed=0)
    _, params, rest = nnx.split(model, nnx.Param, ...)
    graphdefs = {impl: nnx.split(models.modeling.abstract_model(config.replace(attention_impl=impl)),
                                 nnx.Param, ...)[0] for impl in ("softmax", "fused")}
    for impl, graphdef in graphdefs.items():
        assert nnx.merge(graphdef, params, rest).config.attention_impl == impl
    rng = np.random.default_rng(18)
    input_ids = jnp.asarray(rng.integers(3, config.vocab_size, (2, 8)))
    mask = None if attention_mask is None else jnp.asarray(attention_mask)
    weights = jnp.asarray(rng.standard_normal((2, 8, config.vocab_size)), jnp.float32)

    @jax.jit
    def run(params):
        results = {}
        for impl, graphdef in graphdefs.items():
            def loss(params, graphdef=graphdef):
                logits = nnx.merge(graphdef, params, rest)(input_ids, mask)
                return jnp.sum(logits * weights), logits

            results[impl] = jax.grad(loss, has_aux=True)(params)
        return results

    results = run(params)
    (grads_a, logits_a), (grads_b, logits_b) = results["softmax"], results["fused"]
    assert np.abs(np.asarray(logits_a)).max() > 1e-3
    assert_close(logits_a, logits_b, 1e-5, "logits")
    flat = lambda tree: dict(jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(tree))[0])  # noqa: E731
    grads_a, grads_b = flat(grads_a), flat(grads_b)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == len(flat(params))
    for path in grads_a:  # the loss is a sum over 16k logits: gradients reach ~100, compare on each leaf's scale
        scale = max(1.0, float(np.abs(grads_b[path]).max()))
        assert_close(grads_a[path] / scale, grads_b[path] / scale, 1e-5, jax.tree_util.keystr(path))
    attention_grads = [g for p, g in grads_a.items() if "attention" in jax.tree_util.keystr(p)]
    assert attention_grads and all(np.abs(g).max() > 0 for g in attention_grads)


# ------------------------------------------------------------------------------------------------------- remat


def test_dots_remat_policy_keeps_the_kernel_residuals(capsys):
    query, key, value = random_inputs(19, 5, 5, 2)

    def saved_names(policy) -> str:
        fn = jax.checkpoint(lambda q, k, v: softmax_attention(q, k, v, None, None, True).sum(), policy=policy)
        capsys.readouterr()
        jax.ad_checkpoint.print_saved_residuals(fn, query, key, value)
        return capsys.readouterr().out

    kept = saved_names(REMAT_POLICIES["dots"])
    assert "named 'attention_probs'" in kept and "named 'attention_context'" in kept
    dropped = saved_names(REMAT_POLICIES["full"])
    assert "attention_probs" not in dropped and "attention_context" not in dropped

    # and the rematerialised gradient is the plain one
    def loss(q, k, v):
        return jnp.sum(softmax_attention(q, k, v, None, None, True) ** 2)

    grads = jax.jit(lambda *args: [jax.grad(fn, argnums=(0, 1, 2))(*args) for fn in (
        loss, jax.checkpoint(loss, policy=REMAT_POLICIES["dots"]), jax.checkpoint(loss, policy=REMAT_POLICIES["full"]))
    ])(query, key, value)
    for remat in grads[1:]:
        for a, b in zip(grads[0], remat):
            assert_close(a, b, 1e-6)


# ------------------------------------------------------------------------------- causal attention in query blocks
@pytest.mark.parametrize("q_len, blocks", [(256, 4), (192, 3), (128, 2), (100, 1), (64, 1), (1024, 8)])
def test_causal_block_count(q_len, blocks):
    assert causal_blocks(q_len) == blocks


@pytest.mark.slow_variants
@pytest.mark.parametrize("q_len", [256, 192])
@pytest.mark.parametrize("heads, mask_kind, bias_kind", [("mha", None, None), ("gqa", "keys", "shared"),
                                                         ("mqa", "heads", None), ("gqa", None, "full")])
def test_causal_query_blocks_match_dot_product_attention(q_len, heads, mask_kind, bias_kind):
    """Long causal self-attention runs in query blocks that skip the masked triangle: the output and every
    gradient still equal ``jax.nn.dot_product_attention``'s, fully masked rows included (they attend uniformly)."""
    query, key, value = random_inputs(3, q_len, q_len, KV_HEADS[heads])
    mask = None if mask_kind is None else random_mask(4, q_len, q_len, mask_kind)
    bias = random_bias(5, bias_kind, q_len, q_len)

    def ours(q, k, v, *b):
        return softmax_attention(q, k, v, mask, b[0] if b else None, True)

    def reference(q, k, v, *b):
        return reference_attention(q, k, v, b[0] if b else None, mask=mask, is_causal=True)

    (out, grads), (ref_out, ref_grads) = vjps((ours, (query, key, value, bias)),
                                              (reference, (query, key, value, bias)))
    assert_close(out, ref_out, 1e-5, "output")
    for name, got, want in zip(("query", "key", "value", "bias"), grads, ref_grads):
        assert_close(got, want, 1e-4, f"{name} gradient")
