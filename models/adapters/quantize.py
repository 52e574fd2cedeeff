"""Weight-only int8 inference through qwix: the attention and MLP projections hold int8 weights.

``quantize_model(model, "int8")`` replaces every attention query / key / value / out and MLP gate / up / down
``Dense`` (``models/layers/linear.py``) by qwix's post-training-quantised version of it: the kernel becomes a
``qwix WithAux`` holding a ``QArray`` of ``qvalue`` (int8, the kernel's shape ``in_shape + out_shape``) and ``scale``
(float, ``[1, ..., 1, *out_shape]``: one symmetric absmax scale per output channel), and the module's class is swapped
for one whose ``__call__`` qwix intercepts, so its ``jax.lax.dot_general`` takes the quantised kernel. Everything
else stays in the model's float dtype: token / position embeddings, norms, biases, BERT's pooler and heads, and the
LM head (a tied LM head reads the float embedding table; an untied one keeps its float kernel).

Why per module: the layer stack runs every block as a pure function (``nnx.split`` / ``nnx.merge``, under
``jax.checkpoint`` or ``lax.scan``), so qwix applied to the whole model would quantise a throw-away copy on every
call and keep the float weights. Applied to each ``Dense`` eagerly, the int8 arrays are the model's own parameters;
the swapped class travels in the graph definition, so ``nnx.split`` / ``merge``, ``jit``, ``lax.scan`` over stacked
layers and every method (``__call__``, ``decode``) see the quantised projections.

Stacked layers (``config.scan_layers``): each layer's slice is quantised as its own ``Dense`` and the slices are
stacked again (``qvalue [num_layers, ...]``, ``scale [num_layers, 1, ..., *out]``, logical axis ``"layers"`` first).

Loading (``from_pretrained(..., quantize="int8")``) never holds the float projections of the whole model: the loader
quantises each projection as it is read (``quantize_value``, against the abstract quantised model
``flaxzoo.models.modeling.abstract_params(..., quantize=)``), and ``flaxzoo.models.modeling.assemble_model(...,
quantize=)`` builds the model from those int8 leaves and the float rest, as it builds a float model.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxzoo.models.families import FAMILIES, family_of_model
from flaxzoo.models.families.base import INT8_TARGETS
from flaxzoo.models.layers.linear import Dense
from flaxzoo.models.layers.layer_layout import LAYER_AXIS
from flaxzoo.models.layers.stack import stack_modules

__all__ = ["QUANTIZE_TYPES", "check_quantize", "quantize_model", "quantize_dense", "is_quantized",
           "module_at", "param_bytes", "projection_paths", "projections_of", "quantize_value"]

# The accepted ``quantize`` values and the qwix weight type each means.
QUANTIZE_TYPES = ("int8",)
_QTYPES = {"int8": jnp.int8}

# Where a quantised kernel's arrays sit below the Dense's ``kernel``.
QVALUE, SCALE = ("array", "qvalue"), ("array", "scale")


def check_quantize(quantize: Any) -> str | None:
    """``quantize`` as given when it is None or one of ``QUANTIZE_TYPES``; ValueError naming it otherwise."""
    if quantize is None or (isinstance(quantize, str) and quantize in QUANTIZE_TYPES):
        return quantize
    raise ValueError(f"quantize={quantize!r}: expected one of {list(QUANTIZE_TYPES)} (weight-only, per output "
                     "channel) or None (float weights)")


def _required(quantize: Any) -> str:
    """``quantize`` checked, None refused (a function that quantises needs a type)."""
    if check_quantize(quantize) is None:
        raise ValueError(f"quantize=None: expected one of {list(QUANTIZE_TYPES)}")
    return quantize


def _qwix():
    try:
        import qwix
    except ImportError as exc:  # only quantised models need it
        raise ImportError("quantize='int8' needs the qwix package: pip install qwix") from exc
    return qwix


def _provider(quantize: str):
    qwix = _qwix()
    rule = qwix.QuantizationRule(module_path=".*", weight_qtype=_QTYPES[quantize])
    return qwix.PtqProvider([rule])


def projections_of(model: Any) -> Mapping[str, tuple[str, ...]]:
    """The projections ``quantize_model`` quantises in ``model`` (a model or its class): its family's ``projections``
    ((parent attribute, child attributes) in a block; the family by the model's config:
    :func:`~flaxzoo.models.families.family_of_model`); the default for a class no family has."""
    cls = model if isinstance(model, type) else type(model)
    if not any(cls in family.classes for family in FAMILIES.values()):
        return INT8_TARGETS
    return family_of_model(model).projections


def is_projection_path(path: tuple, projections: Mapping[str, tuple[str, ...]] = INT8_TARGETS) -> bool:
    """Whether a module path (``(..., "attention", "query")``, layer index or not) names a quantised projection
    (``projections``: ``projections_of(model)``)."""
    return len(path) >= 2 and str(path[-2]) in projections and str(path[-1]) in projections[str(path[-2])]


def projection_paths(model: nnx.Module) -> list[tuple]:
    """The module paths of the model's projections (the ``Dense`` modules ``quantize_model`` quantises)."""
    projections = projections_of(model)
    return [tuple(path) for path, module in nnx.iter_modules(model)
            if isinstance(module, Dense) and is_projection_path(tuple(path), projections)]


def is_quantized(dense: nnx.Module) -> bool:
    """Whether a ``Dense`` holds a qwix-quantised kernel."""
    return isinstance(dense, Dense) and not isinstance(dense.kernel, nnx.Variable)


