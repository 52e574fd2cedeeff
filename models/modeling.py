"""Building models: the class for a config, initialisation under jit, parameter counts without allocation, and
models assembled from given parameter values (what every checkpoint reader ends with)."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Callable, Collection, Mapping, Type, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxzoo.models.bert import BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification, BertModel
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.gpt import GPTForCausalLM, GPTModel
from flaxzoo.models.layers.stack import is_stacked_path, stack_layer_values, unstack_layer_values

MODEL_CLASSES = {cls.__name__: cls for cls in (BertModel, BertForMaskedLM, BertForSequenceClassification,
                                               BertForTokenClassification, GPTModel, GPTForCausalLM)}
DECODER_CLASSES = (GPTModel, GPTForCausalLM)  # causal configs; the other classes are encoders

ParamPath = tuple[Union[str, int], ...]
# A model's graph, its abstract parameters and their shapes: what ``abstract_params`` returns.
AbstractParams = tuple[nnx.GraphDef, nnx.State, dict[ParamPath, jax.ShapeDtypeStruct]]


def default_model_class(config: TransformerConfig) -> Type[nnx.Module]:
    """The language-model class of a config: ``BertForMaskedLM`` for encoders, ``GPTForCausalLM`` for decoders."""
    return GPTForCausalLM if config.causal else BertForMaskedLM


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

def bert_without_pooler(config: TransformerConfig, rngs: nnx.Rngs) -> BertModel:
    """A ``BertModel`` factory without the pooler (checkpoints such as all-MiniLM-L6-v2 have none)."""
    return BertModel(config, rngs=rngs, add_pooler=False)


def plain_factory(model: nnx.Module) -> Callable[..., nnx.Module]:
    """The factory that builds another ``model`` of the same structure: its class (a BERT without a pooler: that)."""
    return bert_without_pooler if isinstance(model, BertModel) and model.pooler is None else type(model)


def format_names(names: Collection[str], limit: int = 20) -> str:
    """``names`` sorted and comma-separated, the first ``limit`` of them (then how many more)."""
    names = sorted(names)
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def dotted(path: ParamPath) -> str:
    """``("decoder", "layers", 0, "mlp")`` → ``"decoder.layers.0.mlp"``."""
    return ".".join(map(str, path))


def override_config(config: TransformerConfig, *, dtype: Any = None, scan_layers: bool | None = None,
                    num_labels: int | None = None, pad_vocab_to: int | None = None) -> TransformerConfig:
    """``config`` with what a loader's caller asks for instead of what the checkpoint says (None keeps it):
    parameter and compute ``dtype``, the layer layout ``scan_layers``, the number of labels of a classifier head,
    the vocabulary padding ``pad_vocab_to`` (the loader pads or trims the tables' padding rows to match)."""
    changes: dict[str, Any] = {}
    if pad_vocab_to is not None:
        changes["pad_vocab_to"] = pad_vocab_to  # validated by the config
    if dtype is not None:
        changes["dtype"] = changes["param_dtype"] = jnp.dtype(dtype).name
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


def abstract_params(config: TransformerConfig, factory: Callable[..., nnx.Module]) -> AbstractParams:
    """The model's graph, its abstract parameters and their shapes (``eval_shape``: nothing is allocated)."""
    abstract = abstract_model(config, factory)
    graphdef, params, _ = nnx.split(abstract, nnx.Param, ...)
    shapes = {path: var.get_value() for path, var in nnx.to_flat_state(params)}
    return graphdef, params, shapes


def per_layer_shapes(shapes: Mapping[ParamPath, Any], num_layers: int) -> dict[ParamPath, tuple[int, ...]]:
    """Parameter shapes (anything with ``.shape``) in the per-layer layout: a stacked ``(..., "layers", *rest)``
    of shape ``[num_layers, ...]`` becomes ``num_layers`` entries ``(..., "layers", i, *rest)``. Allocates nothing."""
    views = {p: np.broadcast_to(np.zeros((), np.int8), tuple(s.shape)) for p, s in shapes.items()}
    return {p: tuple(v.shape) for p, v in unstack_layer_values(views, num_layers).items()}


def to_layer_layout(values: Mapping[ParamPath, Any], paths: Collection[ParamPath], num_layers: int
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
                   seed: int = 0) -> nnx.Module:
    """A model (in eval mode) whose parameters are ``values`` (flaxzoo path → array), built without random init.

    ``values`` may hold the blocks per layer or stacked (``config.scan_layers``' layout): they are converted to the
    layout of ``factory(config)``'s parameters. Every parameter must be in ``values`` with its shape, except those in
    ``fresh`` (paths in the model's layout), which get the model's own initialisers at ``seed`` (the values
    ``create_model(config, factory, seed=seed)`` would hold). Values are cast to ``config.param_dtype``.
    ``abstract``: ``abstract_params(config, factory)`` when the caller already has it (tracing a 30-layer model's
    construction takes about a second).
    """
    graphdef, params, shapes = abstract or abstract_params(config, factory)
    values = to_layer_layout(values, shapes, config.num_layers)
    fresh = set(fresh)
    check_values(values, shapes, fresh)

    def initial() -> tuple[nnx.State, dict[str, jax.Array]]:
        # Under jit the random initialisation of every parameter not asked for is compiled away.
        _, new_params, rest = nnx.split(factory(config, rngs=nnx.Rngs(seed)), nnx.Param, ...)
        return rest, {dotted(p): v.get_value() for p, v in nnx.to_flat_state(new_params) if p in fresh}

    rest, initialised = jax.jit(initial)()
    param_dtype = jnp.dtype(config.param_dtype)
    flat = [(path, var.replace(jnp.asarray(initialised[dotted(path)] if path in fresh else values[path],
                                           dtype=param_dtype)))
            for path, var in nnx.to_flat_state(params)]
    model = nnx.merge(graphdef, nnx.from_flat_state(flat), rest)
    model.eval()
    return model

