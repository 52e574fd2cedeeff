"""The one assembly path every source takes: a ``Source`` (``flaxzoo.models.io.sources``: a Hugging Face directory,
a GGUF file, a flaxzoo work directory) read once, checked once against a weight table, built once.

``load_source`` reads top to bottom: the source's config and class, the caller's overrides, the tensors, the table
the source gives for that class and config (``Plan``), the one check of names and shapes (``match_tensors``), the
translation of each tensor (quantised as it is translated when asked for), and ``assemble_model``.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable, Collection

import jax
import numpy as np
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import ParamPath, WeightMap, check_coverage, expected_hf_shapes, match_tensors
from flaxzoo.models.modeling import (abstract_params, assemble_model, override_config, per_layer_shapes,
                                     resize_vocab_values, vocab_axes, vocab_shapes, warn_initialised)
from flaxzoo.models.adapters.quantize import check_quantize, quantize_value

__all__ = ["Plan", "Source", "load_source"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a source's tensors become one model's parameters.

    ``factory``: what builds the model (``factory(config, rngs=...)``). ``weights``: the table from the source's
    tensor names to the model's per-layer parameter paths (with what may be lacking, skipped or tied). ``vocab_rows``:
    the rows the source's vocabulary tables hold (``config.vocab_size`` for Hugging Face / GGUF; a flaxzoo checkpoint:
    its stored padded size). ``where``: how errors and warnings name the source."""

    factory: Callable[..., nnx.Module]
    weights: WeightMap
    vocab_rows: int
    where: str


class Source:
    """One checkpoint in one format (the subclasses in ``flaxzoo.models.io.sources``).

    ``kind``: ``"hf"``, ``"gguf"`` or ``"flaxzoo"``. ``root``: the local path it was opened at. ``default_scan_layers``:
    the layer layout built when the caller asks for none (None: the stored config's)."""

    kind: str = ""
    root: pathlib.Path
    default_scan_layers: bool | None = False

    def describe(self) -> tuple[TransformerConfig, type]:
        """``(config, class)`` of the model the source holds, read from its config alone (no weights)."""
        raise NotImplementedError

    def model_class(self, cls: type | str | None) -> type:
        """The class to build for ``cls`` (a class, its name, or None: the source's own); ValueError for a class
        that cannot hold this source."""
        raise NotImplementedError

    def read(self, progress: bool = False) -> dict[str, Any]:
        """Every tensor, ``{name: array}`` in the source's naming (anything ``np.asarray`` takes: a GGUF tensor is
        dequantised only then)."""
        raise NotImplementedError

    def plan(self, config: TransformerConfig, model_cls: type, names: Collection[str]) -> Plan:
        """The table for building ``model_cls`` in ``config`` from the tensors ``names``."""
        raise NotImplementedError

    def files(self) -> list[pathlib.Path]:
        """The files whose bytes make up the source's weights and config (sorted)."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """``sha256:<hex>`` of :meth:`files`' names and bytes (``flaxzoo.models.io.sources.fingerprint_files``)."""
        raise NotImplementedError


def load_source(source: Source, *, cls: type | str | None = None, dtype: Any = None, param_dtype: Any = None,
                scan_layers: bool | None = None, num_labels: int | None = None, pad_vocab_to: int | None = None,
                seed: int = 0, quantize: str | None = None, progress: bool = False) -> nnx.Module:
    """The model (eval mode) ``source`` holds, built as ``cls`` in the stored config with the given overrides (see
    ``from_pretrained``). The head tensors the source lacks (another class's checkpoint) are initialised at
    ``seed`` and listed in one warning. ``quantize``: each projection is quantised as soon as it is translated, so
    the float projections of the whole model are never held at once."""
    quantize = check_quantize(quantize)
    stored_config, _ = source.describe()
    model_cls = source.model_class(cls)
    config = override_config(stored_config, dtype=dtype, param_dtype=param_dtype,
                             scan_layers=source.default_scan_layers if scan_layers is None else scan_layers,
                             num_labels=num_labels, pad_vocab_to=pad_vocab_to)
    tensors = source.read(progress=progress)
    plan = source.plan(config, model_cls, tensors.keys())

    abstract = abstract_params(config, plan.factory)
    shapes = per_layer_shapes(abstract.shapes, config.num_layers)
    vocab = vocab_axes(abstract.params)
    weights = plan.weights.for_params(shapes)
    check_coverage(weights, shapes, plan.where)
    expected = expected_hf_shapes(weights, vocab_shapes(shapes, vocab, plan.vocab_rows))
    lacking = match_tensors(tensors, weights, expected, plan.where)  # the one check of names and shapes

    quantized = abstract_params(config, plan.factory, quantize) if quantize is not None else None
    values: dict[ParamPath, Any] = {}
    fresh: list[ParamPath] = []
    for e in weights.entries:
        if e.hf in lacking:
            fresh += e.paths
            continue
        tensor = tensors.pop(e.hf)
        for path, value in zip(e.paths, e.transform.to_flax(tensor if isinstance(tensor, jax.Array)
                                                            else np.asarray(tensor))):
            values.update({path: value} if quantized is None else
                          quantize_value(quantized.model, path, value, stacked=config.scan_layers))
    if lacking:
        warn_initialised(plan.where, lacking, seed)
    values = resize_vocab_values(values, vocab, config.padded_vocab_size)
    return assemble_model(config, plan.factory, values, abstract=quantized or abstract, fresh=fresh, seed=seed,
                          quantize=quantize)


def flat_values(model: nnx.Module) -> dict[ParamPath, Any]:
    """``{path: array}`` of a model's parameters (its own layout)."""
    return {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}