def _quantize_one(dense: Dense, quantize: str) -> Dense:
    """qwix PTQ of one per-layer ``Dense`` (run once on a zero input; the kernel's values decide the scales)."""
    qwix = _qwix()
    dummy = jnp.zeros((1, *dense.in_shape), dense.dtype)
    return qwix.quantize_model(dense, _provider(quantize), dummy)


def _layer_slice(dense: Dense, i: int) -> Dense:
    """Layer ``i`` of a stacked ``Dense`` as a per-layer one (its ``"layers"`` axis name dropped)."""
    graphdef, state = nnx.split(dense)

    def take(v: nnx.Variable) -> nnx.Variable:
        out = v.replace(v.get_value()[i])
        axes = v.get_metadata().get("out_sharding")
        if axes is not None and axes and axes[0] == LAYER_AXIS:
            out.set_metadata(out_sharding=tuple(axes[1:]))
        return out

    return nnx.merge(graphdef, jax.tree.map(take, state, is_leaf=lambda x: isinstance(x, nnx.Variable)))


def quantize_dense(dense: Dense, quantize: str = "int8") -> Dense:
    """The qwix-quantised counterpart of ``dense`` (a new module; ``dense`` is left as it is).

    A stacked ``Dense`` (kernel ``[num_layers, *in_shape, *out_shape]``) is quantised layer by layer and stacked."""
    quantize = _required(quantize)
    if is_quantized(dense):
        raise ValueError(f"this Dense is already quantised ({type(dense.kernel).__name__} kernel)")
    kernel = dense.kernel.get_value()
    per_layer_ndim = len(dense.in_shape) + len(dense.out_shape)
    if kernel.ndim == per_layer_ndim:
        return _quantize_one(dense, quantize)
    if kernel.ndim != per_layer_ndim + 1:
        raise ValueError(f"Dense kernel of shape {tuple(kernel.shape)}: expected {dense.in_shape + dense.out_shape} "
                         "or a stacked [num_layers, ...] version of it")
    return stack_modules([_quantize_one(_layer_slice(dense, i), quantize) for i in range(kernel.shape[0])])


def module_at(model: nnx.Module, path: tuple) -> Any:
    """The submodule of ``model`` at a module path (attribute names and ``nnx.List`` indices)."""
    node = model
    for key in path:
        node = node[key] if isinstance(node, nnx.List) else getattr(node, str(key))
    return node


def quantize_model(model: nnx.Module, quantize: str = "int8") -> nnx.Module:
    """Quantise ``model``'s attention and MLP projections in place (their float kernels are dropped); returns it.

    ``quantize``: one of ``QUANTIZE_TYPES`` (``"int8"``: weight-only int8 with one absmax scale per output channel).
    Embeddings, norms, biases, heads and the LM head stay float (see the module docstring). Raises ValueError for
    another ``quantize``, a model with no projections, or one already quantised.
    """
    quantize = _required(quantize)
    paths = projection_paths(model)
    if not paths:
        raise ValueError(f"{type(model).__name__} has no attention / MLP projections to quantise")
    for path in paths:
        parent = module_at(model, path[:-1])
        setattr(parent, str(path[-1]), quantize_dense(getattr(parent, str(path[-1])), quantize))
    return model


def param_bytes(model: nnx.Module) -> dict[str, int]:
    """Bytes of the model's parameters: ``{"projections": ..., "other": ..., "total": ...}`` (int8 arrays count one
    byte an entry; a quantised kernel's scales count with the projections)."""
    projections = other = 0
    targets = projections_of(model)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        size = int(np.prod(var.get_value().shape)) * jnp.dtype(var.get_value().dtype).itemsize
        module_path = tuple(path[:path.index("kernel")] if "kernel" in path else path[:-1])
        if is_projection_path(module_path, targets):
            projections += size
        else:
            other += size
    return {"projections": projections, "other": other, "total": projections + other}


# ------------------------------------------------------------------------------------------------------------ loading
def quantize_value(abstract: nnx.Module, path: tuple, value: Any, *, stacked: bool) -> dict[tuple, Any]:
    """The leaves a quantised model holds for one parameter value (per-layer flaxzoo ``path``): ``{path: value}``
    for anything but a projection kernel; for a projection kernel ``[*in_shape, *out_shape]`` (float)
    ``{path + ("array", "qvalue"): int8 [*in_shape, *out_shape], path + ("array", "scale"): float [1, ..., 1,
    *out_shape]}`` (numpy), quantised as the projection of ``abstract`` (the abstract quantised model: its qwix
    ``HowToQuantize``, per output channel, absmax) says. ``stacked``: ``abstract``'s blocks are stacked
    (``config.scan_layers``), so the layer index of ``path`` is dropped to find the projection."""
    if not (path and path[-1] == "kernel" and is_projection_path(tuple(path[:-1]), projections_of(abstract))):
        return {path: value}
    module_path = tuple(path[:-1])
    if stacked and LAYER_AXIS in module_path:
        at = module_path.index(LAYER_AXIS)
        module_path = module_path[:at + 1] + module_path[at + 2:]
    kernel = module_at(abstract, module_path).kernel
    qarray = _quantize_array(jnp.asarray(value, kernel.array.scale.get_value().dtype), kernel.how)
    return {path + QVALUE: np.asarray(qarray.qvalue), path + SCALE: np.asarray(qarray.scale)}


def _quantize_array(value: jax.Array, how: Any) -> Any:
    """qwix's quantisation of one kernel as ``how`` says (the public ``qwix.quantize``)."""
    return _qwix().quantize(value, how.qtype, channelwise_axes=how.channelwise_axes, tiled_axes=how.tiled_axes,
                            calibration_method=how.calibration_method)
