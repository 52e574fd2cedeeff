"""The optimizer: AdamW as an optax chain, with a warmup + decay schedule, clipping, masks and layer-wise LR decay.

``clip by the global norm → scale_by_adam → add_decayed_weights (masked) → scale_by_learning_rate → layer scales``.

- Weight decay applies to matrices only: biases, norm scales and (unless ``decay_embeddings``) the embedding tables
  (token, position, token type) are masked off.
- The schedule warms up linearly from 0 to ``lr`` over ``warmup_steps``, then decays to ``min_lr_ratio · lr`` at
  ``steps`` with a cosine or a straight line (or stays constant).
- Layer-wise LR decay (``layer_decay`` < 1, ELECTRA / BEiT fine-tuning): a parameter of layer ``i`` (1-based; the
  embeddings are layer 0, everything above the last layer is ``L + 1``) learns at ``lr · layer_decay^(L + 1 − i)``.
- The chain has the same structure whatever the options (a disabled step is neutral, not absent), so a checkpoint's
  optimizer state restores after a change of ``grad_clip``, ``weight_decay`` or ``layer_decay``.

Gradient accumulation over micro-batches happens in the train step (``train/step.py``), not here: one optimizer
update per step, whatever ``accum_steps`` is.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from flaxzoo.models.layers.layer_layout import is_stacked_path

if TYPE_CHECKING:
    from flaxzoo.train.config import OptimConfig

EMBEDDING_MODULE = "embeddings"  # the attribute name of InputEmbeddings in the layer stack
LAYERS_MODULE = "layers"


def make_schedule(optim: "OptimConfig", steps: int) -> optax.Schedule:
    """Learning rate per step (step 0 is the first update)."""
    peak, warmup = optim.lr, min(optim.warmup_steps, steps)
    end = peak * optim.min_lr_ratio
    decay_steps = max(steps - warmup, 1)
    if optim.schedule == "constant":
        decay = optax.constant_schedule(peak)
    elif optim.schedule == "linear":
        decay = optax.linear_schedule(peak, end, decay_steps)
    elif optim.schedule == "cosine":
        decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=end / peak if peak else 0.0)
    else:
        raise ValueError(f"optim.schedule={optim.schedule!r}: expected 'cosine', 'linear' or 'constant'")
    if warmup == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def _keys(path) -> list[Any]:
    return [getattr(p, "key", getattr(p, "name", getattr(p, "idx", None))) for p in path]


NO_DECAY_NAMES = ("bias", "scale")  # biases (also the [heads, head_dim] ones of attention) and norm scales


def decay_mask(params: Any, *, decay_embeddings: bool) -> Any:
    """True where weight decay applies: weight matrices and tables (rank >= 2 per layer, not named ``bias`` /
    ``scale``), minus the embedding tables unless ``decay_embeddings``."""
    def decays(path, leaf) -> bool:
        keys = _keys(path)
        if leaf.ndim - is_stacked_path(keys) < 2 or keys[-1] in NO_DECAY_NAMES:
            return False
        return decay_embeddings or EMBEDDING_MODULE not in keys

    return jax.tree_util.tree_map_with_path(decays, params)


def layer_index(path, num_layers: int) -> int:
    """0 for the embeddings, ``i + 1`` for ``layers.i``, ``num_layers + 1`` for anything above the stack."""
    keys = _keys(path)
    if LAYERS_MODULE in keys:
        i = keys.index(LAYERS_MODULE)
        if i + 1 < len(keys) and isinstance(keys[i + 1], (int, str)) and str(keys[i + 1]).isdigit():
            return int(keys[i + 1]) + 1
    if EMBEDDING_MODULE in keys:
        return 0
    return num_layers + 1


def layer_scales(params: Any, num_layers: int, layer_decay: float) -> Any:
    """The LR multiplier of each parameter: ``layer_decay ** (num_layers + 1 - layer_index)``; for stacked layers a
    ``[num_layers, 1, ...]`` array, layer ``i`` of the stack taking index ``i + 1``."""
    def scale(path, leaf):
        if is_stacked_path(_keys(path)):
            per_layer = layer_decay ** (num_layers - jnp.arange(num_layers, dtype=jnp.float32))
            return per_layer.reshape((num_layers,) + (1,) * (leaf.ndim - 1))
        return jnp.float32(layer_decay ** (num_layers + 1 - layer_index(path, num_layers)))

    return jax.tree_util.tree_map_with_path(scale, params)


def scale_by_layer_decay(num_layers: int, layer_decay: float) -> optax.GradientTransformation:
    """Multiply each update by its layer's LR multiplier (:func:`layer_scales`), worked out from the update's own
    tree at each step, so it also applies inside ``optax.multi_transform`` (whose groups see masked trees)."""
    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None):
        del params
        scales = layer_scales(updates, num_layers, layer_decay)
        return jax.tree.map(lambda u, s: (u * s).astype(u.dtype), updates, scales), state

    return optax.GradientTransformation(init, update)


def clip_by_given_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
    """``optax.clip_by_global_norm(max_norm)`` that takes the norm from ``update(..., grad_norm=norm)`` when the
    caller has it (the train step computes it once, for its metrics) and computes it only otherwise. Its state is
    optax's (empty), so the chain's state layout is unchanged."""
    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None, *, grad_norm=None, **extra):
        del params, extra
        norm = optax.tree.norm(updates) if grad_norm is None else grad_norm
        keep = norm < max_norm  # max_norm = inf (clipping off): always
        return jax.tree.map(lambda u: jnp.where(keep, u, (u / norm.astype(u.dtype)) * max_norm), updates), state

    return optax.GradientTransformationExtraArgs(init, update)


def make_optimizer(optim: "OptimConfig", steps: int, params: Any,
                   num_layers: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """``(tx, schedule)`` for the typed ``optim`` section (``flaxzoo.train.config.OptimConfig``, checked at construction);
    ``params`` (arrays or shapes) give the tree structure."""
    schedule = make_schedule(optim, steps)
    clip = optim.grad_clip if optim.grad_clip > 0 else math.inf
    tx = optax.chain(
        clip_by_given_norm(clip),
        optax.scale_by_adam(b1=optim.b1, b2=optim.b2, eps=optim.eps),
        optax.add_decayed_weights(optim.weight_decay, mask=decay_mask(params, decay_embeddings=optim.decay_embeddings)),
        optax.scale_by_learning_rate(schedule),
        scale_by_layer_decay(num_layers, optim.layer_decay),
    )
    return tx, schedule


class FrozenUntilState(NamedTuple):
    count: jax.Array  # updates seen, frozen ones included
    inner: Any


def frozen_until(inner: optax.GradientTransformation, steps: int) -> optax.GradientTransformationExtraArgs:
    """Zero updates for the first ``steps`` updates, then ``inner``. While frozen, ``inner`` is not called, so its
    state (Adam's moments and step count, a schedule's count) starts at the first real update as if training began
    there: no bias-correction jump at the switch."""
    inner = optax.with_extra_args_support(inner)

    def init(params):
        return FrozenUntilState(jnp.zeros((), jnp.int32), inner.init(params))

    def update(updates, state, params=None, **extra):
        def active():
            return inner.update(updates, state.inner, params, **extra)

        def frozen():
            return jax.tree.map(jnp.zeros_like, updates), state.inner

        new_updates, inner_state = jax.lax.cond(state.count >= steps, active, frozen)
        return new_updates, FrozenUntilState(state.count + 1, inner_state)

    return optax.GradientTransformationExtraArgs(init, update)


HEAD, BACKBONE = "head", "backbone"


def make_finetune_optimizer(optim: "OptimConfig", steps: int, params: Any, num_layers: int, *, freeze_steps: int,
                            is_head: Callable[[tuple], bool], head_lr: float | None = None
                            ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """``(tx, head schedule)`` for fine-tuning: global-norm clipping, then AdamW with layer-wise LR decay in two
    groups: the head (``is_head(path keys)``: the parameters above the encoder) learns from the first step on the
    schedule over ``steps`` with peak ``head_lr`` (None: ``optim.lr``); the backbone is frozen for ``freeze_steps``
    updates, then learns on the same schedule shape with peak ``optim.lr`` over the remaining ``steps -
    freeze_steps`` (its own warmup from zero)."""
    del params
    head_optim = optim if head_lr is None else dataclasses.replace(optim, lr=head_lr)
    clip = optim.grad_clip if optim.grad_clip > 0 else math.inf

    def group(schedule: optax.Schedule) -> optax.GradientTransformation:
        return optax.chain(
            optax.scale_by_adam(b1=optim.b1, b2=optim.b2, eps=optim.eps),
            optax.add_decayed_weights(optim.weight_decay,
                                      mask=lambda p: decay_mask(p, decay_embeddings=optim.decay_embeddings)),
            optax.scale_by_learning_rate(schedule),
            scale_by_layer_decay(num_layers, optim.layer_decay),
        )

    head_schedule = make_schedule(head_optim, steps)
    backbone = group(make_schedule(optim, max(steps - freeze_steps, 1)))
    labels = lambda tree: jax.tree_util.tree_map_with_path(  # noqa: E731
        lambda path, _: HEAD if is_head(tuple(_keys(path))) else BACKBONE, tree)
    tx = optax.chain(
        clip_by_given_norm(clip),
        optax.multi_transform({HEAD: group(head_schedule),
                               BACKBONE: frozen_until(backbone, freeze_steps) if freeze_steps else backbone}, labels),
    )
    return tx, head_schedule
