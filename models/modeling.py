"""Building models: the class for a config, initialisation under jit, parameter counts without allocation, and
models assembled from given parameter values (what every checkpoint reader ends with)."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Callable, Collection, Mapping, NamedTuple, Type

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families import default_model_class
from flaxzoo.models.families.base import ParamPath, dotted, format_names
from flaxzoo.models.layers.layer_layout import LayerCounts, is_stacked_path, stack_layer_values, unstack_layer_values
from flaxzoo.models.adapters.quantize import check_quantize, quantize_model, quantize_value


class AbstractParams(NamedTuple):
    """What ``abstract_params`` returns: a model's graph, its abstract parameters, their ``{path: ShapeDtypeStruct}``
    and the abstract model itself (``jax.ShapeDtypeStruct`` leaves; quantised projections when asked for)."""

    graphdef: nnx.GraphDef
    params: nnx.State
    shapes: dict[ParamPath, jax.ShapeDtypeStruct]
    model: nnx.Module


def abstract_model(config: TransformerConfig, cls: Type[nnx.Module] | None = None) -> nnx.Module:
    """The model with ``jax.ShapeDtypeStruct`` leaves: shapes and metadata, no memory."""
    cls = cls or default_model_class(config)
    return nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))


def create_model(config: TransformerConfig, cls: Type[nnx.Module] | None = None, *, seed: int = 0) -> nnx.Module:
    """A freshly initialised model, its initialisers compiled as one program (eager init compiles each op)."""
    cls = cls or default_model_class(config)
    graphdef, _ = nnx.split(abstract_model(config, cls))
    state = jax.jit(lambda: nnx.state(cls(config, rngs=nnx.Rngs(seed))))()
    return nnx.merge(graphdef, state)


def param_count(config: TransformerConfig, cls: Type[nnx.Module] | None = None) -> int:
    """Number of trainable parameters (tied tables counted once), computed with ``eval_shape``."""
    params = nnx.state(abstract_model(config, cls), nnx.Param)
    return int(sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(params)))


# ------------------------------------------------------------------------------------- models from given values

def override_config(config: TransformerConfig, *, dtype: Any = None, param_dtype: Any = None,
                    scan_layers: bool | None = None, num_labels: int | None = None, pad_vocab_to: int | None = None
                    ) -> TransformerConfig:
    """``config`` with what a loader's caller asks for instead of what the checkpoint says (None keeps it):
    the compute ``dtype`` (``config.dtype``) and the parameter dtype ``param_dtype`` (``config.param_dtype``; None
    with a ``dtype``: the same as ``dtype``), the layer layout ``scan_layers``, the number of labels of a classifier
    head, the vocabulary padding ``pad_vocab_to`` (the loader pads or trims the tables' padding rows to match)."""
    changes: dict[str, Any] = {}
    if pad_vocab_to is not None:
        changes["pad_vocab_to"] = pad_vocab_to  # validated by the config
    for field, value in (("dtype", dtype), ("param_dtype", dtype if param_dtype is None else param_dtype)):
        if value is not None:
            try:
                changes[field] = jnp.dtype(value).name
            except TypeError:
                raise ValueError(f"{field}={value!r}: expected a dtype such as 'float32' or 'bfloat16'") from None
    if scan_layers is not None:
        if not isinstance(scan_layers, bool):
            raise ValueError(f"scan_layers={scan_layers!r}: expected True, False or None (None: the checkpoint's "
                             "layout for a flaxzoo checkpoint, per layer otherwise)")
        changes["scan_layers"] = scan_layers
    if num_labels is not None:
        changes["num_labels"] = num_labels  # validated by the config
    return config.replace(**changes) if changes else config


def vocab_axes(params: nnx.State) -> dict[ParamPath, int]:
    """``{path: axis}`` of the parameters with a vocabulary dimension (the logical axis ``"vocab"``: the token table's
    rows, an untied LM head's columns, a vocabulary bias): the dimension ``pad_vocab_to`` pads."""
    axes = {}
    for path, var in nnx.to_flat_state(params):
        names = tuple(var.get_metadata().get("out_sharding") or ())
        if "vocab" in names:
            axes[path] = names.index("vocab")
    return axes


def resize_vocab(value: Any, axis: int, rows: int) -> Any:
    """``value`` with its vocabulary ``axis`` cut to ``rows`` or padded with zeros up to ``rows`` (numpy or jax).

    Only padding rows are ever cut: callers pass ``rows >= vocab_size``, or ``vocab_size`` on export."""
    xp = np if isinstance(value, np.ndarray) else jnp
    size = value.shape[axis]
    if size == rows:
        return value
    if size > rows:
        return xp.take(value, xp.arange(rows), axis=axis)
    widths = [(0, rows - size) if a == axis else (0, 0) for a in range(value.ndim)]
    return xp.pad(value, widths)


def resize_vocab_values(values: Mapping[ParamPath, Any], axes: Mapping[ParamPath, int], rows: int
                        ) -> dict[ParamPath, Any]:
    """``values`` with every vocabulary parameter (``axes``: ``vocab_axes``) resized to ``rows``."""
    return {p: resize_vocab(v, axes[p], rows) if p in axes else v for p, v in values.items()}


def vocab_shapes(shapes: Mapping[ParamPath, tuple[int, ...]], axes: Mapping[ParamPath, int], rows: int
                 ) -> dict[ParamPath, tuple[int, ...]]:
    """``shapes`` with every vocabulary parameter's vocabulary dimension set to ``rows``."""
    return {p: tuple(rows if p in axes and a == axes[p] else d for a, d in enumerate(s)) for p, s in shapes.items()}


def abstract_params(config: TransformerConfig, factory: Callable[..., nnx.Module], quantize: str | None = None
                    ) -> AbstractParams:
    """The model's graph, its abstract parameters, their shapes and the abstract model (``eval_shape``: nothing is
    allocated). ``quantize`` (``flaxzoo.models.adapters.quantize``): the model with quantised projections, whose kernels are
    ``(..., "kernel", "array", "qvalue")`` int8 and ``(..., "kernel", "array", "scale")`` float leaves."""
    if check_quantize(quantize) is None:
        abstract = abstract_model(config, factory)
    else:
        abstract = nnx.eval_shape(lambda: quantize_model(factory(config, rngs=nnx.Rngs(0)), quantize))
    graphdef, params, _ = nnx.split(abstract, nnx.Param, ...)
    shapes = {path: var.get_value() for path, var in nnx.to_flat_state(params)}
    return AbstractParams(graphdef, params, shapes, abstract)


def per_layer_shapes(shapes: Mapping[ParamPath, Any], num_layers: LayerCounts) -> dict[ParamPath, tuple[int, ...]]:
    """Parameter shapes (anything with ``.shape``) in the per-layer layout: a stacked ``(..., "layers", *rest)``
    of shape ``[num_layers, ...]`` becomes ``num_layers`` entries ``(..., "layers", i, *rest)``. Allocates nothing."""
    views = {p: np.broadcast_to(np.zeros((), np.int8), tuple(s.shape)) for p, s in shapes.items()}
    return {p: tuple(v.shape) for p, v in unstack_layer_values(views, num_layers).items()}


def to_layer_layout(values: Mapping[ParamPath, Any], paths: Collection[ParamPath], num_layers: LayerCounts
                    ) -> dict[ParamPath, Any]:
    """``values`` (per-layer or stacked) in the layout of the parameter ``paths`` of a model: stacked when some path
    is ``(..., "layers", <name>, ...)``, per layer otherwise."""
    values = unstack_layer_values(dict(values), num_layers)
    return stack_layer_values(values, num_layers) if any(is_stacked_path(p) for p in paths) else values


def _stacklevel_outside_models() -> int:
    """The ``warnings.warn`` stacklevel of the first caller outside the ``models`` package (the user's line)."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def warn_initialised(what: str, names: Collection[str], seed: int) -> None:
    """The one warning for parameters a checkpoint lacks and the model initialised (``names``, sorted)."""
    warnings.warn(f"{what}: the checkpoint lacks {len(names)} tensor(s), initialised with the model's initialisers "
                  f"(seed={seed}): {format_names(names, limit=50)}; train them before use",
                  stacklevel=_stacklevel_outside_models())


def check_values(values: Mapping[ParamPath, Any], shapes: Mapping[ParamPath, Any], fresh: Collection[ParamPath]
                 ) -> None:
    """ValueError unless ``values`` (in the model's layout) give every parameter of ``shapes`` but ``fresh`` its
    shape."""
    missing = sorted(dotted(p) for p in set(shapes) - set(values) - set(fresh))
    if missing:
        raise ValueError(f"no value for the parameters {format_names(missing)}")
    for path, value in values.items():
        if path in shapes and tuple(value.shape) != tuple(shapes[path].shape):
            raise ValueError(f"parameter {dotted(path)}: expected shape {tuple(shapes[path].shape)}, got "
                             f"{tuple(value.shape)}")


def assemble_model(config: TransformerConfig, factory: Callable[..., nnx.Module], values: Mapping[ParamPath, Any],
                   *, abstract: AbstractParams | None = None, fresh: Collection[ParamPath] = (),
                   seed: int = 0, quantize: str | None = None) -> nnx.Module:
    """A model (in eval mode) whose parameters are ``values`` (flaxzoo path → array), built without random init.

    ``values`` may hold the blocks per layer or stacked (``config.scan_layers``' layout): they are converted to the
    layout of ``factory(config)``'s parameters. Every parameter must be in ``values`` with its shape, except those in
    ``fresh`` (paths in the model's layout), which get the model's own initialisers at ``seed`` (the values
    ``create_model(config, factory, seed=seed)`` would hold). Values are cast to the dtype the model builds each
    parameter in (``config.param_dtype``; a quantised kernel's int8 values and float scales: qwix's).

    ``quantize`` (``flaxzoo.models.adapters.quantize``; e.g. ``"int8"``): the attention / MLP projections hold quantised
    kernels. A projection's kernel may be given as its float value (quantised here) or already as its quantised
    leaves (``flaxzoo.models.adapters.quantize.quantize_value``: what a loader quantising tensor by tensor passes).
    ``abstract``: ``abstract_params(config, factory, quantize)`` when the caller already has it (tracing a 30-layer
    model's construction takes about a second).
    """
    quantize = check_quantize(quantize)
    graphdef, params, shapes, model = abstract or abstract_params(config, factory, quantize)
    values = unstack_layer_values(dict(values), config.layer_counts)
    if quantize is not None:
        values = {k: v for path, value in values.items()
                  for k, v in quantize_value(model, path, value, stacked=config.scan_layers).items()}
    values = to_layer_layout(values, shapes, config.layer_counts)
    fresh = set(fresh)
    check_values(values, shapes, fresh)

    def initial() -> tuple[nnx.State, dict[str, jax.Array]]:
        # Under jit the random initialisation of every parameter not asked for is compiled away.
        _, new_params, rest = nnx.split(factory(config, rngs=nnx.Rngs(seed)), nnx.Param, ...)
        return rest, {dotted(p): v.get_value() for p, v in nnx.to_flat_state(new_params) if p in fresh}

    rest, initialised = jax.jit(initial)()
    flat = []
    for path, var in nnx.to_flat_state(params):
        value = initialised[dotted(path)] if path in fresh else values.pop(path)  # each released once placed
        flat.append((path, var.replace(jnp.asarray(value, dtype=var.get_value().dtype))))
    model = nnx.merge(graphdef, nnx.from_flat_state(flat), rest)
    model.eval()
    return model
