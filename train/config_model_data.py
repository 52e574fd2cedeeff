"""The ``model`` and ``data`` sections of the training config: from a ``ConfigDict``'s values to the frozen dataclasses
of their packages (``TransformerConfig`` with its model class, ``DataConfig``), and back (:func:`model_fields`,
:func:`data_fields`: the sections ``configs/*.py`` start from).

The dataclasses validate themselves; their errors become :class:`~flaxzoo.train.config_checks.ConfigError` on
``model.FIELD`` / ``data.FIELD`` by the field they name (an exception's ``field`` attribute), never by parsing the
message.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Mapping

from ml_collections import ConfigDict
from ml_collections.config_dict import placeholder

from flaxzoo.models import PRESETS, TransformerConfig, get_preset
from flaxzoo.models.families import FAMILIES, default_model_class, model_classes
from flaxzoo.train.config_checks import ConfigError, reject_unknown_keys
from flaxzoo.train.data import DataConfig

# TransformerConfig fields set by precision.* (how to run), not model.* (what the model is).
EXECUTION_FIELDS = {"dtype": "compute_dtype", "param_dtype": "param_dtype", "remat": "remat",
                    "scan_layers": "scan_layers"}
# DataConfig fields that come from the top level or do not apply to training.
DATA_FIELDS_FROM_TOP = ("seq_len", "batch_size", "seed")
DATA_FIELDS_EXCLUDED = ("num_epochs",)


def _field_of(exc: Exception) -> str | None:
    """The field a constructor's error is about: the ``field`` of a ``flaxzoo.models.config.FieldError`` (which
    ``TransformerConfig`` and ``DataConfig`` raise), None for another error (e.g. a missing required field)."""
    return getattr(exc, "field", None)


def build_model_config(build: typing.Callable[..., TransformerConfig], fields: dict[str, Any]) -> TransformerConfig:
    """``build(**fields)``, its errors as :class:`ConfigError` on ``model.FIELD`` (``precision.*`` for the
    execution fields)."""
    try:
        return build(**fields)
    except (TypeError, ValueError) as exc:
        field = _field_of(exc)
        key = (f"precision.{EXECUTION_FIELDS[field]}" if field in EXECUTION_FIELDS else
               f"model.{field}" if field else "model")
        raise ConfigError(key, str(exc)) from None


def pretrained_model(source: str, values: Mapping[str, Any]) -> tuple[TransformerConfig, type]:
    """The ``TransformerConfig`` and class of ``init_from``'s model (its config only is read). The ``model``
    section may set ``cls`` only: the architecture is the checkpoint's."""
    from flaxzoo.models.io.sources import open_source

    reject_unknown_keys("model", values, ["preset", "cls", *(f.name for f in dataclasses.fields(TransformerConfig))])
    try:  # a source that is not there is the first thing to say
        config, stored_cls = open_source(source).describe()
    except (OSError, ValueError) as exc:
        message = str(exc)
        raise ConfigError("init_from", message if message.startswith(repr(source)) else f"{source!r}: {message}"
                          ) from None
    set_fields = [k for k, v in values.items() if k != "cls" and v not in (None, "")]
    if set_fields:
        raise ConfigError(f"model.{set_fields[0]}", f"{values[set_fields[0]]!r}: with init_from the model is the "
                                                    f"checkpoint's ({source}); leave the model section unset "
                                                    "(model_fields() with no arguments)")
    cls_name = values.get("cls") or stored_cls.__name__
    if cls_name not in model_classes():
        raise ConfigError("model.cls", f"{cls_name!r}: expected one of {sorted(model_classes())} or ''")
    return config, model_classes()[cls_name]


