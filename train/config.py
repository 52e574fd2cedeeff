"""The training config: one ``ml_collections.ConfigDict`` (``configs/*.py``), checked and resolved before any work.

Public, stable keys (``--config.KEY=VALUE`` on the command line):

- ``steps``, ``seed``, ``log_every``, ``eval_every``, ``eval_batches``, ``checkpoint_every``, ``keep_checkpoints``
- ``batch_size`` (global, all micro-batches of a step), ``seq_len``
- ``mesh.data``, ``mesh.fsdp``, ``mesh.tensor``: the device mesh; one of them may be −1 (fills the remaining devices)
- ``optim.*``: ``lr``, ``schedule`` (cosine | linear | constant), ``warmup_steps``, ``min_lr_ratio``, ``b1``, ``b2``,
  ``eps``, ``weight_decay``, ``decay_embeddings``, ``grad_clip`` (0 = off), ``accum_steps`` (micro-batches per step),
  ``layer_decay`` (layer-wise LR decay factor, 1 = off)
- ``precision.*``: ``compute_dtype`` (auto | float32 | bfloat16 | float16; auto = bfloat16 on GPU/TPU, float32 on
  CPU), ``param_dtype``, ``remat`` (none | full | dots), ``scan_layers``
- ``model.*``: ``preset`` (a name from ``models.PRESETS`` or ""), ``cls`` (a model class name or "" for the
  config's language model), and every architecture field of ``TransformerConfig``; unset fields (None) take the
  preset's value
- ``data.*``: the fields of ``train.data.DataConfig`` except ``seq_len``, ``batch_size`` and ``seed`` (taken from the
  top level) and ``num_epochs`` (training repeats the data); ``data.objective`` "" follows the model (causal for a
  decoder, mlm for an encoder)
- ``sample.*``: ``prompt``, ``max_new_tokens``, ``temperature``, ``top_k`` (0 = off)
- ``compilation_cache`` (bool), ``compilation_cache_dir`` ("" = ``$FLAXZOO_JAX_CACHE`` or ``~/.cache/flaxzoo/jax``)

:func:`resolve` turns a config into :class:`Resolved` or raises :class:`ConfigError` naming the offending key; it
needs only the device count, so a bad value stops the run before any data preparation or compilation.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from typing import Any

import jax
from ml_collections import ConfigDict
from ml_collections.config_dict import placeholder

from models import PRESETS, TransformerConfig, get_preset
from models.config import DTYPES, REMAT_POLICIES
from models.modeling import MODEL_CLASSES, default_model_class
from train.data import DataConfig

# TransformerConfig fields set by precision.* (how to run), not model.* (what the model is).
EXECUTION_FIELDS = ("dtype", "param_dtype", "remat", "scan_layers")
# DataConfig fields that come from the top level or do not apply to training.
DATA_FIELDS_FROM_TOP = ("seq_len", "batch_size", "seed")
DATA_FIELDS_EXCLUDED = ("num_epochs",)
SCHEDULES = ("cosine", "linear", "constant")
COMPUTE_DTYPES = ("auto", *DTYPES)


class ConfigError(ValueError):
    """A config value that cannot work; ``key`` is the dotted config key, the message says what was expected."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


# ================================================================================================ building configs
def _field_type(field: dataclasses.Field) -> type:
    hint = typing.get_type_hints(TransformerConfig)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = args[0]
    return hint


def model_fields(preset: str = "", cls: str = "", **fields: Any) -> ConfigDict:
    """The ``model`` section: ``preset``, ``cls`` and one key per architecture field of ``TransformerConfig``.

    Fields not given stay None (a typed placeholder, so ``--config.model.FIELD=VALUE`` still parses) and take the
    preset's value when the config is resolved.
    """
    section = ConfigDict({"preset": preset, "cls": cls})
    for field in dataclasses.fields(TransformerConfig):
        if field.name in EXECUTION_FIELDS:
            continue
        section[field.name] = placeholder(_field_type(field))
    for name, value in fields.items():
        if name not in section:
            raise ValueError(f"model_fields: {name!r} is not a TransformerConfig architecture field")
        section[name] = value
    return section


