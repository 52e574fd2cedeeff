"""The pure train and eval steps, and the losses.

The model is split once into a static ``graphdef``, its parameters (a pure nested dict, the checkpoint layout) and
the rest of its state (dropout RNG streams, constant buffers). A step is a ``jax.jit`` function of plain pytrees that
calls ``nnx.merge`` inside the differentiated function: no Python-side graph traversal per step, and no mutation of
a model from another trace level.

The train state is a dict ``{"params", "opt_state", "step", "rng"}``; ``rng`` is the raw key data of the run's base
key. Step ``s`` draws its dropout key as ``fold_in(rng, s)`` (and micro-batch ``i`` of it ``fold_in(that, i)``), so
the randomness of a step depends only on the seed and the step number: a resumed run reproduces it exactly.

Losses are computed in float32 from float32 logits as a sum and a count of scored tokens; a step divides once, so
``accum_steps`` micro-batches give exactly the gradient of the whole batch (up to float rounding), also for masked-LM
batches where micro-batches hold different numbers of masked tokens.
"""

from __future__ import annotations

import zlib

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from einops import rearrange
from flax import nnx

from train.data import IGNORE_INDEX

Batch = dict[str, jax.Array]
TrainState = dict[str, Any]


# ========================================================================================================= losses
def token_cross_entropy(logits: jax.Array, labels: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array,
                                                                                         jax.Array]:
    """``(sum of −log p(label), number of valid tokens, number of valid tokens predicted right)``, all float32.

    ``logits: [batch, seq, vocab]``, ``labels: [batch, seq]`` int, ``valid: [batch, seq]`` bool.
    """
    logits = logits.astype(jnp.float32)
    safe_labels = jnp.where(valid, labels, 0)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, safe_labels)
    validf = valid.astype(jnp.float32)
    correct = (jnp.argmax(logits, axis=-1) == safe_labels).astype(jnp.float32) * validf
    return jnp.sum(losses * validf), jnp.sum(validf), jnp.sum(correct)


def causal_lm_loss(model: nnx.Module, batch: Batch) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Next-token loss of a ``GPTForCausalLM`` on ``{"input_ids", "targets"}`` (``[batch, seq]``, already shifted:
    every position is scored but the rows padding an evaluation's last batch, whose targets are −100)."""
    logits = model(batch["input_ids"])
    return token_cross_entropy(logits, batch["targets"], batch["targets"] != IGNORE_INDEX)


def masked_lm_loss(model: nnx.Module, batch: Batch) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Masked-token loss of a ``BertForMaskedLM`` on ``{"input_ids", "labels" (−100 = not scored),
    "attention_mask", "token_type_ids"}``."""
    logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    labels = batch["labels"]
    return token_cross_entropy(logits, labels, labels != IGNORE_INDEX)


LOSSES: dict[str, Callable[[nnx.Module, Batch], tuple[jax.Array, jax.Array, jax.Array]]] = {
    "causal": causal_lm_loss,
    "mlm": masked_lm_loss,
}


def global_norm(tree: Any) -> jax.Array:
    """``sqrt(sum of squares)`` over every leaf of ``tree``, in float32."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


# ============================================================================================================ rng
def reseed_dropout(model: nnx.Module, key: jax.Array) -> None:
    """Point every RNG stream of ``model`` (the dropout layers' streams) at its own key derived from ``key`` and the
    stream's path, and reset its counter.

    Layer ``i``'s stream gets the same key whether the layers are stored one by one (``layers.i.…``) or stacked
    (``layers.…``, ``[num_layers]`` keys), so ``scan_layers`` never changes the dropout masks."""
    for path, variable in nnx.iter_graph(model):
        if isinstance(variable, nnx.RngCount):
            variable.set_value(jnp.zeros_like(variable.get_value()))
        if not isinstance(variable, nnx.RngKey):
            continue
        names = [str(p) for p in path]
        layer = None
        if "layers" in names and names.index("layers") + 1 < len(names):
            at = names.index("layers") + 1
            if names[at].isdigit():
                layer = int(names.pop(at))
        stream_key = jax.random.fold_in(key, zlib.crc32(".".join(names).encode()) & 0x7FFFFFFF)
        shape = variable.get_value().shape
        if shape:  # stacked layers: one key per layer
            value = jax.vmap(lambda i: jax.random.fold_in(stream_key, i))(jnp.arange(shape[0]))
        else:
            value = stream_key if layer is None else jax.random.fold_in(stream_key, layer)
        variable.set_value(value)


def step_key(state: TrainState) -> jax.Array:
    """The dropout key of the step about to run: ``fold_in(base key, step)``."""
    return jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])


