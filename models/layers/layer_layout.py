"""The two layouts of a stack's block parameters, and the conversions between them.

With ``scan_layers`` the blocks' parameters live stacked: ``(..., "layers", <rest>)`` of shape ``[num_layers, ...]``.
Without it each block is its own entry: ``(..., "layers", i, <rest>)``. Checkpoint formats (Hugging Face, GGUF,
flaxzoo checkpoints) are read and written per layer and converted with :func:`stack_layer_values` /
:func:`unstack_layer_values` at the boundary.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence, Union

import jax.numpy as jnp
import numpy as np

LAYERS = "layers"
LAYER_AXIS = "layers"  # the logical name of the stacked axis (replicated: every device runs every layer)


def _layers_position(path: tuple) -> int | None:
    return path.index(LAYERS) if LAYERS in path else None


LayerCounts = Union[int, Mapping[str, int]]


def layer_count(num_layers: LayerCounts, path: Sequence[Any]) -> int:
    """The depth of the stack a parameter ``path`` lies in: ``num_layers`` itself, or for a model of several stacks
    (``TransformerConfig.layer_counts``: ``{"encoder": 6, "decoder": 4}``) the entry of the module above ``layers``."""
    if isinstance(num_layers, int):
        return num_layers
    at = _layers_position(tuple(path))
    stack = str(path[at - 1]) if at else ""
    if stack not in num_layers:
        raise ValueError(f"{'.'.join(map(str, path))}: no layer count for the stack {stack!r}; expected one of "
                         f"{sorted(num_layers)}")
    return num_layers[stack]


def is_stacked_path(path: Sequence[Any]) -> bool:
    """Whether a parameter path (its keys) names a stacked block parameter, ``(..., "layers", <name>, ...)``, rather
    than one block's, ``(..., "layers", i, ...)`` (``i`` an int or a string of digits)."""
    keys = list(path)
    at = _layers_position(tuple(keys))
    return at is not None and at + 1 < len(keys) and not str(keys[at + 1]).isdigit()


def stack_layer_values(values: dict[tuple, Any], num_layers: LayerCounts) -> dict[tuple, Any]:
    """Per-layer ``{(..., "layers", i, *rest): [...]}`` → stacked ``{(..., "layers", *rest): [num_layers, ...]}``.

    Other entries pass through. ``num_layers``: the depth, or each stack's (:func:`layer_count`). Raises
    ``ValueError`` naming the first parameter some layer lacks."""
    out: dict[tuple, Any] = {}
    groups: dict[tuple, dict[int, Any]] = {}
    for path, value in values.items():
        at = _layers_position(path)
        if at is None or at + 1 >= len(path) or not isinstance(path[at + 1], int):
            out[path] = value
            continue
        groups.setdefault(path[:at + 1] + path[at + 2:], {})[path[at + 1]] = value
    for path, per_layer in groups.items():
        depth = layer_count(num_layers, path)
        if sorted(per_layer) != list(range(depth)):
            missing = sorted(set(range(depth)) - set(per_layer))
            raise ValueError(f"{'.'.join(map(str, path))}: no value for layer(s) {missing} of {depth}")
        out[path] = np.stack([np.asarray(per_layer[i]) for i in range(depth)]) if all(
            isinstance(per_layer[i], np.ndarray) for i in range(depth)) else jnp.stack(
            [per_layer[i] for i in range(depth)])
    return out


def unstack_layer_values(values: dict[tuple, Any], num_layers: LayerCounts) -> dict[tuple, Any]:
    """Inverse of ``stack_layer_values``: entries below ``layers`` that are not per-layer already are split along
    their first axis (which must be ``num_layers`` long)."""
    out: dict[tuple, Any] = {}
    for path, value in values.items():
        at = _layers_position(path)
        if at is None or (at + 1 < len(path) and isinstance(path[at + 1], int)):
            out[path] = value
            continue
        depth = layer_count(num_layers, path)
        if value.shape[:1] != (depth,):
            raise ValueError(f"{'.'.join(map(str, path))} has shape {tuple(value.shape)}: expected a leading "
                             f"axis of num_layers={depth} (stacked layers)")
        for i in range(depth):
            out[path[:at + 1] + (i,) + path[at + 1:]] = value[i]
    return out