def data_fields(**fields: Any) -> ConfigDict:
    """The ``data`` section: ``DataConfig`` fields with their defaults, ``fields`` applied."""
    defaults = DataConfig.__dataclass_fields__
    section = ConfigDict()
    for name, field in defaults.items():
        if name in DATA_FIELDS_FROM_TOP or name in DATA_FIELDS_EXCLUDED:
            continue
        value = field.default
        section[name] = "" if name in ("data_dir", "objective") else value  # "": the default dir / the model's
    for name, value in fields.items():
        if name not in section:
            raise ValueError(f"data_fields: {name!r} is not a DataConfig field usable in training")
        section[name] = value
    return section


def base_config() -> ConfigDict:
    """Every key with its default; ``configs/*.py`` start from this and change what they need."""
    c = ConfigDict()
    c.steps = 1000
    c.seed = 0
    c.log_every = 10
    c.eval_every = 200
    c.eval_batches = 0  # validation batches per evaluation; 0 = the whole validation split
    c.checkpoint_every = 200
    c.keep_checkpoints = 3
    c.batch_size = 16
    c.seq_len = 128
    c.mesh = ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
    c.optim = ConfigDict({
        "lr": 1e-3, "schedule": "cosine", "warmup_steps": 100, "min_lr_ratio": 0.1, "b1": 0.9, "b2": 0.95,
        "eps": 1e-8, "weight_decay": 0.1, "decay_embeddings": False, "grad_clip": 1.0, "accum_steps": 1,
        "layer_decay": 1.0,
    })
    c.precision = ConfigDict({"compute_dtype": "auto", "param_dtype": "float32", "remat": "none",
                              "scan_layers": False})
    c.model = model_fields("gpt2-tiny")
    c.data = data_fields()
    c.sample = ConfigDict({"prompt": "The ", "max_new_tokens": 48, "temperature": 0.8, "top_k": 40})
    c.compilation_cache = True
    c.compilation_cache_dir = ""
    c.profile_steps = ""  # "a:b": a jax.profiler trace of steps a..b into WORKDIR/profile ("" = none)
    return c


# ====================================================================================================== resolving
@dataclasses.dataclass(frozen=True)
class Resolved:
    """What a checked config means: the model, its class, the data pipeline, the mesh shape, the objective."""

    model: TransformerConfig
    model_cls: type
    data: DataConfig
    mesh_shape: tuple[int, int, int]
    objective: str  # "causal" | "mlm"

    @property
    def batch_axes_size(self) -> int:
        return self.mesh_shape[0] * self.mesh_shape[1]


