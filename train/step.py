"""The pure train and eval steps (the losses they take: ``flaxzoo.train.losses``).

The model is split once into a static ``graphdef``, its parameters (a pure nested dict, the checkpoint layout) and
the rest of its state (dropout RNG streams, constant buffers). A step is a ``jax.jit`` function of plain pytrees that
calls ``nnx.merge`` inside the differentiated function: no Python-side graph traversal per step, and no mutation of
a model from another trace level.

The train state is a dict ``{"params", "opt_state", "step", "rng"}``; ``rng`` is the raw key data of the run's base
key. Step ``s`` draws its dropout key as ``fold_in(rng, s)`` (and micro-batch ``i`` of it ``fold_in(that, i)``), so
the randomness of a step depends only on the seed and the step number: a resumed run reproduces it exactly.

A loss returns a sum and a count of scored tokens; a step divides once, so ``accum_steps`` micro-batches give exactly
the gradient of the whole batch (up to float rounding), also for masked-LM batches where micro-batches hold different
numbers of masked tokens.
"""

from __future__ import annotations

import zlib

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from einops import rearrange
from flax import nnx

from flaxzoo.models.layers.partitioning import ActivationPlacement, placed
from flaxzoo.train.losses import LOSSES, Batch, token_types

TrainState = dict[str, Any]


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


def new_train_state(params: Any, tx: optax.GradientTransformation, seed: int) -> TrainState:
    """The train state at step 0: ``{"params", "opt_state" (``tx.init``), "step", "rng" (the raw key data of
    ``seed``)}``. Traceable: jit it with the state's ``out_shardings``."""
    return {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32),
            "rng": jax.random.key_data(jax.random.key(seed))}


def step_key(state: TrainState) -> jax.Array:
    """The dropout key of the step about to run: ``fold_in(base key, step)``."""
    return jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])


# ========================================================================================================== steps
def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, schedule: optax.Schedule, *,
                    objective: str, accum_steps: int = 1, loss_chunk: int = 0,
                    micro_batch_sharding: jax.sharding.Sharding | None = None,
                    grad_shardings: Any = None, trainable: Callable[[tuple], bool] | None = None,
                    placement: ActivationPlacement | None = None) -> Callable:
    """``train_step(state, rest, batch, with_accuracy=True) -> (state, metrics)``, not yet jitted: the one place a
    loss is differentiated (the training loop and ``flaxzoo.train.tools.bench`` both build their step here).

    ``batch`` holds the whole step's rows ``[batch_size, seq]`` (keys: ``flaxzoo.train.batches``); with ``accum_steps`` > 1
    they are cut into micro-batches by striding (micro-batch ``i`` = rows ``i, i + accum_steps, ...``), so that each
    micro-batch keeps rows on every device of a batch-sharded layout, and gradients are summed over a ``lax.scan``
    whose carry keeps ``grad_shardings`` (the parameters' shardings: under FSDP each device holds its slice of the
    running sum, never the whole gradient); with one micro-batch the gradients are constrained to them too (a
    reduce-scatter under FSDP). ``loss_chunk``: positions per cross-entropy chunk (0 = all at once; see
    :func:`chunked_cross_entropy`).

    The gradient norm is computed once, here, and handed to the optimizer as ``tx.update(..., grad_norm=norm)``
    (``flaxzoo.train.optim``'s clipping reads it instead of computing it again). ``with_accuracy`` (a traced bool: pass
    ``jnp.bool_``) skips the argmax over the vocabulary when false: the loop asks for it at logging steps only.
    ``metrics``: ``loss`` (mean over scored tokens), ``accuracy`` (0 when not asked for), ``tokens`` (scored),
    ``grad_norm`` (before clipping), ``lr`` (of this update).

    ``trainable`` (a predicate on a parameter's path keys): differentiate those parameters only; the others get
    zero gradients and no backward pass (fine-tuning a head on a frozen encoder).

    ``placement`` (``flaxzoo.train.sharding.activation_placement(mesh)``): the model is traced with its activations
    constrained to the mesh (batch over ``data`` x ``fsdp``) and its attention chosen for the mesh's platform; None:
    no constraints (one device, tests).
    """
    loss_of = LOSSES[objective]

    def summed_loss(params, rest, batch, key, with_accuracy):
        model = nnx.merge(graphdef, params, rest, copy=True)
        reseed_dropout(model, key)
        with placed(placement):
            loss_sum, count, correct = loss_of(model, batch, loss_chunk=loss_chunk, with_accuracy=with_accuracy)
        return loss_sum, (count, correct)

    full_grad_fn = jax.value_and_grad(summed_loss, has_aux=True)

    def grad_fn(params, rest, batch, key, with_accuracy):
        if trainable is None:
            return full_grad_fn(params, rest, batch, key, with_accuracy)
        flat, tree = jax.tree_util.tree_flatten_with_path(params)
        chosen = [trainable(tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path)) for path, _ in flat]
        leaves = [leaf for _, leaf in flat]

        def partial_loss(selected, *args):
            it = iter(selected)
            merged = [next(it) if c else jax.lax.stop_gradient(leaf) for c, leaf in zip(chosen, leaves)]
            return summed_loss(jax.tree_util.tree_unflatten(tree, merged), *args)

        selected = [leaf for c, leaf in zip(chosen, leaves) if c]
        value, grads = jax.value_and_grad(partial_loss, has_aux=True)(selected, rest, batch, key, with_accuracy)
        it = iter(grads)
        return value, jax.tree_util.tree_unflatten(tree, [next(it) if c else jnp.zeros_like(leaf)
                                                          for c, leaf in zip(chosen, leaves)])

    def constrain_grads(tree):
        return tree if grad_shardings is None else jax.lax.with_sharding_constraint(tree, grad_shardings)

    def train_step(state: TrainState, rest: Any, batch: Batch,
                   with_accuracy: bool | jax.Array = True) -> tuple[TrainState, dict[str, jax.Array]]:
        params, key = state["params"], step_key(state)
        if accum_steps == 1:
            (loss_sum, (count, correct)), grads = grad_fn(params, rest, batch, key, with_accuracy)
            grads = constrain_grads(grads)  # under FSDP: each device's slice (a reduce-scatter), never the whole
        else:
            micro = jax.tree.map(lambda x: rearrange(x, "(m a) ... -> a m ...", a=accum_steps), batch)

            def accumulate(carry, inputs):
                index, micro_batch = inputs
                if micro_batch_sharding is not None:
                    micro_batch = jax.lax.with_sharding_constraint(micro_batch, micro_batch_sharding)
                (l, (c, k)), g = grad_fn(params, rest, micro_batch, jax.random.fold_in(key, index), with_accuracy)
                grads, loss_sum, count, correct = carry
                return (constrain_grads(jax.tree.map(jnp.add, grads, g)), loss_sum + l, count + c, correct + k), None

            zeros = constrain_grads(jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params))
            init = (zeros, jnp.float32(0), jnp.float32(0), jnp.float32(0))
            (grads, loss_sum, count, correct), _ = jax.lax.scan(accumulate, init,
                                                                (jnp.arange(accum_steps), micro))
        denominator = jnp.maximum(count, 1.0)
        grads = jax.tree.map(lambda g, p: (g / denominator).astype(p.dtype), grads, params)
        norm = global_norm(grads)
        updates, opt_state = update_with_norm(tx, grads, state["opt_state"], params, norm)
        new_state = {**state, "params": optax.apply_updates(params, updates), "opt_state": opt_state,
                     "step": state["step"] + 1}
        metrics = {"loss": loss_sum / denominator, "accuracy": correct / denominator, "tokens": count,
                   "grad_norm": norm, "lr": jnp.asarray(schedule(state["step"]), jnp.float32)}
        return new_state, metrics

    return train_step


