"""What sharded loading (``flaxzoo.models.io.sharded``) decides before reading anything: the config and class built
(the same as ``flaxzoo.models.io.loading.load_source``'s for the same overrides), the weight table checked once
against the source's names and shapes, the parameters the source lacks, where each model parameter's values come
from (stacked parameters: one table entry per layer), the caller's shardings checked against the parameters, and the
initialisation of the lacking ones, born sharded.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import (Entry, ParamPath, WeightMap, check_coverage, dotted, expected_hf_shapes,
                                          format_names, match_tensors)
from flaxzoo.models.io.loading import Plan, Source
from flaxzoo.models.layers.stack import is_stacked_path, unstack_layer_values
from flaxzoo.models.modeling import (AbstractParams, abstract_params, override_config, per_layer_shapes, vocab_axes,
                                     vocab_shapes, warn_initialised)

__all__ = ["Overrides", "Prepared", "check_shardings", "flat_tree", "fresh_arrays", "layer_groups", "prepare"]


@dataclasses.dataclass(frozen=True)
class Overrides:
    """What the caller asks for instead of what the checkpoint says (``from_pretrained``'s arguments of the same
    names; None keeps the checkpoint's)."""

    dtype: Any = None
    param_dtype: Any = None
    scan_layers: bool | None = None
    num_labels: int | None = None
    pad_vocab_to: int | None = None


@dataclasses.dataclass
class Prepared:
    """Everything decided before a value is read.

    ``abstract``: the model's abstract parameters (model layout: stacked ``[num_layers, ...]`` with
    ``config.scan_layers``). ``tensors``: the source's tensors by name (objects with ``.shape``; what the table did
    not drop). ``entries``: ``{per-layer parameter path: (table entry, which output of its transform)}``.
    ``stored_shapes``: each per-layer parameter's shape as the source holds it (vocabulary rows: ``plan.vocab_rows``).
    ``vocab``: ``{model path: vocabulary axis}``. ``lacking``: the per-layer paths the source has no tensor for."""

    config: TransformerConfig
    model_cls: type
    plan: Plan
    abstract: AbstractParams
    weights: WeightMap
    tensors: dict[str, Any]
    entries: dict[ParamPath, tuple[Entry, int]]
    stored_shapes: dict[ParamPath, tuple[int, ...]]
    vocab: dict[ParamPath, int]
    lacking: set[ParamPath]


def prepare(source: Source, cls: type | str | None, overrides: Overrides, seed: int,
            tensors: Callable[[], dict[str, Any]] | None = None, announce: bool = True) -> Prepared:
    """The config, class, checked table and lacking parameters for loading ``source`` as ``cls`` with
    ``overrides`` (the steps of ``load_source``, in its order, with its one check of names and shapes and its one
    warning for initialised heads). ``tensors``: the source's ``{name: object with .shape}`` (default: its
    ``read()``, which for a Hugging Face / GGUF source is lazy only in the GGUF case). ``announce``: give the warning
    (False: only the shapes are wanted)."""
    stored_config, _ = source.describe()
    model_cls = source.model_class(cls)
    scan = source.default_scan_layers if overrides.scan_layers is None else overrides.scan_layers
    config = override_config(stored_config, dtype=overrides.dtype, param_dtype=overrides.param_dtype,
                             scan_layers=scan, num_labels=overrides.num_labels, pad_vocab_to=overrides.pad_vocab_to)
    found = tensors() if tensors is not None else source.read()
    plan = source.plan(config, model_cls, found.keys())
    abstract = abstract_params(config, plan.factory)
    shapes = per_layer_shapes(abstract.shapes, config.num_layers)
    vocab = vocab_axes(abstract.params)
    weights = plan.weights.for_params(shapes)
    check_coverage(weights, shapes, plan.where)
    stored_shapes = vocab_shapes(shapes, vocab, plan.vocab_rows)
    expected = expected_hf_shapes(weights, stored_shapes)
    lacking_names = match_tensors(found, weights, expected, plan.where)  # the one check of names and shapes
    if lacking_names and announce:
        warn_initialised(plan.where, lacking_names, seed)
    entries = {p: (e, j) for e in weights.entries for j, p in enumerate(e.paths)}
    lacking = {p for e in weights.entries if e.hf in lacking_names for p in e.paths}
    return Prepared(config, model_cls, plan, abstract, weights, found, entries, stored_shapes, vocab, lacking)


def layer_groups(paths: Mapping[ParamPath, Any], num_layers: int) -> dict[ParamPath, list[ParamPath] | None]:
    """``{model path: its per-layer paths, layer by layer}`` for stacked parameters, ``{model path: None}`` for the
    others (their per-layer path is the model path)."""
    groups: dict[ParamPath, list[ParamPath] | None] = {}
    for path in paths:
        if not is_stacked_path(path):
            groups[path] = None
            continue
        layers = unstack_layer_values({path: np.arange(num_layers)}, num_layers)  # {per-layer path: its layer}
        groups[path] = sorted(layers, key=lambda p: int(layers[p]))
    return groups


def flat_tree(tree: Any) -> dict[ParamPath, Any]:
    """``{path: leaf}`` of a tree (nested dicts, an ``nnx.State``, or already flat ``{path tuple: leaf}``); layer
    numbers as ints, a ``Variable`` leaf as its value."""
    if isinstance(tree, Mapping) and tree and all(isinstance(k, tuple) for k in tree):
        return dict(tree)
    if isinstance(tree, nnx.State):
        tree = nnx.to_pure_dict(tree)
    is_leaf = lambda x: isinstance(x, (jax.sharding.Sharding, nnx.Variable))  # noqa: E731
    flat = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]:
        keys = tuple(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))) for k in path)
        keys = tuple(int(k) if isinstance(k, str) and k.isdigit() else k for k in keys)
        flat[keys] = leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf
    return flat


