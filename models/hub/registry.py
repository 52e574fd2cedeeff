"""The supported Hugging Face families, one line each, and the choice of family and flaxzoo class for a checkpoint.

Adding a family: a new module in ``models/hub/`` defining ``FAMILY`` (its name table and config translation), and
its line here.
"""

from __future__ import annotations

from typing import Any, Mapping

from flaxzoo.models.hub import bert, gpt2, llama, roberta
from flaxzoo.models.hub.mapping import Family

FAMILIES: dict[str, Family] = {family.model_type: family for family in (
    bert.FAMILY,
    roberta.FAMILY,
    gpt2.FAMILY,
    llama.FAMILY,
)}

SUPPORTED_ARCHITECTURES: dict[str, list[str]] = {k: list(f.architectures) for k, f in FAMILIES.items()}


def supported() -> str:
    """``"bert: BertModel, ...; gpt2: ..."`` for error messages."""
    return "; ".join(f"{k}: {', '.join(v)}" for k, v in SUPPORTED_ARCHITECTURES.items())


def family_of(model_type: str) -> Family:
    """The family of a flaxzoo config's ``model_type``; ValueError for one without a Hugging Face layout."""
    if model_type not in FAMILIES:
        raise ValueError(f"model_type={model_type!r}: expected one of {sorted(FAMILIES)}")
    return FAMILIES[model_type]


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
