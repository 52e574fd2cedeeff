"""The table machinery every family uses: transforms between the two tensor layouts, table entries, weight maps, the
family record, and the checks that match a checkpoint's tensors against a table.

A family's table lists, per Hugging Face tensor, the flaxzoo parameter path(s) it fills and a ``Transform`` whose two
directions are written once as a pair of einops patterns: loading (``to_flax``) and saving (``to_hf``) walk the same
table, so the two directions cannot drift apart. Tables are always per layer (``layers.3.mlp.up.kernel``); a model
whose blocks are stacked is converted at the boundary (``flaxzoo.models.modeling.assemble_model`` on load,
``unstack_layer_values`` on save).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Collection, Mapping, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from einops import rearrange
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.gpt import GPTForCausalLM
from flaxzoo.models.modeling import dotted, format_names

ParamPath = tuple[Union[str, int], ...]
Array = Any  # np.ndarray, or a jax array / tracer while shapes are being worked out


@dataclasses.dataclass(frozen=True)
class Transform:
    """Both directions of a layout change. ``to_flax`` returns a tuple (one array per flaxzoo path)."""

    to_flax: Callable[[Array], tuple[Array, ...]]
    to_hf: Callable[..., Array]


def layout(hf: str, flax: str, **sizes: int) -> Transform:
    """A transform given by two einops patterns, the Hugging Face side and the flaxzoo side.

    A flaxzoo pattern that starts with the axis ``parts`` splits one Hugging Face tensor into several flaxzoo
    parameters (GPT-2's fused ``c_attn``: ``layout("d (parts h k)", "parts d h k", parts=3, h=heads)``).
    """
    fused = flax.split()[0] == "parts"

    def to_flax(w: Array) -> tuple[Array, ...]:
        out = rearrange(w, f"{hf} -> {flax}", **sizes)
        return tuple(out[i] for i in range(out.shape[0])) if fused else (out,)

    def to_hf(*ws: Array) -> Array:
        return rearrange(list(ws) if fused else ws[0], f"{flax} -> {hf}", **sizes)

    return Transform(to_flax, to_hf)


IDENTITY = layout("...", "...")
LINEAR = layout("out inp", "inp out")  # torch nn.Linear weight [out, in] <-> Dense kernel [in, out]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One Hugging Face tensor ``hf`` and the flaxzoo parameter ``paths`` it fills through ``transform``."""

    hf: str
    paths: tuple[ParamPath, ...]
    transform: Transform = IDENTITY


def param_path(name: str) -> ParamPath:
    """``"decoder.layers.3.mlp.up.kernel"`` → ``("decoder", "layers", 3, "mlp", "up", "kernel")``."""
    return tuple(int(part) if part.isdigit() else part for part in name.split("."))


def entry(hf: str, paths: str | Sequence[str], transform: Transform = IDENTITY) -> Entry:
    """An ``Entry`` from dotted names: one flaxzoo path, or several for a fused tensor."""
    paths = [paths] if isinstance(paths, str) else paths
    return Entry(hf, tuple(param_path(p) for p in paths), transform)


def linear(hf: str, flax: str, bias: bool, transform: Transform = LINEAR,
           bias_transform: Transform = IDENTITY) -> list[Entry]:
    """``{hf}.weight`` → ``{flax}.kernel`` and, with ``bias``, ``{hf}.bias`` → ``{flax}.bias``."""
    entries = [entry(f"{hf}.weight", f"{flax}.kernel", transform)]
    if bias:
        entries.append(entry(f"{hf}.bias", f"{flax}.bias", bias_transform))
    return entries


def norm(hf: str, flax: str, bias: bool = True) -> list[Entry]:
    """A Hugging Face LayerNorm / RMSNorm (``weight``, ``bias``) → flaxzoo norm (``scale``, ``bias``)."""
    entries = [entry(f"{hf}.weight", f"{flax}.scale")]
    if bias:
        entries.append(entry(f"{hf}.bias", f"{flax}.bias"))
    return entries


def causal_lm_head(config: TransformerConfig, cls: type, embedding: str) -> tuple[list[Entry], dict[str, str]]:
    """``GPTForCausalLM``'s head: tied to the Hugging Face tensor ``embedding``, or its own ``lm_head.weight``.

    Returns (entries to add, tied names ``{hf duplicate: hf source}``)."""
    if cls is not GPTForCausalLM:
        return [], {}
    if config.tie_word_embeddings:
        return [], {"lm_head.weight": embedding}
    return [entry("lm_head.weight", "lm_head.kernel", LINEAR)], {}


def outside(entries: Sequence[Entry], stack: str) -> frozenset[str]:
    """The Hugging Face names of ``entries`` whose parameters all lie outside the flaxzoo module ``stack`` (the
    pooler and the heads): what a checkpoint of another class may lack (``WeightMap.optional``)."""
    prefix = param_path(stack)
    return frozenset(e.hf for e in entries if all(p[:len(prefix)] != prefix for p in e.paths))


@dataclasses.dataclass
class WeightMap:
    """Everything needed to move one model's weights between the two naming schemes.

    ``entries``: the parameters. ``tied``: Hugging Face names that duplicate another tensor in a tied model (e.g.
    ``lm_head.weight`` = ``transformer.wte.weight``); not written on save, accepted on load only if equal.
    ``unused``: names Hugging Face's class holds but never reads; written on save as copies of the named tensor,
    skipped on load. ``ignored``: regular expressions of non-parameter buffers (and of other classes' heads) skipped
    on load. ``optional``: names of head tensors (pooler, classifier, LM head) a checkpoint may lack: the model
    initialises them (and says so), and a model without the module (a ``BertModel`` without pooler) skips them.
    """

    entries: list[Entry]
    tied: dict[str, str] = dataclasses.field(default_factory=dict)
    unused: dict[str, str] = dataclasses.field(default_factory=dict)
    ignored: tuple[str, ...] = ()
    optional: frozenset[str] = frozenset()

    def for_params(self, params: Collection[ParamPath]) -> "WeightMap":
        """The map without the optional entries none of whose parameters the model has (a module it was built
        without)."""
        params = set(params)
        kept = [e for e in self.entries if e.hf not in self.optional or any(p in params for p in e.paths)]
        return dataclasses.replace(self, entries=kept)


@dataclasses.dataclass(frozen=True)
class Family:
    """One Hugging Face ``model_type``: its architectures, config translation and weight map.

    ``weights(config, flaxzoo class, HF base prefix)`` builds the table. ``layout``: the ``TransformerConfig`` fields
    the family fixes; ``save_problems(config)`` names anything else Hugging Face's class cannot express (checked with
    ``layout`` before saving). ``factory(cls, tensor names, base)``: what builds the model for a checkpoint holding
    those tensors (a ``BertModel`` without pooler ...); ``rename``: old tensor names → current ones, on load.
    """

    model_type: str
    base_prefix: str  # the attribute holding the base model in HF's head classes ("bert", "transformer", "model")
    architectures: dict[str, type]  # HF class name -> flaxzoo class
    config_from_hf: Callable[[Mapping[str, Any]], TransformerConfig]
    config_to_hf: Callable[[TransformerConfig], dict[str, Any]]
    weights: Callable[[TransformerConfig, type, str], WeightMap]
    layout: dict[str, Any]
    base_class: type
    save_problems: Callable[[TransformerConfig], list[str]] = lambda config: []
    factory: Callable[[type, Collection[str], str], Callable[..., nnx.Module]] = lambda cls, names, base: cls
    rename: Callable[[str], str] | None = None

    def hf_architecture(self, cls: type) -> str:
        """The Hugging Face class name for the flaxzoo class ``cls``."""
        for name, flax_cls in self.architectures.items():
            if flax_cls is cls:
                return name
        raise ValueError(f"flaxzoo {cls.__name__} has no Hugging Face {self.model_type} counterpart; supported: "
                         f"{sorted(c.__name__ for c in self.architectures.values())}")


# ------------------------------------------------------------------------------------------- matching a checkpoint

def check_coverage(weights: WeightMap, shapes: Collection[ParamPath], what: str) -> None:
    """ValueError unless the table's parameters are exactly the model's (per-layer paths ``shapes``)."""
    covered = [p for e in weights.entries for p in e.paths]
    orphans = set(shapes) - set(covered)
    strays = set(covered) - set(shapes)
    if orphans or strays:  # a config this mapping does not cover
        names = lambda paths: format_names([dotted(p) for p in paths]) or "none"  # noqa: E731
        raise ValueError(f"{what}: flaxzoo parameters with no Hugging Face tensor: {names(orphans)}; mapped "
                         f"parameters the model lacks: {names(strays)}")


def expected_hf_shapes(weights: WeightMap, shapes: Mapping[ParamPath, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The shape each Hugging Face tensor must have, from the per-layer flaxzoo shapes through ``to_hf`` (no memory
    used)."""
    def to_hf(params):
        return {e.hf: e.transform.to_hf(*(params[dotted(p)] for p in e.paths)) for e in weights.entries}
    structs = {dotted(p): jax.ShapeDtypeStruct(s, jnp.float32) for p, s in shapes.items()}
    return {name: tuple(s.shape) for name, s in jax.eval_shape(to_hf, structs).items()}


def match_tensors(tensors: dict[str, np.ndarray], weights: WeightMap, expected: Mapping[str, tuple[int, ...]],
                  where: str) -> list[str]:
    """Drop ignored / unused / tied duplicates from ``tensors``, then require the expected names and shapes.

    Returns the optional (head) names the checkpoint lacks, for the model to initialise; raises ValueError naming
    every missing (when a required one is among them), unexpected or mis-shaped tensor.
    """
    ignored = [re.compile(p) for p in weights.ignored]
    for name in [n for n in tensors if any(p.fullmatch(n) for p in ignored) or n in weights.unused]:
        del tensors[name]
    for dup, source in weights.tied.items():
        if dup in tensors and source in tensors:
            if tensors[dup].shape != tensors[source].shape or not np.array_equal(tensors[dup], tensors[source]):
                raise ValueError(f"{where}: {dup} differs from {source}, but the config ties them "
                                 "(tie_word_embeddings=True); set tie_word_embeddings=false in config.json to keep "
                                 "both")
            del tensors[dup]
    missing = set(expected) - set(tensors)
    unexpected = set(tensors) - set(expected)
    if (missing - weights.optional) or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors: {format_names(missing)}")
        if unexpected:
            parts.append(f"unexpected tensors: {format_names(unexpected)}")
        raise ValueError(f"{where}: the checkpoint does not match the model; " + "; ".join(parts))
    wrong = [f"{name}: expected shape {expected[name]}, found {tuple(tensors[name].shape)}"
             for name in sorted(set(expected) - missing) if tuple(tensors[name].shape) != expected[name]]
    if wrong:
        raise ValueError(f"{where}: tensors of the wrong shape: " + "; ".join(wrong))
    return sorted(missing)
