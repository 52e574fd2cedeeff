"""One optimizer step of the project's train step (``train/step.py``'s ``make_train_step``, jitted as the training
loop jits it) on every registered family (``flaxzoo.models.families.FAMILIES``, read when the tests are collected):
its tiny config (``tests/test_every_family.py`` / ``tests/test_every_encoder.py``), the causal LM on next-token
targets, the masked LM on masked labels or the encoder-decoder on teacher-forced targets, with a padded row and
unscored positions.

Each step is checked against an independent reference: the loss the step reports equals a NumPy cross-entropy of the
model's own eager logits on the scored positions; the gradient norm is finite and positive; the step counter moves;
and the updated parameters give a lower loss on the same batch (the step descends). The quick tier's train step of
every family; the engine fine-tunes of ``tests/test_finetune_families.py`` and ``tests/test_decoder_classifier.py``
are the slow tier's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from flaxzoo.models.families import FAMILIES
from flaxzoo.train.batches import IGNORE_INDEX
from flaxzoo.train.step import make_train_step, new_train_state
from tests import test_every_encoder, test_every_family

LR = 1e-3  # small enough that one Adam step descends on every family's tiny model
SEQ = 8


def batch_for(objective: str, vocab: int) -> dict[str, np.ndarray]:
    """Two rows: a causal batch (``input_ids`` / shifted ``targets``, the second row's last three targets unscored),
    a masked batch (``attention_mask`` right-padding the second row by three; ``labels`` at four positions), or a
    seq2seq batch (sources of SEQ tokens, the second padded by three; targets of 5, the second padded by two)."""
    ids = np.random.RandomState(0).randint(3, vocab, (2, SEQ + 1)).astype(np.int32)
    if objective == "seq2seq":
        source, mask = ids[:, :-1].copy(), np.ones((2, SEQ), np.int32)
        source[1, -3:], mask[1, -3:] = 0, 0
        labels = ids[:, :5].copy()
        labels[1, -2:] = IGNORE_INDEX
        decoder_ids = np.concatenate([np.zeros((2, 1), np.int32), np.where(labels < 0, 0, labels)[:, :-1]], axis=1)
        return {"input_ids": source, "attention_mask": mask, "decoder_input_ids": decoder_ids,
                "decoder_attention_mask": (labels != IGNORE_INDEX).astype(np.int32), "labels": labels}
    if objective == "causal":
        targets = ids[:, 1:].copy()
        targets[1, -3:] = IGNORE_INDEX
        return {"input_ids": ids[:, :-1], "targets": targets}
    ids = ids[:, :-1]
    mask = np.ones_like(ids)
    mask[1, -3:] = 0
    ids[1, -3:] = 0
    labels = np.full_like(ids, IGNORE_INDEX)
    labels[0, [1, 4]], labels[1, [0, 3]] = ids[0, [1, 4]], ids[1, [0, 3]]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def reference_loss(model: nnx.Module, batch: dict[str, np.ndarray], objective: str) -> float:
    """Mean cross-entropy (NumPy, float64) of the model's eager logits on the scored positions."""
    if objective == "seq2seq":
        logits = model(batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"],
                       batch["decoder_attention_mask"])
    elif objective == "causal":
        logits = model(batch["input_ids"])
    else:
        logits = model(batch["input_ids"], batch["attention_mask"])
    logits = np.asarray(logits, np.float64)
    labels = batch["targets" if objective == "causal" else "labels"]
    scored = labels != IGNORE_INDEX
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_probs, np.where(scored, labels, 0)[..., None], -1)[..., 0]
    return float(-picked[scored].mean())


def tiny_model(model_type: str) -> tuple[nnx.Module, str]:
    """The family's causal LM, encoder-decoder or masked LM of its tiny config, and its objective."""
    family = FAMILIES[model_type]
    if family.causal:
        model = test_every_family.generating_class(family)(test_every_family.tiny_config(model_type),
                                                           rngs=nnx.Rngs(0))
        return model, "seq2seq" if model.config.is_encoder_decoder else "causal"
    return family.class_for("masked_lm")(test_every_encoder.tiny_config(model_type), rngs=nnx.Rngs(0)), "mlm"


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_one_train_step_gives_the_reference_loss_and_descends(model_type):
    model, objective = tiny_model(model_type)
    model.eval()  # no dropout: the step's loss is the eager reference's
    batch = batch_for(objective, model.config.vocab_size)
    before = reference_loss(model, batch, objective)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx, schedule = optax.adam(LR), optax.constant_schedule(LR)
    step = jax.jit(make_train_step(graphdef, tx, schedule, objective=objective))
    inputs = {k: jnp.asarray(v) for k, v in batch.items()}
    state, metrics = step(new_train_state(params, tx, seed=0), rest, inputs)
    loss, norm = float(metrics["loss"]), float(metrics["grad_norm"])
    scored = int((batch["targets" if objective == "causal" else "labels"] != IGNORE_INDEX).sum())
    assert int(metrics["tokens"]) == scored and int(state["step"]) == 1
    np.testing.assert_allclose(loss, before, rtol=1e-5, atol=1e-5)
    assert np.isfinite(norm) and norm > 0
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(state["params"])))
    state, metrics = step(state, rest, inputs)  # the same program: the loss of the updated parameters
    after = float(metrics["loss"])
    print(f"\n  {model_type}: loss {loss:.4f} -> {after:.4f} after one step, grad norm {norm:.3f}")
    assert int(state["step"]) == 2 and after < before - 1e-4