def check_shardings(shardings: Any, abstract: AbstractParams) -> dict[ParamPath, NamedSharding]:
    """``{model path: NamedSharding}`` from ``shardings`` (a tree shaped like ``nnx.to_pure_dict`` of the parameters,
    an ``nnx.State`` of them, a flat ``{path: sharding}``, or a callable taking the abstract parameters'
    ``nnx.State`` and returning one of those); ValueError naming what is missing, extra or not a NamedSharding."""
    if callable(shardings) and not isinstance(shardings, (Mapping, nnx.State)):
        shardings = shardings(abstract.params)
    flat = flat_tree(shardings)
    missing, extra = set(abstract.shapes) - set(flat), set(flat) - set(abstract.shapes)
    if missing or extra:
        raise ValueError(f"shardings do not match the model's parameters: no sharding for "
                         f"{format_names([dotted(p) for p in missing]) or 'none'}; shardings for parameters the model "
                         f"lacks: {format_names([dotted(p) for p in extra]) or 'none'}")
    for path, sharding in flat.items():
        if not isinstance(sharding, NamedSharding):
            raise ValueError(f"shardings[{dotted(path)!r}] is {type(sharding).__name__}: expected a "
                             "jax.sharding.NamedSharding")
        shape = tuple(abstract.shapes[path].shape)
        try:
            sharding.shard_shape(shape)
        except ValueError:
            raise ValueError(f"shardings[{dotted(path)!r}] = {sharding.spec} does not divide the parameter's shape "
                             f"{shape} on the mesh {dict(sharding.mesh.shape)}: expected mesh axes whose sizes divide "
                             "the dimensions they split") from None
    return flat


def fresh_arrays(prepared: Prepared, paths: list[ParamPath], shardings: Mapping[ParamPath, NamedSharding], seed: int
                 ) -> dict[ParamPath, jax.Array]:
    """The model's own initial values (``seed``) of ``paths``, computed under ``jax.jit`` with ``out_shardings``:
    born sharded, the values ``load_source`` gives them (``assemble_model(fresh=...)``)."""
    if not paths:
        return {}
    config, factory, wanted = prepared.config, prepared.plan.factory, set(paths)

    def initial() -> dict[str, jax.Array]:
        _, params, _ = nnx.split(factory(config, rngs=nnx.Rngs(seed)), nnx.Param, ...)
        return {dotted(p): v.get_value() for p, v in nnx.to_flat_state(params) if p in wanted}

    out = jax.jit(initial, out_shardings={dotted(p): shardings[p] for p in paths})()
    return {p: out[dotted(p)] for p in paths}