# ========================================================================================================== steps
def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, schedule: optax.Schedule, *,
                    objective: str, accum_steps: int = 1,
                    micro_batch_sharding: jax.sharding.Sharding | None = None,
                    grad_shardings: Any = None) -> Callable:
    """``train_step(state, rest, batch) -> (state, metrics)``, not yet jitted.

    ``batch`` holds the whole step's rows ``[batch_size, seq]``; with ``accum_steps`` > 1 they are cut into
    micro-batches by striding (micro-batch ``i`` = rows ``i, i + accum_steps, ...``), so that each micro-batch keeps
    rows on every device of a batch-sharded layout, and gradients are summed over a ``lax.scan`` whose carry keeps
    ``grad_shardings`` (the parameters' shardings: under FSDP each device holds its slice of the running sum, never
    the whole gradient).
    ``metrics``: ``loss`` (mean over scored tokens), ``accuracy``, ``tokens`` (scored), ``grad_norm`` (before
    clipping), ``lr`` (of this update).
    """
    loss_of = LOSSES[objective]

    def summed_loss(params, rest, batch, key):
        model = nnx.merge(graphdef, params, rest, copy=True)
        reseed_dropout(model, key)
        loss_sum, count, correct = loss_of(model, batch)
        return loss_sum, (count, correct)

    grad_fn = jax.value_and_grad(summed_loss, has_aux=True)

    def train_step(state: TrainState, rest: Any, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        params, key = state["params"], step_key(state)
        if accum_steps == 1:
            (loss_sum, (count, correct)), grads = grad_fn(params, rest, batch, key)
        else:
            micro = jax.tree.map(lambda x: rearrange(x, "(m a) ... -> a m ...", a=accum_steps), batch)

            def accumulate(carry, inputs):
                index, micro_batch = inputs
                if micro_batch_sharding is not None:
                    micro_batch = jax.lax.with_sharding_constraint(micro_batch, micro_batch_sharding)
                (l, (c, k)), g = grad_fn(params, rest, micro_batch, jax.random.fold_in(key, index))
                grads, loss_sum, count, correct = carry
                return (constrain(jax.tree.map(jnp.add, grads, g)), loss_sum + l, count + c, correct + k), None

            def constrain(tree):
                if grad_shardings is None:
                    return tree
                return jax.lax.with_sharding_constraint(tree, grad_shardings)

            zeros = constrain(jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params))
            init = (zeros, jnp.float32(0), jnp.float32(0), jnp.float32(0))
            (grads, loss_sum, count, correct), _ = jax.lax.scan(accumulate, init,
                                                                (jnp.arange(accum_steps), micro))
        denominator = jnp.maximum(count, 1.0)
        grads = jax.tree.map(lambda g, p: (g / denominator).astype(p.dtype), grads, params)
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        new_state = {**state, "params": optax.apply_updates(params, updates), "opt_state": opt_state,
                     "step": state["step"] + 1}
        metrics = {"loss": loss_sum / denominator, "accuracy": correct / denominator, "tokens": count,
                   "grad_norm": global_norm(grads), "lr": jnp.asarray(schedule(state["step"]), jnp.float32)}
        return new_state, metrics

    return train_step


def make_eval_step(graphdef: nnx.GraphDef, *, objective: str) -> Callable:
    """``eval_step(params, rest, batch) -> {"loss_sum", "tokens", "correct"}`` (sums, to add up over batches),
    dropout off. Not yet jitted."""
    loss_of = LOSSES[objective]

    def eval_step(params: Any, rest: Any, batch: Batch) -> dict[str, jax.Array]:
        model = nnx.merge(graphdef, params, rest, copy=True)
        model.eval()
        loss_sum, count, correct = loss_of(model, batch)
        return {"loss_sum": loss_sum, "tokens": count, "correct": correct}

    return eval_step


def make_predict_masked(graphdef: nnx.GraphDef) -> Callable:
    """``predict(params, rest, batch) -> [batch, seq]`` argmax token ids of a masked LM (for the eval sample)."""
    def predict(params: Any, rest: Any, batch: Batch) -> jax.Array:
        model = nnx.merge(graphdef, params, rest, copy=True)
        model.eval()
        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

    return predict
