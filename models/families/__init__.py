"""The model families, gathered from their folders, and every lookup that needs one.

A family is a folder here (``bert/``, ``roberta/``, ``gpt2/``, ``llama/``) whose ``__init__.py`` exports ``RECORDS``:
its :class:`~flaxzoo.models.families.base.Family` records (what flaxzoo knows about a Hugging Face ``model_type``: its
architectures and flaxzoo classes, config translation, weight table, GGUF layout, LoRA and int8 targets, presets), each
under its place in the order the families were added. The registry imports every folder (``pkgutil``) and registers
the records in that order, which is the order of lookups: a class several families share (BERT's, the decoder's)
belongs to the earliest. Adding a family is its folder, and nothing else (``docs/adding-a-family.md``).

Lookups: by flaxzoo ``model_type`` (:func:`family_of`), by a ``config.json`` (:func:`family_and_class`), by a GGUF's
``general.architecture`` (:func:`gguf_family`), by flaxzoo class (:func:`family_of_class`, :func:`model_classes`),
and the families' named configs (:data:`PRESETS`, :func:`get_preset`).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from types import ModuleType
from typing import Any, Callable, Collection, Mapping

from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family, ParamPath

FAMILIES: dict[str, Family] = {}
PRESETS: dict[str, TransformerConfig] = {}  # every registered family's presets, by name


def register(family: Family) -> Family:
    """Add ``family`` to the registry (returned unchanged); ValueError when its ``model_type``, a Hugging Face
    architecture, a flaxzoo class name or a GGUF architecture is already another family's."""
    if not isinstance(family, Family):
        raise ValueError(f"register expects a Family; got {type(family).__name__}")
    if family.model_type in FAMILIES:
        raise ValueError(f"model_type={family.model_type!r} is already registered")
    taken = {name: other.model_type for other in FAMILIES.values() for name in other.architectures}
    clashes = sorted(name for name in family.architectures if name in taken)
    if clashes:
        raise ValueError(f"{family.model_type}: Hugging Face architectures {clashes} are already registered")
    classes = model_classes()
    for cls in family.classes:
        if classes.get(cls.__name__, cls) is not cls:
            raise ValueError(f"{family.model_type}: another flaxzoo class is already named {cls.__name__!r}")
        if not isinstance(getattr(cls, "task", None), str):
            raise ValueError(f"{family.model_type}: {cls.__name__} has no task (a class attribute such as "
                             "'causal_lm', 'masked_lm', 'sequence_classification', or 'base')")
    clashing = sorted(set(family.presets) & set(PRESETS))
    if clashing:
        raise ValueError(f"{family.model_type}: presets {clashing} are already registered (a record made with "
                         "dataclasses.replace keeps its parent's presets: pass presets={} or its own)")
    wrong = sorted(name for name, config in family.presets.items() if config.model_type != family.model_type)
    if wrong:
        raise ValueError(f"{family.model_type}: presets {wrong} have another model_type")
    gguf_taken = {a for other in FAMILIES.values() if other.gguf for a in other.gguf.architectures}
    if family.gguf and gguf_taken & set(family.gguf.architectures):
        raise ValueError(f"{family.model_type}: GGUF architectures {sorted(gguf_taken & set(family.gguf.architectures))}"
                         " are already registered")
    FAMILIES[family.model_type] = family
    PRESETS.update(family.presets)
    return family


def get_preset(name: str, **overrides: Any) -> TransformerConfig:
    """The preset ``name`` with ``overrides`` applied, e.g. ``get_preset("gpt2", dropout=0.0)``."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]


def supported() -> str:
    """``"bert: BertModel, ...; gpt2: ..."`` for error messages."""
    return "; ".join(f"{k}: {', '.join(f.architectures)}" for k, f in FAMILIES.items())


def supported_architectures() -> dict[str, list[str]]:
    """``{model_type: [Hugging Face architectures]}`` of every registered family."""
    return {k: list(f.architectures) for k, f in FAMILIES.items()}


def family_of(model_type: str) -> Family:
    """The family of a flaxzoo config's ``model_type``; ValueError for one no family registers."""
    if model_type not in FAMILIES:
        raise ValueError(f"model_type={model_type!r}: expected one of {sorted(FAMILIES)}")
    return FAMILIES[model_type]