def update_with_norm(tx: optax.GradientTransformation, grads: Any, opt_state: Any, params: Any,
                     norm: jax.Array) -> tuple[Any, Any]:
    """``tx.update`` with the gradient norm passed on where the chain takes extra arguments (``flaxzoo.train.optim``'s
    does); a plain optax transformation (the benchmark's ``optax.adamw``) gets none."""
    if isinstance(tx, optax.GradientTransformationExtraArgs):
        return tx.update(grads, opt_state, params, grad_norm=norm)
    return tx.update(grads, opt_state, params)


def make_eval_step(graphdef: nnx.GraphDef, *, objective: str, loss_chunk: int = 0,
                   placement: ActivationPlacement | None = None) -> Callable:
    """``eval_step(params, rest, batch) -> {"loss_sum", "tokens", "correct"}`` (sums, to add up over batches),
    dropout off. Not yet jitted. ``placement``: as in :func:`make_train_step`."""
    loss_of = LOSSES[objective]

    def eval_step(params: Any, rest: Any, batch: Batch) -> dict[str, jax.Array]:
        model = nnx.merge(graphdef, params, rest, copy=True)
        model.eval()
        with placed(placement):
            loss_sum, count, correct = loss_of(model, batch, loss_chunk=loss_chunk)
        return {"loss_sum": loss_sum, "tokens": count, "correct": correct}

    return eval_step


def _make_predict(graphdef: nnx.GraphDef, placement: ActivationPlacement | None, read: Callable[[Any], jax.Array],
                  *, segments: bool = False) -> Callable:
    """``predict(params, rest, batch)``: the model in eval mode (dropout off) on the batch's ids, mask and token
    types (and segment ids with ``segments``), its output turned into an array by ``read``. Not yet jitted."""
    def predict(params: Any, rest: Any, batch: Batch) -> jax.Array:
        model = nnx.merge(graphdef, params, rest, copy=True)
        model.eval()
        extra = {"segment_ids": batch.get("segment_ids")} if segments else {}
        with placed(placement):
            output = model(batch["input_ids"], batch.get("attention_mask"), token_types(model, batch), **extra)
        return read(output)

    return predict


def make_predict_masked(graphdef: nnx.GraphDef, placement: ActivationPlacement | None = None) -> Callable:
    """``predict(params, rest, batch) -> [batch, seq]`` argmax token ids of a masked LM (for the eval sample).
    ``placement``: as in :func:`make_train_step`."""
    return _make_predict(graphdef, placement, lambda logits: jnp.argmax(logits, axis=-1).astype(jnp.int32),
                         segments=True)


def make_predict_probabilities(graphdef: nnx.GraphDef, placement: ActivationPlacement | None = None) -> Callable:
    """``predict(params, rest, batch) -> [batch, num_labels]`` class probabilities (float32) of a sequence
    classifier. ``placement``: as in :func:`make_train_step`."""
    return _make_predict(graphdef, placement, lambda logits: jax.nn.softmax(logits.astype(jnp.float32), axis=-1))


def make_predict_spans(graphdef: nnx.GraphDef, placement: ActivationPlacement | None = None) -> Callable:
    """``predict(params, rest, batch) -> [batch, 2, seq]`` start and end logits (float32) of a question-answering
    model. ``placement``: as in :func:`make_train_step`."""
    return _make_predict(graphdef, placement, lambda spans: jnp.stack([spans.start_logits, spans.end_logits],
                                                                      axis=1).astype(jnp.float32))
