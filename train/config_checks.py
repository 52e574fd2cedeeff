"""The checking machinery of typed config sections: :class:`ConfigError` (a dotted key and what it expected), the
field :class:`Spec` with its constructors (:func:`integer`, :func:`number`, :func:`choice`, :data:`BOOL`,
:data:`TEXT`, :func:`checked`), :class:`Section` (a frozen dataclass whose fields check themselves at construction),
the unknown-key check (:func:`reject_unknown_keys`) and the conversions between sections and ``ConfigDict`` values
(:func:`section_dict`, :func:`plain_values`, :func:`names_list`).

Nothing here knows a training key: pre-training's sections (``flaxzoo.train.config_sections``, ``flaxzoo.train.config``)
and fine-tuning's (``flaxzoo.train.finetune.config``) are built from these pieces.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, ClassVar, Mapping

from ml_collections import ConfigDict, FieldReference


class ConfigError(ValueError):
    """A config value that cannot work; ``key`` is the dotted config key, the message says what was expected."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


# ===================================================================================================== field specs
@dataclasses.dataclass(frozen=True)
class Spec:
    """What one field accepts. :meth:`check` returns the value (an int widened to float for a number, "a:b" parsed
    for a window) or raises :class:`ConfigError` with the key, the value and what was expected."""

    kind: str  # "int" | "number" | "bool" | "choice" | "str" | "window"
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    choices: tuple = ()
    also: tuple = ()  # values accepted besides the kind's ("auto", -1)
    note: str = ""  # appended to "expected ..."

    def check(self, key: str, value: Any) -> Any:
        if any(type(value) is type(a) and value == a for a in self.also):
            return value
        ok, out = self._accepts(value)
        if not ok:
            raise ConfigError(key, f"{value!r}: expected {self.expected()}")
        return out

    def _accepts(self, value: Any) -> tuple[bool, Any]:
        if self.kind == "bool":
            return isinstance(value, bool), value
        if self.kind == "str":
            return isinstance(value, str), value
        if self.kind == "choice":
            return any(type(value) is type(c) and value == c for c in self.choices), value
        if self.kind == "window":
            return _window(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (self.kind == "int" and not isinstance(value, int)):
            return False, value
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below, (float(value) if self.kind == "number" else value)

    def expected(self) -> str:
        also = "".join(f" or {a!r}" for a in self.also)
        if self.kind == "bool":
            text = "true or false"
        elif self.kind == "str":
            text = "a string"
        elif self.kind == "choice":
            text = f"one of {list(self.choices)}"
        elif self.kind == "window":
            text = "'a:b' with 1 <= a <= b (steps to trace), or '' for none"
        elif self.kind == "int":
            text = "a positive integer" if self.low == 1 else f"an integer >= {self.low:g}"
        else:
            lo, hi = ("(" if self.low_open else "["), (")" if self.high_open else "]")
            text = f"a number in {lo}{self.low:g}, {self.high:g}{hi}"
        return text + also + (f" {self.note}" if self.note else "")


def _window(value: Any) -> tuple[bool, tuple[int, int] | None]:
    """``(accepted, (first, last))`` of a step window "a:b" (or a pair); ``(True, None)`` for "" / None."""
    if value in ("", None):
        return True, None
    if isinstance(value, (tuple, list)):
        parts = list(value)
    elif isinstance(value, str):
        parts = value.split(":")
    else:
        return False, value
    try:
        first, last = (int(p) for p in parts) if len(parts) == 2 else (0, 0)
    except (TypeError, ValueError):
        first = last = 0
    return (1 <= first <= last), (first, last)


def integer(minimum: int = 1, **kw: Any) -> Spec:
    """An integer ``>= minimum`` (``also`` / ``note`` as :class:`Spec`)."""
    return Spec("int", low=minimum, **kw)


def number(low: float = -math.inf, high: float = math.inf, **kw: Any) -> Spec:
    """A number in ``[low, high]`` (``low_open`` / ``high_open`` exclude the ends); an int is widened to float."""
    return Spec("number", low=low, high=high, **kw)


def choice(*choices: Any, **kw: Any) -> Spec:
    """One of ``choices`` (of the same type: ``True`` is not ``1``)."""
    return Spec("choice", choices=choices, **kw)


BOOL, TEXT = Spec("bool"), Spec("str")


def checked(default: Any, spec: Spec | None, **kw: Any) -> Any:
    """A :class:`Section` field with its default and :class:`Spec` (None: not a user key, not checked)."""
    return dataclasses.field(default=default, metadata={"spec": spec} if spec else {}, **kw)


class Section:
    """A config section as a frozen dataclass: every field checked by its :class:`Spec` at construction, then
    :meth:`_validate` (checks across fields). ``SECTION`` is the dotted prefix of its keys."""

    SECTION: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            spec = f.metadata.get("spec")
            if spec is not None:
                object.__setattr__(self, f.name, spec.check(self.key(f.name), getattr(self, f.name)))
        self._validate()

    def _validate(self) -> None:
        """Checks across the fields of one section (a subclass's); none here."""

    @classmethod
    def key(cls, name: str) -> str:
        """The dotted key of field ``name`` (``optim.lr``; a top-level field's own name)."""
        return f"{cls.SECTION}.{name}" if cls.SECTION else name

    @classmethod
    def keys(cls) -> list[str]:
        """The user's keys of this section (fields with a spec)."""
        return [f.name for f in dataclasses.fields(cls) if "spec" in f.metadata]  # type: ignore[arg-type]

    @classmethod
    def from_values(cls, values: Mapping[str, Any], **fixed: Any):
        """The section from ``values`` (missing keys take the defaults); an unknown key is an error naming it."""
        reject_unknown_keys(cls.SECTION, values, cls.keys())
        return cls(**values, **fixed)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """``{key: default}`` of the user's keys."""
        return {f.name: f.default for f in dataclasses.fields(cls) if "spec" in f.metadata}  # type: ignore


def reject_unknown_keys(section: str, values: Mapping[str, Any], known: typing.Iterable[str]) -> None:
    """:class:`ConfigError` on ``section.KEY`` for the first key of ``values`` not in ``known``, listing those."""
    known = sorted(known)
    unknown = sorted(set(values) - set(known))
    if unknown:
        key = f"{section}.{unknown[0]}" if section else unknown[0]
        raise ConfigError(key, f"unknown key (value {values[unknown[0]]!r}); expected one of {known}")


def section_dict(cls: type[Section]) -> ConfigDict:
    """The ``ConfigDict`` of a section's keys with their defaults (a bool or an integer that also takes "auto"
    accepts any type)."""
    out = ConfigDict()
    for name, value in cls.defaults().items():
        spec = cls.__dataclass_fields__[name].metadata["spec"]
        mixed = spec.kind in ("bool", "int") and bool(spec.also)  # "auto" or true / false (a number): any type parses
        out[name] = FieldReference(value, field_type=object) if mixed else value
    return out


def plain_values(value: Any) -> Any:
    """``value`` with every mapping a ``dict`` and every sequence a ``list``, recursively (JSON-able shapes)."""
    if isinstance(value, Mapping):
        return {k: plain_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_values(v) for v in value]
    return value


def names_list(text: str) -> tuple[str, ...]:
    """``"a, b,c"`` → ``("a", "b", "c")`` (empty items dropped)."""
    return tuple(item.strip() for item in text.split(",") if item.strip())
