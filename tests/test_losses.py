"""The losses (train/losses.py) and the update of train/step.py and train/optim.py on their own (no data, no
trainer): chunked cross-entropy, the MLM head on gathered positions, accuracy on request, clipping by the step's one
gradient norm."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def tiny_lm(kind: str, seed: int = 0, vocab: int = 97):
    from flaxzoo.models.architectures.encoder import BertForMaskedLM
    from flaxzoo.models.families import get_preset
    from flaxzoo.models.architectures.decoder import GPTForCausalLM
    from flaxzoo.models.modeling import create_model

    sizes = dict(vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                 max_position_embeddings=64, dropout=0.0, attention_dropout=0.0)
    if kind == "gpt":
        return create_model(get_preset("gpt2", **sizes, bos_token_id=None, eos_token_id=None), GPTForCausalLM,
                            seed=seed)
    return create_model(get_preset("bert-base-uncased", **sizes), BertForMaskedLM, seed=seed)


@pytest.mark.slow_variants
@pytest.mark.parametrize("seq, chunk", [(24, 8), (23, 5), (24, 24)])
def test_chunked_cross_entropy_equals_the_whole_sequence_in_value_and_gradient(seq, chunk):
    from flax import nnx

    from flaxzoo.train.losses import causal_lm_loss

    model = tiny_lm("gpt", seed=seq + chunk)
    model.eval()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    rng = np.random.default_rng(seq * 7 + chunk)
    targets = rng.integers(0, 97, (3, seq)).astype(np.int32)
    targets[1, : seq // 2] = -100  # unscored positions, also across chunk borders
    batch = {"input_ids": jnp.asarray(rng.integers(0, 97, (3, seq)), jnp.int32), "targets": jnp.asarray(targets)}

    def mean_loss(p, chunked):
        total, count, _ = causal_lm_loss(nnx.merge(graphdef, p, rest, copy=True), batch,
                                         loss_chunk=chunk if chunked else 0)
        return total / count

    @jax.jit  # one program for both losses, their gradients and the logits (eager would compile op by op)
    def run(p):
        model_logits = nnx.merge(graphdef, p, rest, copy=True)(batch["input_ids"])
        return [jax.value_and_grad(mean_loss)(p, c) for c in (False, True)], model_logits

    ((whole, g_whole), (parts, g_parts)), logits = run(params)
    logits = np.asarray(logits, np.float64)
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    valid = targets != -100
    reference = -np.take_along_axis(log_probs, np.where(valid, targets, 0)[..., None], -1)[..., 0][valid].mean()
    assert abs(float(whole) - reference) < 1e-5 and abs(float(parts) - reference) < 1e-5
    for a, b in zip(jax.tree.leaves(g_whole), jax.tree.leaves(g_parts)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6, rtol=1e-4)


def test_masked_lm_loss_on_gathered_positions_equals_the_full_head():
    """The head on ``masked_positions`` only scores exactly what the head on every position scores at ``labels``."""
    from flaxzoo.train.losses import masked_lm_loss

    model = tiny_lm("bert", seed=3)
    model.eval()
    rng = np.random.default_rng(5)
    ids = rng.integers(5, 97, (4, 20)).astype(np.int32)
    positions = np.sort(np.stack([rng.choice(20, 4, replace=False) for _ in range(4)]), axis=1).astype(np.int32)
    masked_labels = np.take_along_axis(ids, positions, 1)
    masked_labels[2, 3] = -100  # an unused slot
    positions[2, 3] = 0
    labels = np.full_like(ids, -100)
    for row in range(4):
        for slot in range(4):
            if masked_labels[row, slot] != -100:
                labels[row, positions[row, slot]] = masked_labels[row, slot]
    from flax import nnx

    common = {"input_ids": jnp.asarray(ids), "attention_mask": jnp.ones_like(jnp.asarray(ids))}
    graphdef, state = nnx.split(model)

    @jax.jit
    def both(state):
        m = nnx.merge(graphdef, state, copy=True)
        return (masked_lm_loss(m, {**common, "masked_positions": jnp.asarray(positions),
                                   "masked_labels": jnp.asarray(masked_labels)}),
                masked_lm_loss(m, {**common, "labels": jnp.asarray(labels)}))

    gathered, full = both(state)
    assert float(gathered[1]) == float(full[1]) == 15
    assert abs(float(gathered[0]) - float(full[0])) < 1e-4 and float(gathered[2]) == float(full[2])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_cross_entropy_equals_the_float32_definition_in_value_and_gradient(dtype):
    """Compute-dtype logits (an accelerator's bfloat16 head): the loss equals numpy's float64 log-softmax of the same
    values, and the gradient equals autodiff through optax's float32 cross-entropy of the upcast logits (softmax -
    one-hot, rounded to the logits' dtype) within one unit of that dtype's last place; padded-vocabulary logits
    (``PADDED_LOGIT``) get probability 0. ``token_cross_entropy`` takes this path for such logits."""
    import optax

    from flaxzoo.models.layers.embeddings import PADDED_LOGIT
    from flaxzoo.train.losses import low_precision_cross_entropy, token_cross_entropy

    rng = np.random.default_rng(11 if dtype == "bfloat16" else 12)
    logits = jnp.asarray(rng.standard_normal((3, 7, 300)) * 5, dtype).at[:, :, 290:].set(PADDED_LOGIT)
    labels = jnp.asarray(rng.integers(0, 290, (3, 7)), jnp.int32)
    weights = jnp.asarray(rng.random((3, 7)), jnp.float32)

    def ours(x):
        return jnp.sum(low_precision_cross_entropy(x, labels) * weights)

    def upcast(x):
        return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(x.astype(jnp.float32), labels) * weights)

    (value, grad), (ref_value, ref_grad) = jax.jit(lambda x: (jax.value_and_grad(ours)(x),
                                                              jax.value_and_grad(upcast)(x)))(logits)
    wide = np.asarray(logits.astype(jnp.float32), np.float64)
    top = wide.max(-1, keepdims=True)
    log_probs = wide - top - np.log(np.exp(wide - top).sum(-1, keepdims=True))
    expected = -(np.take_along_axis(log_probs, np.asarray(labels)[..., None], -1)[..., 0] * np.asarray(weights)).sum()
    assert abs(float(value) - expected) < 1e-5 * abs(expected) and abs(float(value) - float(ref_value)) < 1e-5
    assert grad.dtype == logits.dtype
    ulp = float(jnp.finfo(dtype).eps)
    np.testing.assert_allclose(np.asarray(grad, np.float32), np.asarray(ref_grad, np.float32),
                               rtol=ulp, atol=1e-7)
    assert float(jnp.max(jnp.abs(grad[:, :, 290:]))) == 0.0
    valid = jnp.ones((3, 7), bool)
    total, count, _ = token_cross_entropy(logits, labels, valid)
    assert count == 21 and abs(float(total) - float(low_precision_cross_entropy(logits, labels).sum())) < 1e-4


def test_blocked_argmax_is_numpys_first_maximum():
    """The accuracy's argmax, found per vocabulary block, equals numpy's (the first maximum) with ties within and
    across blocks, NaN, -inf rows, vocabularies of no, few and many power-of-two factors and any block count."""
    from flaxzoo.train.losses import blocked_argmax

    rng = np.random.default_rng(7)
    for shape in [(3, 5, 512), (2, 3, 50304), (4, 6, 1000), (2, 3, 999), (5, 6), (2, 3, 128256 // 8)]:
        logits = np.round(rng.standard_normal(shape) * 2).astype(np.float32) / 2  # ties everywhere
        np.testing.assert_array_equal(jax.jit(blocked_argmax)(logits), np.argmax(logits, axis=-1), err_msg=str(shape))
    logits = np.round(rng.standard_normal((4, 3, 96)) * 2).astype(np.float32) / 2
    for blocks in (1, 2, 3, 8, 12, 96):  # any divisor, as a vocabulary split over that many devices gets
        np.testing.assert_array_equal(blocked_argmax(logits, blocks), np.argmax(logits, axis=-1), err_msg=str(blocks))
    with pytest.raises(ValueError, match="blocks=5: expected a positive divisor of the vocabulary size 96"):
        blocked_argmax(logits, 5)
    special = np.zeros((3, 64), np.float32)
    special[0, [9, 40]] = np.nan
    special[1] = -np.inf
    special[2, [3, 35]] = 5.0  # the same maximum in the first and the second half
    np.testing.assert_array_equal(blocked_argmax(special), [9, 0, 3])


def test_accuracy_is_skipped_when_not_asked_for():
    from flaxzoo.train.losses import token_cross_entropy

    logits = jnp.asarray(np.random.default_rng(1).standard_normal((2, 5, 11)), jnp.float32)
    labels = jnp.argmax(logits, -1)
    valid = jnp.ones((2, 5), bool)
    on = jax.jit(token_cross_entropy)(logits, labels, valid, jnp.bool_(True))
    off = jax.jit(token_cross_entropy)(logits, labels, valid, jnp.bool_(False))
    assert float(on[2]) == 10 and float(off[2]) == 0 and float(on[0]) == float(off[0])


@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clipping_by_the_given_norm_equals_optax(given, max_norm):
    import optax

    from flaxzoo.train.optim import clip_by_given_norm
    from flaxzoo.train.step import global_norm

    grads = {"a": jnp.asarray(np.random.default_rng(2).standard_normal((3, 4)), jnp.float32),
             "b": jnp.arange(5, dtype=jnp.float32)}
    expected, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
    extra = {"grad_norm": global_norm(grads)} if given else {}
    clipped, _ = clip_by_given_norm(max_norm).update(grads, optax.EmptyState(), **extra)
    for k in grads:
        np.testing.assert_allclose(np.asarray(clipped[k]), np.asarray(expected[k]), rtol=1e-6, atol=0)


def test_only_train_step_differentiates_a_loss():
    """One step for the loop and the benchmark: no ``value_and_grad`` / ``jax.grad`` outside train/step.py."""
    root = pathlib.Path(__file__).resolve().parent.parent
    offenders = [str(path.relative_to(root)) for folder in ("train", "models") for path in (root / folder).rglob("*.py")
                 if path.name != "step.py" and ("value_and_grad" in path.read_text() or "jax.grad(" in path.read_text())]
    assert offenders == []
