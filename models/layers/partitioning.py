"""Where activations live on a device mesh: sharding constraints by logical axis names, set by whoever runs the model.

The layers name the axes of their activations (``ACTIVATION_BATCH``, ``ACTIVATION_LENGTH``, ...) and call
:func:`constrain`. Outside a :func:`placed` block (a notebook, a test, decoding) that is a no-op. Inside one (the
train and eval steps of ``train/``, ``train/tools/compile.py``), each name is mapped to mesh axes by the placement's rule
(``train/sharding.py``: batch over ``data`` × ``fsdp``, heads and MLP width over ``tensor``) and becomes a
``with_sharding_constraint``.

Why: parameters under FSDP are split along ``embed``. Without constraints on the activations, XLA's sharding
propagation is free to follow the weights, and on TPU it did: it split the 768-wide hidden dimension 8 ways, kept
the whole global batch on every chip (``bf16[12, 64, 1024, 3072]`` temporaries, 65.8 GB on a 16 GB v5e) and
all-reduced activations. Pinning the batch dimension makes it gather the weights instead (ZeRO-3), as MaxText's
layers do.

The placement also tells the attention dispatcher which platform the step is compiled for (``tpu`` for a
compile-only TPU mesh traced on a CPU host), instead of ``jax.default_backend()``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Callable, Iterator, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# Logical names of activation axes (parameters use "embed", "heads", ... : different rules, see train/sharding.py).
ACTIVATION_BATCH = "activation_batch"
ACTIVATION_LENGTH = "activation_length"
ACTIVATION_EMBED = "activation_embed"
ACTIVATION_HEADS = "activation_heads"
ACTIVATION_KV_HEADS = "activation_kv_heads"
ACTIVATION_MLP = "activation_mlp"
ACTIVATION_VOCAB = "activation_vocab"
# The output head's logits split by vocabulary rather than by batch (see ``LMHead``): their rows over the data axis
# only, the vocabulary over every axis that splits the token table's rows.
HEAD_BATCH = "activation_head_batch"
HEAD_VOCAB = "activation_head_vocab"

# [batch, seq, hidden]: the residual stream between layers
HIDDEN = (ACTIVATION_BATCH, ACTIVATION_LENGTH, ACTIVATION_EMBED)

SpecRule = Callable[[Sequence[str | None], Sequence[int]], PartitionSpec]


@dataclasses.dataclass(frozen=True)
class ActivationPlacement:
    """A mesh, the rule that maps logical activation axes (and a shape) to a ``PartitionSpec`` of it, and the
    platform of its devices (``"cpu"``, ``"gpu"``, ``"tpu"``)."""

    mesh: Mesh
    spec_for: SpecRule
    platform: str

    def spec(self, logical: Sequence[str | None], shape: Sequence[int]) -> PartitionSpec:
        return self.spec_for(tuple(logical), tuple(shape))


_PLACEMENT: contextvars.ContextVar[ActivationPlacement | None] = contextvars.ContextVar("activation_placement",
                                                                                        default=None)


@contextlib.contextmanager
def placed(placement: ActivationPlacement | None) -> Iterator[None]:
    """Run the body (a model call being traced) with ``placement`` in force; ``None`` leaves things as they are."""
    if placement is None:
        yield
        return
    token = _PLACEMENT.set(placement)
    try:
        yield
    finally:
        _PLACEMENT.reset(token)


def current_placement() -> ActivationPlacement | None:
    return _PLACEMENT.get()


def constrain(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
    """``x`` with a sharding constraint from its logical axis names (one per dimension), or ``x`` itself when no
    placement is in force."""
    placement = _PLACEMENT.get()
    if placement is None:
        return x
    if len(logical) != x.ndim:
        raise ValueError(f"logical axes {tuple(logical)} do not match an activation of shape {tuple(x.shape)}")
    return jax.lax.with_sharding_constraint(x, NamedSharding(placement.mesh, placement.spec(logical, x.shape)))


def split_ways(logical: Sequence[str | None], shape: Sequence[int]) -> int:
    """Over how many devices a constraint by ``logical`` splits an array of ``shape`` (1 outside a placement)."""
    placement = _PLACEMENT.get()
    if placement is None:
        return 1
    ways = 1
    for axes in placement.spec(logical, shape):
        for axis in (() if axes is None else (axes,) if isinstance(axes, str) else axes):
            ways *= placement.mesh.shape[axis]
    return ways


def current_platform() -> str:
    """The platform the model is being traced for: the placement's devices', else the default device's
    (``jax.default_device(...)``: a CPU model in a GPU process must not get the GPU's kernels), else
    ``jax.default_backend()``."""
    placement = _PLACEMENT.get()
    if placement is not None:
        return placement.platform
    device = jax.config.jax_default_device
    if device is not None:
        return device if isinstance(device, str) else device.platform
    return jax.default_backend()