def _int(config: ConfigDict, key: str, *, minimum: int) -> int:
    value = _get(config, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigError(key, f"{value!r}: expected {expected}")
    return value


def _number(config: ConfigDict, key: str, *, low: float, high: float = math.inf, low_open: bool = False,
            high_open: bool = False) -> float:
    value = _get(config, key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        raise ConfigError(key, f"{value!r}: expected a number in {lo}{low}, {high}{hi}")
    return float(value)


def _choice(config: ConfigDict, key: str, choices: tuple) -> Any:
    value = _get(config, key)
    if value not in choices:
        raise ConfigError(key, f"{value!r}: expected one of {list(choices)}")
    return value


def _get(config: ConfigDict, key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        try:
            node = node[part]
        except (KeyError, AttributeError):
            raise ConfigError(key, "missing from the config") from None
    return node


def profile_window(config: ConfigDict) -> tuple[int, int] | None:
    """``profile_steps = "a:b"`` as ``(a, b)`` (1 <= a <= b), or None when it is empty."""
    value = _get(config, "profile_steps")
    if value in ("", None):
        return None
    parts = str(value).split(":")
    try:
        first, last = (int(p) for p in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        first = last = None
    if first is None or not 1 <= first <= last:
        raise ConfigError("profile_steps", f"{value!r}: expected 'a:b' with 1 <= a <= b (steps to trace), or '' "
                                           "for none")
    return first, last


def resolve_mesh(config: ConfigDict, device_count: int) -> tuple[int, int, int]:
    """``(data, fsdp, tensor)`` with a −1 replaced by what fills ``device_count``."""
    keys = ("mesh.data", "mesh.fsdp", "mesh.tensor")
    values = []
    for key in keys:
        value = _get(config, key)
        if not isinstance(value, int) or isinstance(value, bool) or (value < 1 and value != -1):
            raise ConfigError(key, f"{value!r}: expected a positive integer or -1 (fill the remaining devices)")
        values.append(value)
    fill = [k for k, v in zip(keys, values) if v == -1]
    if len(fill) > 1:
        raise ConfigError(fill[1], f"-1 is given for {fill}: at most one mesh axis can fill the remaining devices")
    fixed = math.prod(v for v in values if v != -1)
    if fill:
        if device_count % fixed:
            raise ConfigError(fill[0], f"-1 cannot fill the mesh: {device_count} devices are not divisible by the "
                                       f"other axes' product {fixed}")
        values[keys.index(fill[0])] = device_count // fixed
    elif fixed != device_count:
        shape = dict(zip(keys, values))
        raise ConfigError("mesh", f"{shape} spans {fixed} devices but {device_count} are available; expected a "
                                  f"product equal to the device count (or -1 on one axis)")
    return tuple(values)  # type: ignore[return-value]


def resolve_model(config: ConfigDict) -> tuple[TransformerConfig, type]:
    """The ``TransformerConfig`` (preset + set fields + precision) and the model class."""
    preset = _get(config, "model.preset")
    if preset and preset not in PRESETS:
        raise ConfigError("model.preset", f"{preset!r} is not a known preset; expected one of {sorted(PRESETS)} or ''")
    fields = {k: v for k, v in config.model.items() if k not in ("preset", "cls") and v is not None}
    compute = _choice(config, "precision.compute_dtype", COMPUTE_DTYPES)
    if compute == "auto":
        compute = "float32" if jax.default_backend() == "cpu" else "bfloat16"
    fields.update(dtype=compute, param_dtype=_choice(config, "precision.param_dtype", DTYPES),
                  remat=_choice(config, "precision.remat", REMAT_POLICIES))
    scan = _get(config, "precision.scan_layers")
    if not isinstance(scan, bool):
        raise ConfigError("precision.scan_layers", f"{scan!r}: expected true or false")
    fields["scan_layers"] = scan
    try:
        model = get_preset(preset).replace(**fields) if preset else TransformerConfig(**fields)
    except TypeError as exc:  # a required field is missing without a preset
        raise ConfigError("model", f"{exc}; set model.preset or every required field") from None
    except ValueError as exc:
        message = str(exc)
        key = message.split("=")[0].split(" ")[0] if "=" in message.split(" ")[0] else ""
        name = "precision." + {"dtype": "compute_dtype"}.get(key, key) if key in EXECUTION_FIELDS else \
            (f"model.{key}" if key else "model")
        raise ConfigError(name, message) from None
    cls_name = _get(config, "model.cls")
    if cls_name:
        if cls_name not in MODEL_CLASSES:
            raise ConfigError("model.cls", f"{cls_name!r}: expected one of {sorted(MODEL_CLASSES)} or ''")
        cls = MODEL_CLASSES[cls_name]
    else:
        cls = default_model_class(model)
    if cls.__name__ not in ("GPTForCausalLM", "BertForMaskedLM"):
        raise ConfigError("model.cls", f"{cls.__name__} has no pre-training objective here; expected "
                                       "GPTForCausalLM (causal LM) or BertForMaskedLM (masked LM)")
    if (cls.__name__ == "GPTForCausalLM") != model.causal:
        raise ConfigError("model.causal", f"{model.causal} does not fit model.cls={cls.__name__}")
    return model, cls


def resolve(config: ConfigDict, device_count: int | None = None) -> Resolved:
    """Check every value of ``config`` and work out what it means. Raises :class:`ConfigError` naming the key."""
    device_count = jax.device_count() if device_count is None else device_count
    _int(config, "steps", minimum=1)
    _int(config, "seed", minimum=0)
    for key in ("log_every", "keep_checkpoints"):
        _int(config, key, minimum=1)
    for key in ("eval_every", "checkpoint_every", "eval_batches"):
        _int(config, key, minimum=0)  # 0 = only at the end (eval, checkpoint) / the whole split (eval_batches)
    batch = _int(config, "batch_size", minimum=1)
    seq_len = _int(config, "seq_len", minimum=1)
    profile_window(config)

    # optimiser
    _number(config, "optim.lr", low=0.0, low_open=True)
    _choice(config, "optim.schedule", SCHEDULES)
    _int(config, "optim.warmup_steps", minimum=0)  # more than steps: the run ends while warming up
    _number(config, "optim.min_lr_ratio", low=0.0, high=1.0)
    _number(config, "optim.b1", low=0.0, high=1.0, high_open=True)
    _number(config, "optim.b2", low=0.0, high=1.0, high_open=True)
    _number(config, "optim.eps", low=0.0)
    _number(config, "optim.weight_decay", low=0.0)
    _number(config, "optim.grad_clip", low=0.0)
    _number(config, "optim.layer_decay", low=0.0, high=1.0, low_open=True)
    if not isinstance(_get(config, "optim.decay_embeddings"), bool):
        raise ConfigError("optim.decay_embeddings", "expected true or false")
    accum = _int(config, "optim.accum_steps", minimum=1)

    # mesh and batch
    mesh_shape = resolve_mesh(config, device_count)
    batch_axes = mesh_shape[0] * mesh_shape[1]
    if batch % batch_axes:
        raise ConfigError("batch_size", f"{batch} is not divisible by mesh.data x mesh.fsdp = {mesh_shape[0]} x "
                                        f"{mesh_shape[1]} = {batch_axes} (the batch is sharded over both)")
    if batch % accum:
        raise ConfigError("optim.accum_steps", f"{accum} does not divide batch_size={batch}")
    if (batch // accum) % batch_axes:
        raise ConfigError("optim.accum_steps", f"micro-batches of batch_size / accum_steps = {batch // accum} rows "
                                               f"are not divisible by mesh.data x mesh.fsdp = {batch_axes}")
    process_count = jax.process_count()
    if batch % process_count:
        raise ConfigError("batch_size", f"{batch} is not divisible by the {process_count} JAX processes")

    # model
    model, cls = resolve_model(config)
    if model.position in ("learned", "sinusoidal") and seq_len > model.max_position_embeddings:
        raise ConfigError("seq_len", f"{seq_len} exceeds model.max_position_embeddings="
                                     f"{model.max_position_embeddings} of this model's {model.position} positions")

    # data
    objective = "causal" if model.causal else "mlm"
    data_values = dict(config.data)
    given = data_values.get("objective")
    if given and given != objective:
        raise ConfigError("data.objective", f"{given!r} does not fit {cls.__name__}; expected {objective!r}")
    data_values["objective"] = objective
    known = {f.name for f in dataclasses.fields(DataConfig)}
    unknown = sorted(set(data_values) - known)
    if unknown:
        raise ConfigError(f"data.{unknown[0]}", f"not a data pipeline field; expected one of {sorted(known)}")
    if not data_values.get("data_dir"):
        data_values["data_dir"] = ""
    if isinstance(data_values.get("paths"), str):
        data_values["paths"] = (data_values["paths"],)
    try:
        data = DataConfig(**data_values, seq_len=seq_len, batch_size=batch, seed=config.seed, num_epochs=None)
    except ValueError as exc:
        message = str(exc)
        key = message.split("=")[0].split(" ")[0] if "=" in message.split(" ")[0] else ""
        name = key if key in DATA_FIELDS_FROM_TOP else (f"data.{key}" if key else "data")
        raise ConfigError(name, message) from None
    if data.tokenizer in ("bpe", "wordpiece") and data.vocab_size > model.vocab_size:
        raise ConfigError("data.vocab_size", f"{data.vocab_size} is more than model.vocab_size={model.vocab_size}: "
                                             "the model's embedding table needs a row for every token id")
    if objective == "mlm" and data.tokenizer == "bpe":
        raise ConfigError("data.tokenizer", "'bpe' has no [MASK]/[CLS]/[SEP]; masked-LM training needs "
                                            "'wordpiece' (or a path to a tokenizer with those tokens)")

    # sampling
    _int(config, "sample.max_new_tokens", minimum=0)
    _number(config, "sample.temperature", low=0.0)
    _int(config, "sample.top_k", minimum=0)
    return Resolved(model=model, model_cls=cls, data=data, mesh_shape=mesh_shape, objective=objective)


def compilation_cache_dir(config: ConfigDict) -> str | None:
    """Where the persistent compilation cache lives, or None when ``compilation_cache`` is off."""
    if not config.get("compilation_cache", True):
        return None
    return (config.get("compilation_cache_dir") or os.environ.get("FLAXZOO_JAX_CACHE")
            or os.path.join(os.path.expanduser("~"), ".cache", "flaxzoo", "jax"))


def to_json_dict(config: ConfigDict) -> dict[str, Any]:
    """The config as plain JSON-able values (tuples become lists)."""
    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(config.to_dict())
