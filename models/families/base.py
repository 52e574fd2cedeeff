"""What every family is made of: the family record (``Family``, with ``GGUFSpec``), the table machinery
(transforms between the two tensor layouts, table entries, weight maps) and the checks that match a checkpoint's
tensors against a table. Nothing here names a family; ``flaxzoo.models.families`` registers them.

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

ParamPath = tuple[Union[str, int], ...]
Array = Any  # np.ndarray, or a jax array / tracer while shapes are being worked out

# The module every model class keeps its ``TransformerStack`` under (``model.backbone.layers.3.mlp.up``); its
# pooler and heads sit beside it at the top level.
BACKBONE = "backbone"

# The defaults every family gets unless it says otherwise. LoRA target names, each a regular expression over a
# ``Dense``'s dotted module path:
LORA_TARGETS: Mapping[str, str] = {
    # self-attention, and an encoder-decoder's cross-attention beside it
    "attention": r"(^|\.)(cross_)?attention\.(query|key|value|out)$",
    "mlp": r"(^|\.)mlp\.(up|gate|down)$",
    "query": r"(^|\.)(cross_)?attention\.query$",
    "key": r"(^|\.)(cross_)?attention\.key$",
    "value": r"(^|\.)(cross_)?attention\.value$",
    "out": r"(^|\.)(cross_)?attention\.out$",
    "cross_attention": r"(^|\.)cross_attention\.(query|key|value|out)$",
    "up": r"(^|\.)mlp\.up$",
    "gate": r"(^|\.)mlp\.gate$",
    "down": r"(^|\.)mlp\.down$",
    # Every module outside the stacks and their token table: a BERT pooler, an MLM head (transform, norm, its
    # vocabulary bias at "decoder"), a classifier, an untied LM head; an encoder-decoder's stacks are "encoder." and
    # "decoder." (their modules below them), its table "shared".
    "head": rf"^(?!({BACKBONE}|shared)(\.|$)|(encoder|decoder)\.).+$",
}
# The projections int8 quantises: (parent attribute, child attributes) in a block.
INT8_TARGETS: Mapping[str, tuple[str, ...]] = {"attention": ("query", "key", "value", "out"),
                                               "cross_attention": ("query", "key", "value", "out"),
                                               "mlp": ("gate", "up", "down")}


def format_names(names: Collection[str], limit: int = 20) -> str:
    """``names`` sorted and comma-separated, the first ``limit`` of them (then how many more)."""
    names = sorted(names)
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def dotted(path: ParamPath) -> str:
    """``("backbone", "layers", 0, "mlp")`` → ``"backbone.layers.0.mlp"``."""
    return ".".join(map(str, path))


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
    """``"backbone.layers.3.mlp.up.kernel"`` → ``("backbone", "layers", 3, "mlp", "up", "kernel")``."""
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
    """The LM head of a causal-LM class (``cls.task == "causal_lm"``; other classes get nothing): tied to the Hugging
    Face tensor ``embedding``, or its own ``lm_head.weight``. Returns (entries to add, tied names ``{hf duplicate:
    hf source}``)."""
    if getattr(cls, "task", None) != "causal_lm":
        return [], {}
    if config.tie_word_embeddings:
        return [], {"lm_head.weight": embedding}
    return [entry("lm_head.weight", "lm_head.kernel", LINEAR)], {}


def outside(entries: Sequence[Entry], stack: str = BACKBONE) -> frozenset[str]:
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

    def params_of(self, names: Collection[str]) -> set[ParamPath]:
        """The flaxzoo parameters the Hugging Face tensors ``names`` fill (for ``Family.factory``)."""
        names = set(names)
        return {p for e in self.entries if e.hf in names for p in e.paths}

    def renamed(self, rename: Callable[[str], str], ignored: tuple[str, ...] = ()) -> "WeightMap":
        """The same table under other tensor names (``rename`` of every Hugging Face name: a GGUF's), ignoring the
        regular expressions ``ignored`` instead. A duplicate renamed to its source's name is dropped: the file holds
        that tensor once (T5's ``encoder.embed_tokens`` is GGUF's ``token_embd``)."""
        return WeightMap([dataclasses.replace(e, hf=rename(e.hf)) for e in self.entries],
                         {rename(dup): rename(source) for dup, source in self.tied.items()
                          if rename(dup) != rename(source)},
                         {rename(name): rename(source) for name, source in self.unused.items()}, ignored,
                         frozenset(rename(name) for name in self.optional))


@dataclasses.dataclass(frozen=True)
class GGUFSpec:
    """A family's llama.cpp GGUF files: the ``general.architecture`` values it reads, the ``config.json`` a file
    describes (``config(file, tensor names)``, in rotate-half terms: the loader switches to ``rope_layout``), the
    GGUF name of each Hugging Face tensor (``names``: (regular expression, replacement) pairs, as llama.cpp's
    ``convert_hf_to_gguf.py`` writes them) and the tokenizer kinds it carries (``tokenizer.ggml.model``; ``"gpt2"``
    is byte-level BPE).

    ``offsets``: (regular expression over Hugging Face names, the constant llama.cpp adds to those tensors on
    conversion): Gemma's norms are stored as ``1 + w``; the loader subtracts it. ``skipped``: regular expressions of
    GGUF tensors that are no parameters (Phi-3's LongRoPE factors, which ``config`` reads)."""

    architectures: tuple[str, ...]
    config: Callable[[Any, Collection[str]], dict[str, Any]]
    names: tuple[tuple[str, str], ...]
    tokenizers: tuple[str, ...] = ("gpt2",)
    rope_layout: str = "interleaved"  # llama.cpp stores Q and K rows with RoPE pairs interleaved
    offsets: tuple[tuple[str, float], ...] = ()
    skipped: tuple[str, ...] = ()

    def name(self, hf_name: str) -> str:
        """``"model.layers.3.self_attn.q_proj.weight"`` → ``"blk.3.attn_q.weight"``."""
        for pattern, replacement in self.names:
            if re.fullmatch(pattern, hf_name):
                return re.sub(pattern, replacement, hf_name)
        raise KeyError(f"no GGUF name for the Hugging Face tensor {hf_name}")

    def stored(self, e: Entry) -> Entry:
        """``e`` reading its tensor as the GGUF file stores it: minus the ``offsets`` constant of its name, if any
        (plus it on the way back)."""
        amount = next((value for pattern, value in self.offsets if re.fullmatch(pattern, e.hf)), 0.0)
        if not amount:
            return e
        inner = e.transform
        return dataclasses.replace(e, transform=Transform(lambda w: inner.to_flax(w - amount),
                                                          lambda *ws: inner.to_hf(*ws) + amount))


def plain(cls: type, params: Collection[ParamPath]) -> Callable[..., nnx.Module]:
    """The default ``Family.factory``: the class itself, whatever the checkpoint holds."""
    return cls


@dataclasses.dataclass(frozen=True)
class Family:
    """Everything flaxzoo knows about one Hugging Face ``model_type``; its family folder's ``RECORDS`` lists it, and
    ``flaxzoo.models.families`` registers it (or :func:`~flaxzoo.models.families.register`, from your own code).

    ``architectures``: Hugging Face class name → flaxzoo class, the base model first (the heads are declared here
    and nowhere else; each class says its ``task``). ``weights(config, flaxzoo class, HF base prefix)`` builds the
    table; ``base_prefix``: the attribute holding the base model in Hugging Face's head classes. ``layout``: the
    ``TransformerConfig`` fields the family fixes (``causal`` among them); ``save_problems(config)`` names anything
    else Hugging Face's class cannot express. ``factory(cls, flaxzoo parameter paths a checkpoint fills)``: what
    builds the model for it (a ``BertModel`` without pooler ...); ``rename``: old tensor names → current ones, on
    load. ``config_from_tensors(config, tensor names)``: what the checkpoint's tensor names decide that its
    ``config.json`` does not (T5's untied head: transformers 5 writes ``tie_word_embeddings=true`` whatever the
    checkpoint holds). ``gguf``: its llama.cpp files, if any. ``lora_targets`` / ``projections``: the LoRA target
    names and the projections int8 quantises. ``presets``: named configs of published (and tiny test) models of this
    ``model_type`` (``flaxzoo.models.get_preset``). The block the layers are made of is the model classes' ``block``
    attribute.
    """

    model_type: str
    base_prefix: str
    architectures: dict[str, type]
    config_from_hf: Callable[[Mapping[str, Any]], TransformerConfig]
    config_to_hf: Callable[[TransformerConfig], dict[str, Any]]
    weights: Callable[[TransformerConfig, type, str], WeightMap]
    layout: dict[str, Any]
    save_problems: Callable[[TransformerConfig], list[str]] = lambda config: []
    factory: Callable[[type, Collection[ParamPath]], Callable[..., nnx.Module]] = plain
    rename: Callable[[str], str] | None = None
    config_from_tensors: Callable[[TransformerConfig, Collection[str]], TransformerConfig] | None = None
    gguf: GGUFSpec | None = None
    lora_targets: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(LORA_TARGETS))
    projections: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=lambda: dict(INT8_TARGETS))
    presets: Mapping[str, TransformerConfig] = dataclasses.field(default_factory=dict)

    @property
    def base_class(self) -> type:
        """The flaxzoo class of the Hugging Face base model (the first architecture)."""
        return next(iter(self.architectures.values()))

    @property
    def classes(self) -> tuple[type, ...]:
        """The flaxzoo classes, each once, in the order of ``architectures``."""
        return tuple(dict.fromkeys(self.architectures.values()))

    @property
    def causal(self) -> bool:
        return bool(self.layout["causal"])

    @property
    def block(self) -> type:
        """The block class the family's layers are made of (``TransformerBlock`` unless its classes say otherwise)."""
        return self.base_class.block

    def class_for(self, task: str) -> type | None:
        """The flaxzoo class whose ``task`` is ``task`` (``"causal_lm"``, ``"masked_lm"`` ...), or None."""
        return next((c for c in self.classes if getattr(c, "task", None) == task), None)

    def hf_architecture(self, cls: type) -> str:
        """The Hugging Face class name for the flaxzoo class ``cls``."""
        for name, flax_cls in self.architectures.items():
            if flax_cls is cls:
                return name
        raise ValueError(f"flaxzoo {cls.__name__} has no Hugging Face {self.model_type} counterpart; supported: "
                         f"{sorted(c.__name__ for c in self.architectures.values())}")

    def gguf_weights(self, config: TransformerConfig, cls: type) -> WeightMap:
        """The table for ``cls`` under the family's GGUF names, each tensor as the file stores it
        (``GGUFSpec.offsets``). A GGUF has no base-model prefix; the tensors of heads ``cls`` lacks (the output
        projection, for the base model) and the spec's ``skipped`` tensors are skipped."""
        if self.gguf is None:
            raise ValueError(f"Hugging Face {self.model_type} has no GGUF layout in flaxzoo")
        hf = self.weights(config, cls, f"{self.base_prefix}.")
        full = set()
        for other in self.classes:
            full |= {e.hf for e in self.weights(config, other, f"{self.base_prefix}.").entries}
        heads = sorted(full - {e.hf for e in hf.entries})
        if self.gguf.offsets:
            hf = dataclasses.replace(hf, entries=[self.gguf.stored(e) for e in hf.entries])
        return hf.renamed(self.gguf.name, (*(re.escape(self.gguf.name(n)) for n in heads), *self.gguf.skipped))


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