def model_from_values(values: Mapping[str, Any]) -> tuple[TransformerConfig, type]:
    """The ``TransformerConfig`` of a ``model`` section (preset + set fields, default execution fields) and the
    model class."""
    arch = [f.name for f in dataclasses.fields(TransformerConfig) if f.name not in EXECUTION_FIELDS]
    reject_unknown_keys("model", values, ["preset", "cls", *arch])
    preset = values.get("preset") or ""
    if preset not in PRESETS and preset != "":
        raise ConfigError("model.preset", f"{preset!r} is not a known preset; expected one of {sorted(PRESETS)} "
                                          "or ''")
    fields = {k: v for k, v in values.items() if k not in ("preset", "cls") and v is not None}
    if not preset:
        required = [f.name for f in dataclasses.fields(TransformerConfig)
                    if f.default is dataclasses.MISSING and f.name not in fields]
        if required:
            raise ConfigError(f"model.{required[0]}", f"missing (fields {required} are unset); set model.preset "
                                                      "or every required field")
    model = build_model_config(get_preset(preset).replace if preset else TransformerConfig, fields)
    if model.model_type not in FAMILIES:
        raise ConfigError("model.model_type", f"{model.model_type!r}: expected one of {sorted(FAMILIES)} (the "
                                              "registered families, flaxzoo.models.families)")
    cls_name = values.get("cls") or ""
    if cls_name and cls_name not in model_classes():
        raise ConfigError("model.cls", f"{cls_name!r}: expected one of {sorted(model_classes())} or ''")
    return model, (model_classes()[cls_name] if cls_name else default_model_class(model))


def data_from_values(values: Mapping[str, Any], *, objective: str, seq_len: int, batch_size: int,
                     seed: int) -> DataConfig:
    """The ``DataConfig`` of a ``data`` section; ``seq_len``, ``batch_size``, ``seed`` come from the top level,
    an empty ``objective`` follows the model, ``num_epochs`` is None (training repeats the data)."""
    known = [f.name for f in dataclasses.fields(DataConfig)
             if f.name not in DATA_FIELDS_FROM_TOP and f.name not in DATA_FIELDS_EXCLUDED]
    reject_unknown_keys("data", values, known)
    given = dict(values)
    if not given.get("objective"):
        given["objective"] = objective
    if isinstance(given.get("paths"), str):
        given["paths"] = (given["paths"],)
    fields = {"seq_len": seq_len, "batch_size": batch_size, "seed": seed, **given}

    try:
        return DataConfig(**fields, num_epochs=None)
    except (TypeError, ValueError) as exc:
        field = _field_of(exc)
        key = field if field in DATA_FIELDS_FROM_TOP else (f"data.{field}" if field else "data")
        raise ConfigError(key, str(exc)) from None


# ====================================================================================== sections as ConfigDicts
def _field_type(field: dataclasses.Field) -> type:
    """The type of a ``TransformerConfig`` field, ``X`` for ``X | None`` (what a placeholder of it parses)."""
    hint = typing.get_type_hints(TransformerConfig)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = args[0]
    return typing.get_origin(hint) or hint  # tuple[str, ...] → tuple


def model_fields(preset: str = "", cls: str = "", **fields: Any) -> ConfigDict:
    """The ``model`` section: ``preset``, ``cls`` and one key per architecture field of ``TransformerConfig``.

    Fields not given stay None (a typed placeholder, so ``--config.model.FIELD=VALUE`` still parses) and take the
    preset's value when the config is resolved.
    """
    section = ConfigDict({"preset": preset, "cls": cls})
    for field in dataclasses.fields(TransformerConfig):
        if field.name in EXECUTION_FIELDS or field.name == "label_names":  # set by fine-tuning code, not flags
            continue
        section[field.name] = placeholder(_field_type(field))
    for name, value in fields.items():
        if name not in section:
            raise ValueError(f"model_fields: {name!r} is not a TransformerConfig architecture field")
        section[name] = value
    return section


def data_fields(**fields: Any) -> ConfigDict:
    """The ``data`` section: ``DataConfig`` fields with their defaults, ``fields`` applied."""
    section = ConfigDict()
    for field in dataclasses.fields(DataConfig):
        name = field.name
        if name in DATA_FIELDS_FROM_TOP or name in DATA_FIELDS_EXCLUDED:
            continue
        section[name] = "" if name in ("data_dir", "objective") else field.default  # "": the default dir / model's
    for name, value in fields.items():
        if name not in section:
            raise ValueError(f"data_fields: {name!r} is not a DataConfig field usable in training")
        section[name] = value
    return section