def model_classes() -> dict[str, type]:
    """``{class name: flaxzoo class}`` of every registered family's classes."""
    return {cls.__name__: cls for family in FAMILIES.values() for cls in family.classes}


def family_of_class(cls: type) -> Family:
    """The first registered family with the flaxzoo class ``cls`` (RoBERTa shares BERT's classes: BERT);
    ValueError for a class no family has."""
    for family in FAMILIES.values():
        if cls in family.classes:
            return family
    raise ValueError(f"{getattr(cls, '__name__', cls)!r} is no registered flaxzoo model class; expected one of "
                     f"{sorted(model_classes())}")


def family_of_model(model: Any) -> Family:
    """The family of a model instance: its config's ``model_type`` when that family has the model's class (RoBERTa,
    ALBERT ... share BERT's classes, and only the config tells them apart), else :func:`family_of_class` of its class
    (also for a class given instead of a model)."""
    cls = model if isinstance(model, type) else type(model)
    own = FAMILIES.get(getattr(getattr(model, "config", None), "model_type", None))
    return own if own is not None and cls in own.classes else family_of_class(cls)


def model_class(name: str | type, *, causal: bool | None = None) -> type:
    """The flaxzoo class called ``name`` (a class is checked to be registered), of the kind ``causal`` (decoder /
    encoder) when given; ValueError naming the choices otherwise."""
    classes = {n: c for n, c in model_classes().items() if causal is None or family_of_class(c).causal == causal}
    key = name if isinstance(name, str) else getattr(name, "__name__", repr(name))
    if key not in classes or (not isinstance(name, str) and classes[key] is not name):
        kind = "" if causal is None else " decoder" if causal else " encoder"
        raise ValueError(f"model class {key!r}: expected one of the{kind} classes {sorted(classes)}")
    return classes[key]


def is_decoder_class(cls: type) -> bool:
    """Whether ``cls`` is a registered class of a causal family."""
    return family_of_class(cls).causal


def default_model_class(config: TransformerConfig) -> type:
    """The language-model class of a config: its family's causal-LM (decoder) or masked-LM (encoder) class, or
    the first registered family's of that kind when its own has none (a custom config)."""
    task = "causal_lm" if config.causal else "masked_lm"
    own = FAMILIES.get(config.model_type)
    for family in ([own] if own is not None else []) + list(FAMILIES.values()):
        if family.causal == config.causal and family.class_for(task) is not None:
            return family.class_for(task)
    raise ValueError(f"no registered family has a {task} class")


def factory_for(cls: type, params: Collection[ParamPath]) -> Callable[..., nnx.Module]:
    """What builds ``cls`` for a checkpoint filling the flaxzoo parameters ``params`` (its family's ``factory``)."""
    return family_of_class(cls).factory(cls, params)


def plain_factory(model: nnx.Module) -> Callable[..., nnx.Module]:
    """The factory that builds another ``model`` of the same structure (a BERT without a pooler: that)."""
    params = [path for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))]
    return factory_for(type(model), params)


def family_and_class(hf: Mapping[str, Any], cls: type | str | None) -> tuple[Family, type]:
    """The family of a ``config.json`` and the flaxzoo class to build: ``cls`` (a class or its name), checked
    against the family, or the counterpart of ``architectures[0]``."""
    architectures = hf.get("architectures") or []
    model_type = hf.get("model_type")
    if model_type is None and architectures:  # an old config.json: recognise the architecture
        model_type = next((k for k, f in FAMILIES.items() if architectures[0] in f.architectures), None)
    if model_type not in FAMILIES:
        raise ValueError(f"unsupported model_type {model_type!r} (architectures {architectures}); flaxzoo loads "
                         f"{supported()}")
    family = FAMILIES[model_type]
    if cls is None:
        if not architectures:
            return family, family.base_class
        if architectures[0] not in family.architectures:
            raise ValueError(f"unsupported architecture {architectures[0]!r} for model_type {model_type!r}; "
                             f"flaxzoo loads {supported()} (or pass cls= to choose a flaxzoo class)")
        return family, family.architectures[architectures[0]]
    classes = {c.__name__: c for c in family.architectures.values()}
    name = cls if isinstance(cls, str) else getattr(cls, "__name__", repr(cls))
    if name not in classes or (not isinstance(cls, str) and classes[name] is not cls):
        raise ValueError(f"cls={name} cannot hold a {model_type} checkpoint; expected one of {sorted(classes)}")
    return family, classes[name]


def gguf_family(architecture: str) -> Family:
    """The family that reads GGUF files of ``general.architecture`` ``architecture``; ValueError naming the ones
    flaxzoo reads otherwise."""
    for family in FAMILIES.values():
        if family.gguf is not None and architecture in family.gguf.architectures:
            return family
    known = sorted(a for f in FAMILIES.values() if f.gguf for a in f.gguf.architectures)
    raise ValueError(f"unsupported GGUF architecture {architecture!r} (general.architecture); flaxzoo loads {known}")


def gguf_config(file: Any, tensor_names: Collection[str] | None = None) -> tuple[Family, dict[str, Any]]:
    """The family of a ``GGUFFile`` and the Hugging Face ``config.json`` its metadata describes (rotate-half terms;
    the family's ``gguf.rope_layout`` is the layout of its Q/K rows). ValueError naming the file for another
    architecture or a feature the family does not implement."""
    try:
        family = gguf_family(file.architecture)
    except ValueError as exc:
        raise ValueError(f"{file.path}: {exc}") from None
    names = set(file.tensor_names) if tensor_names is None else set(tensor_names)
    return family, family.gguf.config(file, names)


def lora_targets(model_or_cls: Any = None) -> Mapping[str, str]:
    """The LoRA target names of a model's (or class's) family; with None, or for a class no family has, those of
    every family (for checking a name before there is a model)."""
    cls = model_or_cls if model_or_cls is None or isinstance(model_or_cls, type) else type(model_or_cls)
    if cls is not None and any(cls in f.classes for f in FAMILIES.values()):
        return dict(family_of_model(model_or_cls).lora_targets)
    return {name: pattern for f in FAMILIES.values() for name, pattern in f.lora_targets.items()}


def family_folders(package: ModuleType) -> list[ModuleType]:
    """The family folders of ``package`` (its subpackages, imported), by name."""
    names = sorted(info.name for info in pkgutil.iter_modules(package.__path__) if info.ispkg)
    return [importlib.import_module(f"{package.__name__}.{name}") for name in names]


def gathered(folders: Collection[ModuleType]) -> list[Family]:
    """The ``RECORDS`` of ``folders`` (``{place: Family}`` each), in the order of their places; ValueError naming the
    folder that has none, a record that is no ``Family``, or two folders claiming one place."""
    placed: dict[int, tuple[str, Family]] = {}
    for folder in folders:
        records = getattr(folder, "RECORDS", None)
        if not isinstance(records, Mapping) or not records:
            raise ValueError(f"{folder.__name__}: a family folder's __init__.py exports RECORDS, {{place: Family}} "
                             "(place: the next number after the last family added)")
        for place, record in records.items():
            if not isinstance(place, int) or not isinstance(record, Family):
                raise ValueError(f"{folder.__name__}: RECORDS maps int places to Family records; got "
                                 f"{place!r}: {type(record).__name__}")
            if place in placed:
                raise ValueError(f"{folder.__name__}: place {place} of RECORDS is already "
                                 f"{placed[place][0]}'s ({placed[place][1].model_type})")
            placed[place] = folder.__name__, record
    return [record for _, (_, record) in sorted(placed.items())]


def last_added(folders: Collection[ModuleType]) -> ModuleType:
    """The folder holding the record with the highest place: the family added last."""
    return max(folders, key=lambda folder: max(folder.RECORDS))


FOLDERS: list[ModuleType] = family_folders(sys.modules[__name__])  # every folder here, imported
for _record in gathered(FOLDERS):
    register(_record)
del _record

__all__ = ["FAMILIES", "FOLDERS", "Family", "default_model_class", "factory_for", "family_and_class", "family_folders",
           "family_of", "family_of_class", "family_of_model", "gathered", "gguf_config", "gguf_family",
           "is_decoder_class", "last_added", "lora_targets", "model_class", "model_classes", "plain_factory",
           "register", "supported", "supported_architectures"]
