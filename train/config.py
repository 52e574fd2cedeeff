"""The training config: an ``ml_collections.ConfigDict`` (``configs/*.py`` + ``--config.KEY=VALUE``) turned, once and
before any work, into one frozen, typed, validated :class:`TrainConfig`.

Public, stable keys (``--config.KEY=VALUE`` on the command line):

- ``steps``, ``seed``, ``log_every``, ``eval_every``, ``eval_batches``, ``eval_at_start`` (evaluate before the first
  step too: the starting point of a fine-tune), ``checkpoint_every``, ``keep_checkpoints``
- ``batch_size`` (global, all micro-batches of a step), ``seq_len``
- ``mesh.data``, ``mesh.fsdp``, ``mesh.tensor``: the device mesh; one of them may be −1 (fills the remaining devices)
- ``optim.*``: ``lr``, ``schedule`` (cosine | linear | constant), ``warmup_steps``, ``min_lr_ratio``, ``b1``, ``b2``,
  ``eps``, ``weight_decay``, ``decay_embeddings``, ``grad_clip`` (0 = off), ``accum_steps`` (micro-batches per step),
  ``layer_decay`` (layer-wise LR decay factor, 1 = off)
- ``precision.*``: ``compute_dtype`` (auto | float32 | bfloat16; auto = bfloat16 on GPU/TPU, float32 on CPU; float16
  is refused), ``param_dtype`` (float32: the master weights; ``flaxzoo.train.precision`` has the rules), ``remat`` (auto | none | full | dots), ``scan_layers`` (auto | true | false); auto is
  decided by :func:`execution_defaults` from the backend and the depth
- ``model.*``: ``preset`` (a name from ``models.PRESETS`` or ""), ``cls`` (a model class name or "" for the
  config's language model), and every architecture field of ``TransformerConfig``; unset fields (None) take the
  preset's value
- ``data.*``: the fields of ``flaxzoo.train.data.DataConfig`` except ``seq_len``, ``batch_size`` and ``seed`` (taken from the
  top level) and ``num_epochs`` (training repeats the data); ``data.objective`` "" follows the model (causal for a
  decoder, mlm for an encoder)
- ``sample.*``: ``prompt``, ``max_new_tokens``, ``temperature``, ``top_k`` (0 = off)
- ``compilation_cache`` (bool), ``compilation_cache_dir`` ("" = ``$FLAXZOO_JAX_CACHE`` or ``~/.cache/flaxzoo/jax``)
- ``profile_steps``: "a:b" traces steps a..b into ``WORKDIR/profile``; "" = none
- ``init_from``: start from pretrained weights instead of a random initialisation: a Hugging Face directory, a GGUF
  file, a flaxzoo work directory or a Hub id (``models.from_pretrained``'s sources). The model is the source's (the
  ``model`` section must then set nothing but ``cls``), and ``data.tokenizer`` ("bpe" / "wordpiece": train one)
  becomes the source's tokenizer. The checkpoints record the source's path and fingerprint.
- ``lora.*``: LoRA (``models/lora.py``, computed by qwix): ``rank`` (0 = off: every parameter trains), ``alpha``
  (updates scaled by alpha / rank), ``targets`` (comma-separated: ``attention``, ``mlp``, ``query`` ... ``down``,
  ``head``, or module-path regular expressions), ``base_dtype`` (float32 | bfloat16 | int8: the frozen base weights),
  ``train_fully`` (comma-separated modules trained in full beside the adapters, as PEFT's ``modules_to_save``; e.g.
  ``head``). The base weights get no gradients and no optimizer state; checkpoints hold the adapters only (plus
  ``train_fully``'s parameters) and the base's reference (``init_from`` and its fingerprint)

:meth:`TrainConfig.from_config_dict` builds the typed config or raises :class:`ConfigError` naming the dotted key, the
value and what was expected; it needs only the device count, so a bad value stops the run before any data
preparation or compilation. Each field is checked in one place: its :class:`Spec` (the metadata of the dataclass
field, checked in ``__post_init__``), the section's ``_validate`` for checks across fields of one section, and
:meth:`TrainConfig._validate` for checks across sections. The model and data sections are the frozen dataclasses of
their packages (``TransformerConfig``, ``DataConfig``), validated by their own constructors; their errors are mapped
to ``model.FIELD`` / ``data.FIELD`` by the field they name (an exception's ``field`` attribute), never by parsing
the message. The defaults of :func:`base_config` are the dataclasses' defaults.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from typing import Any, ClassVar, Mapping

import jax
from ml_collections import ConfigDict, FieldReference
from ml_collections.config_dict import placeholder

from flaxzoo.models import PRESETS, TransformerConfig, get_preset
from flaxzoo.models.lora import BASE_DTYPES as LORA_BASE_DTYPES, LoraConfig, LoraError
from flaxzoo.models.config import DTYPES, REMAT_POLICIES
from flaxzoo.models.families import FAMILIES, default_model_class, model_classes
from flaxzoo.train.data import DataConfig
from flaxzoo.train.precision import training_precision_error

# TransformerConfig fields set by precision.* (how to run), not model.* (what the model is).
EXECUTION_FIELDS = {"dtype": "compute_dtype", "param_dtype": "param_dtype", "remat": "remat",
                    "scan_layers": "scan_layers"}
# DataConfig fields that come from the top level or do not apply to training.
DATA_FIELDS_FROM_TOP = ("seq_len", "batch_size", "seed")
DATA_FIELDS_EXCLUDED = ("num_epochs",)
SCHEDULES = ("cosine", "linear", "constant")
PRETRAINING_CLASSES = {"GPTForCausalLM": "causal", "BertForMaskedLM": "mlm"}


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
    return Spec("int", low=minimum, **kw)


def number(low: float = -math.inf, high: float = math.inf, **kw: Any) -> Spec:
    return Spec("number", low=low, high=high, **kw)


def choice(*choices: Any, **kw: Any) -> Spec:
    return Spec("choice", choices=choices, **kw)


BOOL, TEXT = Spec("bool"), Spec("str")


def checked(default: Any, spec: Spec | None, **kw: Any) -> Any:
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
        pass

    @classmethod
    def key(cls, name: str) -> str:
        return f"{cls.SECTION}.{name}" if cls.SECTION else name

    @classmethod
    def keys(cls) -> list[str]:
        """The user's keys of this section (fields with a spec)."""
        return [f.name for f in dataclasses.fields(cls) if "spec" in f.metadata]  # type: ignore[arg-type]

    @classmethod
    def from_values(cls, values: Mapping[str, Any], **fixed: Any):
        """The section from ``values`` (missing keys take the defaults); an unknown key is an error naming it."""
        _no_unknown(cls.SECTION, values, cls.keys())
        return cls(**values, **fixed)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {f.name: f.default for f in dataclasses.fields(cls) if "spec" in f.metadata}  # type: ignore


def _no_unknown(section: str, values: Mapping[str, Any], known: typing.Iterable[str]) -> None:
    known = sorted(known)
    unknown = sorted(set(values) - set(known))
    if unknown:
        key = f"{section}.{unknown[0]}" if section else unknown[0]
        raise ConfigError(key, f"unknown key (value {values[unknown[0]]!r}); expected one of {known}")


# ======================================================================================================== sections
@dataclasses.dataclass(frozen=True)
class OptimConfig(Section):
    """``optim.*``: AdamW, its schedule, clipping, accumulation, layer-wise LR decay (``train/optim.py``)."""

    SECTION: ClassVar[str] = "optim"
    lr: float = checked(1e-3, number(0.0, low_open=True))
    schedule: str = checked("cosine", choice(*SCHEDULES))
    warmup_steps: int = checked(100, integer(0, note="(more than steps: the run ends while warming up)"))
    min_lr_ratio: float = checked(0.1, number(0.0, 1.0))
    b1: float = checked(0.9, number(0.0, 1.0, high_open=True))
    b2: float = checked(0.95, number(0.0, 1.0, high_open=True))
    eps: float = checked(1e-8, number(0.0))
    weight_decay: float = checked(0.1, number(0.0))
    decay_embeddings: bool = checked(False, BOOL)
    grad_clip: float = checked(1.0, number(0.0, note="(0 = off)"))
    accum_steps: int = checked(1, integer(1))
    layer_decay: float = checked(1.0, number(0.0, 1.0, low_open=True, note="(1 = off)"))


MESH_AXIS = integer(1, also=(-1,), note="(-1: fill the remaining devices)")


@dataclasses.dataclass(frozen=True)
class MeshConfig(Section):
    """``mesh.*`` resolved: the size of each mesh axis (no −1 left). Built by :meth:`resolve`."""

    SECTION: ClassVar[str] = "mesh"
    data: int = checked(-1, MESH_AXIS)
    fsdp: int = checked(1, MESH_AXIS)
    tensor: int = checked(1, MESH_AXIS)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.data, self.fsdp, self.tensor

    @property
    def batch_axes(self) -> int:
        """The devices a batch is split over (``data x fsdp``)."""
        return self.data * self.fsdp

    @property
    def resolved(self) -> bool:
        return -1 not in self.shape

    @classmethod
    def resolve(cls, values: Mapping[str, Any] | "MeshConfig", device_count: int) -> "MeshConfig":
        """``(data, fsdp, tensor)`` with a −1 replaced by what fills ``device_count``."""
        given = cls.from_values(values) if not isinstance(values, MeshConfig) else values
        sizes = dataclasses.asdict(given)
        fill = [k for k, v in sizes.items() if v == -1]
        if len(fill) > 1:
            raise ConfigError(cls.key(fill[1]), f"-1 is given for {[cls.key(k) for k in fill]}: at most one mesh "
                                                "axis can fill the remaining devices")
        fixed = math.prod(v for v in sizes.values() if v != -1)
        if fill:
            if device_count % fixed:
                raise ConfigError(cls.key(fill[0]), f"-1 cannot fill the mesh: {device_count} devices are not "
                                                    f"divisible by the other axes' product {fixed}")
            sizes[fill[0]] = device_count // fixed
        elif fixed != device_count:
            shape = {cls.key(k): v for k, v in sizes.items()}
            raise ConfigError("mesh", f"{shape} spans {fixed} devices but {device_count} are available; expected a "
                                      f"product equal to the device count (or -1 on one axis)")
        return cls(**sizes)


def execution_defaults(backend: str, num_layers: int) -> tuple[str, bool]:
    """``(remat, scan_layers)`` that ``precision.remat`` / ``precision.scan_layers`` = "auto" stand for.

    - CPU, ``num_layers >= 4``: ``("dots", True)``. Measured on the default job (4 layers of 128, seq 128, batch 16)
      on a 2-core AMD EPYC: 9,365 tokens/s with remat none and unrolled layers, 10,717 with dots + scan; scan
      without remat was 8,854 (so the gain is the pair, not the scan alone).
    - CPU, fewer layers: ``("none", False)``: unrolled, no remat (the tiny test models; nothing measured to beat it).
    - accelerators (``gpu``, ``tpu``, ...): ``("none", True)``: one compiled layer body. ``"none"`` is where the
      search starts: with ``precision.remat="auto"`` the trainer compiles the step with ``none``, ``dots`` and
      ``full`` in turn and runs the first that fits the device memory (``flaxzoo.train.program.choose_remat``).

    Only the backend and the depth enter, so a resumed run on the same backend resolves the same way (a checkpoint
    records ``scan_layers``; resuming it with the other layout is refused with a message).
    """
    if backend == "cpu":
        return ("dots", True) if num_layers >= 4 else ("none", False)
    return "none", True


@dataclasses.dataclass(frozen=True)
class PrecisionConfig(Section):
    """``precision.*``: how the model runs (compute / parameter dtypes, remat, scan over layers). "auto" values are
    replaced by :meth:`resolve`; :class:`TrainConfig` holds the resolved ones and ``auto`` names those that were
    "auto"."""

    SECTION: ClassVar[str] = "precision"
    compute_dtype: str = checked("auto", choice(*DTYPES, also=("auto",),
                                               note="(auto: bfloat16 on GPU / TPU, float32 on CPU)"))
    param_dtype: str = checked("float32", choice(*DTYPES))
    remat: str = checked("auto", choice(*REMAT_POLICIES, also=("auto",)))
    scan_layers: Any = checked("auto", Spec("bool", also=("auto",)))
    # Positions per cross-entropy chunk: the logits exist one [batch, chunk, vocab] piece at a time (flaxzoo.train.step).
    loss_chunk: int = checked(0, integer(0, note="(0 = the whole sequence at once)"))
    auto: tuple[str, ...] = checked((), None)

    def _validate(self) -> None:
        refused = training_precision_error(self.compute_dtype, self.param_dtype)
        if refused is not None:
            raise ConfigError(f"precision.{refused[0]}", refused[1])

    def resolve(self, backend: str, num_layers: int) -> "PrecisionConfig":
        """The same settings with every "auto" decided for ``backend`` and ``num_layers``."""
        remat, scan = execution_defaults(backend, num_layers)
        decided = {"compute_dtype": "float32" if backend == "cpu" else "bfloat16", "remat": remat,
                   "scan_layers": scan}
        auto = tuple(k for k in decided if getattr(self, k) == "auto" and isinstance(getattr(self, k), str))
        return dataclasses.replace(self, **{k: decided[k] for k in auto}, auto=tuple(sorted({*self.auto, *auto})))

    @property
    def resolved(self) -> bool:
        return "auto" not in (self.compute_dtype, self.remat, self.scan_layers)

    def model_fields(self) -> dict[str, Any]:
        """The ``TransformerConfig`` execution fields these settings give."""
        return {"dtype": self.compute_dtype, "param_dtype": self.param_dtype, "remat": self.remat,
                "scan_layers": self.scan_layers}

    def describe(self, name: str) -> str:
        return f"{getattr(self, name)}{' (auto)' if name in self.auto else ''}"


@dataclasses.dataclass(frozen=True)
class SampleConfig(Section):
    """``sample.*``: the sample printed at each evaluation."""

    SECTION: ClassVar[str] = "sample"
    prompt: str = checked("The ", TEXT)
    max_new_tokens: int = checked(48, integer(0, note="(0 = no sample)"))
    temperature: float = checked(0.8, number(0.0))
    top_k: int = checked(40, integer(0, note="(0 = off)"))


def names_list(text: str) -> tuple[str, ...]:
    """``"a, b,c"`` → ``("a", "b", "c")`` (empty items dropped)."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


@dataclasses.dataclass(frozen=True)
class LoraSettings(Section):
    """``lora.*``: low-rank adapters on the frozen model (``flaxzoo.models.lora``); ``rank`` 0 = off."""

    SECTION: ClassVar[str] = "lora"
    rank: int = checked(0, integer(0, note="(0 = off: every parameter trains)"))
    alpha: float = checked(16.0, number(0.0, low_open=True))
    targets: str = checked("attention,mlp", TEXT)
    base_dtype: str = checked("float32", choice(*LORA_BASE_DTYPES))
    train_fully: str = checked("", TEXT)

    def _validate(self) -> None:
        if self.rank == 0:
            changed = [k for k, v in self.defaults().items() if k != "rank" and getattr(self, k) != v]
            if changed:
                raise ConfigError("lora.rank", f"0 turns LoRA off, but lora.{changed[0]} is set "
                                               f"({getattr(self, changed[0])!r}); set lora.rank >= 1 to use LoRA")
            return
        self.spec()

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def spec(self) -> LoraConfig | None:
        """The ``flaxzoo.models.lora.LoraConfig`` (None when off); its errors are reported on ``lora.FIELD``."""
        if not self.enabled:
            return None
        try:
            return LoraConfig(rank=self.rank, alpha=self.alpha, targets=names_list(self.targets),
                              base_dtype=self.base_dtype)
        except LoraError as exc:
            raise ConfigError(f"lora.{exc.field}", str(exc)) from None

    @property
    def fully_trained(self) -> tuple[str, ...]:
        return names_list(self.train_fully)


@dataclasses.dataclass(frozen=True)
class TrainConfig(Section):
    """The whole, checked training config: what the loop reads (``cfg.steps``, ``cfg.optim.accum_steps``, ...).

    ``model`` is the resolved ``TransformerConfig`` (preset, set fields, and the execution fields of ``precision``),
    ``model_cls`` its class, ``data`` the ``DataConfig`` of the pipeline (``seq_len``, ``batch_size``, ``seed`` from
    the top level, ``objective`` from the model), ``mesh`` the resolved mesh shape, ``objective`` "causal" or "mlm".
    """

    optim: OptimConfig
    mesh: MeshConfig
    precision: PrecisionConfig
    data: DataConfig
    model: TransformerConfig
    model_cls: type
    sample: SampleConfig
    lora: LoraSettings = dataclasses.field(default_factory=LoraSettings)
    steps: int = checked(1000, integer(1))
    seed: int = checked(0, integer(0))
    log_every: int = checked(10, integer(1))
    eval_every: int = checked(200, integer(0, note="(0 = only at the end)"))
    eval_batches: int = checked(0, integer(0, note="(validation batches per evaluation; 0 = the whole split)"))
    checkpoint_every: int = checked(200, integer(0, note="(0 = only at the end)"))
    keep_checkpoints: int = checked(3, integer(1))
    batch_size: int = checked(16, integer(1))
    seq_len: int = checked(128, integer(1))
    compilation_cache: bool = checked(True, BOOL)
    compilation_cache_dir: str = checked("", TEXT)
    profile_steps: tuple[int, int] | None = checked("", Spec("window"))
    init_from: str = checked("", TEXT)
    eval_at_start: bool = checked(False, BOOL)
    objective: str = dataclasses.field(init=False, default="causal")  # from the model: "causal" | "mlm"

    SECTIONS: ClassVar[dict[str, type]] = {"optim": OptimConfig, "mesh": MeshConfig, "precision": PrecisionConfig,
                                           "data": DataConfig, "model": TransformerConfig, "sample": SampleConfig,
                                           "lora": LoraSettings}

    def __post_init__(self) -> None:
        object.__setattr__(self, "objective", "causal" if self.model.causal else "mlm")
        if not self.precision.resolved:
            object.__setattr__(self, "precision", self.precision.resolve(jax.default_backend(),
                                                                          self.model.num_layers))
        execution = self.precision.model_fields()
        if any(getattr(self.model, k) != v for k, v in execution.items()):
            object.__setattr__(self, "model", _build_model(self.model.replace, execution))
        super().__post_init__()

    def _validate(self) -> None:
        if self.lora.enabled and not self.init_from:
            raise ConfigError("lora.rank", f"{self.lora.rank}: LoRA adapts a pretrained model, but init_from is "
                                           "empty; set init_from to the base (a Hugging Face directory, a GGUF file, a "
                                           "flaxzoo work directory)")
        if not self.mesh.resolved:
            raise ConfigError("mesh", f"{self.mesh.shape}: expected resolved axis sizes (MeshConfig.resolve)")
        batch, accum, axes = self.batch_size, self.optim.accum_steps, self.mesh.batch_axes
        if batch % axes:
            raise ConfigError("batch_size", f"{batch} is not divisible by mesh.data x mesh.fsdp = {self.mesh.data} x "
                                            f"{self.mesh.fsdp} = {axes} (the batch is sharded over both)")
        if batch % accum:
            raise ConfigError("optim.accum_steps", f"{accum} does not divide batch_size={batch}")
        if (batch // accum) % axes:
            raise ConfigError("optim.accum_steps", f"{accum}: micro-batches of batch_size / accum_steps = "
                                                   f"{batch // accum} rows are not divisible by mesh.data x "
                                                   f"mesh.fsdp = {axes}")
        model, cls_name = self.model, self.model_cls.__name__
        if cls_name not in PRETRAINING_CLASSES:
            raise ConfigError("model.cls", f"{cls_name!r} has no pre-training objective here; expected "
                                           "GPTForCausalLM (causal LM) or BertForMaskedLM (masked LM)")
        if PRETRAINING_CLASSES[cls_name] != self.objective:
            raise ConfigError("model.causal", f"{model.causal} does not fit model.cls={cls_name!r}")
        if model.position in ("learned", "sinusoidal") and self.seq_len > model.max_position_embeddings:
            raise ConfigError("seq_len", f"{self.seq_len} exceeds model.max_position_embeddings="
                                         f"{model.max_position_embeddings} of this model's {model.position} positions")
        data = self.data
        for name in DATA_FIELDS_FROM_TOP:
            if getattr(data, name) != getattr(self, name):
                raise ConfigError(f"data.{name}", f"{getattr(data, name)!r} differs from {name}="
                                                  f"{getattr(self, name)!r}; expected the top-level value")
        if data.objective != self.objective:
            raise ConfigError("data.objective", f"{data.objective!r} does not fit {cls_name}; expected "
                                                f"{self.objective!r} (or '' to follow the model)")
        if data.tokenizer in ("bpe", "wordpiece") and data.vocab_size > model.vocab_size:
            raise ConfigError("data.vocab_size", f"{data.vocab_size} is more than model.vocab_size="
                                                 f"{model.vocab_size}: the model's embedding table needs a row for "
                                                 "every token id")
        if self.objective == "mlm" and data.tokenizer == "bpe":
            raise ConfigError("data.tokenizer", "'bpe' has no [MASK]/[CLS]/[SEP]; masked-LM training needs "
                                                "'wordpiece' (or a path to a tokenizer with those tokens)")

    # ---------------------------------------------------------------------------------------------------- build
    @classmethod
    def from_config_dict(cls, config: ConfigDict | Mapping[str, Any], device_count: int | None = None, *,
                         backend: str | None = None) -> "TrainConfig":
        """Check every value of ``config`` and work out what it means. Raises :class:`ConfigError` naming the key.

        ``device_count`` (default: all devices) fills a −1 mesh axis; ``backend`` (default ``jax.default_backend()``)
        decides the "auto" precision settings. (Any number of processes divides any batch: each process loads the
        rows its devices hold, ``flaxzoo.train.sharding.BatchPlacement``.)
        """
        values = config.to_dict() if isinstance(config, ConfigDict) else _plain(dict(config))
        device_count = jax.device_count() if device_count is None else device_count
        backend = jax.default_backend() if backend is None else backend
        _no_unknown("", values, [*cls.keys(), *cls.SECTIONS])
        for section in cls.SECTIONS:
            if not isinstance(values.get(section), Mapping):
                raise ConfigError(section, f"{values.get(section)!r}: expected a section of keys "
                                           "(flaxzoo.train.config.base_config() has them all)")
        top = {name: values[name] for name in cls.keys() if name in values}
        for name, value in top.items():  # the scalars first: their specs, as __post_init__ checks them again
            cls.__dataclass_fields__[name].metadata["spec"].check(name, value)

        optim = OptimConfig.from_values(values["optim"])
        mesh = MeshConfig.resolve(values["mesh"], device_count)
        precision = PrecisionConfig.from_values(values["precision"])
        if top.get("init_from"):
            model, model_cls = pretrained_model(top["init_from"], values["model"])
            if values["data"].get("tokenizer", "bpe") in ("bpe", "wordpiece"):
                values["data"] = {**values["data"], "tokenizer": top["init_from"]}
        else:
            model, model_cls = model_from_values(values["model"])
        precision = precision.resolve(backend, model.num_layers)
        model = _build_model(model.replace, precision.model_fields())
        objective = "causal" if model.causal else "mlm"
        data = data_from_values(values["data"], objective=objective,
                                **{k: top.get(k, cls.__dataclass_fields__[k].default) for k in DATA_FIELDS_FROM_TOP})
        sample = SampleConfig.from_values(values["sample"])
        lora = LoraSettings.from_values(values.get("lora", {}))
        return cls(optim=optim, mesh=mesh, precision=precision, data=data, model=model, model_cls=model_cls,
                   sample=sample, lora=lora, **top)

    # ------------------------------------------------------------------------------------------------- readers
    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def cache_dir(self) -> str | None:
        """Where the persistent compilation cache lives, or None when ``compilation_cache`` is off."""
        return compilation_cache_path(self.compilation_cache, self.compilation_cache_dir)

    def to_json_dict(self) -> dict[str, Any]:
        """The config as plain JSON-able values (what a checkpoint's meta keeps): sections as dicts, the model
        class by name, tuples as lists."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "model_cls":
                value = value.__name__
            elif dataclasses.is_dataclass(value):
                value = dataclasses.asdict(value)
            out[f.name] = _plain(value)
        return out


def compilation_cache_path(enabled: bool, directory: str) -> str | None:
    """The persistent compilation cache's directory: ``directory``, else ``$FLAXZOO_JAX_CACHE``, else
    ``~/.cache/flaxzoo/jax``; None when ``enabled`` is false."""
    if not enabled:
        return None
    return (directory or os.environ.get("FLAXZOO_JAX_CACHE")
            or os.path.join(os.path.expanduser("~"), ".cache", "flaxzoo", "jax"))


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ================================================================================================ model and data
def _field_of(exc: Exception) -> str | None:
    """The field a constructor's error is about: the ``field`` of a ``flaxzoo.models.config.FieldError`` (which
    ``TransformerConfig`` and ``DataConfig`` raise), None for another error (e.g. a missing required field)."""
    return getattr(exc, "field", None)


def _build_model(build: typing.Callable[..., TransformerConfig], fields: dict[str, Any]) -> TransformerConfig:
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
    from flaxzoo.models.hub.sources import open_source

    _no_unknown("model", values, ["preset", "cls", *(f.name for f in dataclasses.fields(TransformerConfig))])
    set_fields = [k for k, v in values.items() if k != "cls" and v not in (None, "")]
    if set_fields:
        raise ConfigError(f"model.{set_fields[0]}", f"{values[set_fields[0]]!r}: with init_from the model is the "
                                                    f"checkpoint's ({source}); leave the model section unset "
                                                    "(model_fields() with no arguments)")
    try:
        config, stored_cls = open_source(source).describe()
    except (OSError, ValueError) as exc:
        raise ConfigError("init_from", f"{source!r}: {exc}") from None
    cls_name = values.get("cls") or stored_cls.__name__
    if cls_name not in model_classes():
        raise ConfigError("model.cls", f"{cls_name!r}: expected one of {sorted(model_classes())} or ''")
    return config, model_classes()[cls_name]


def model_from_values(values: Mapping[str, Any]) -> tuple[TransformerConfig, type]:
    """The ``TransformerConfig`` of a ``model`` section (preset + set fields, default execution fields) and the
    model class."""
    arch = [f.name for f in dataclasses.fields(TransformerConfig) if f.name not in EXECUTION_FIELDS]
    _no_unknown("model", values, ["preset", "cls", *arch])
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
    model = _build_model(get_preset(preset).replace if preset else TransformerConfig, fields)
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
    _no_unknown("data", values, known)
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


def section_dict(cls: type[Section]) -> ConfigDict:
    out = ConfigDict()
    for name, value in cls.defaults().items():
        spec = cls.__dataclass_fields__[name].metadata["spec"]
        mixed = spec.kind == "bool" and bool(spec.also)  # "auto" or true / false: any type parses
        out[name] = FieldReference(value, field_type=object) if mixed else value
    return out


def base_config() -> ConfigDict:
    """Every key with its default (the typed sections' defaults); ``configs/*.py`` start from this and change what
    they need."""
    c = ConfigDict()
    for name, value in TrainConfig.defaults().items():
        c[name] = value
    c.mesh = section_dict(MeshConfig)
    c.optim = section_dict(OptimConfig)
    c.precision = section_dict(PrecisionConfig)
    c.model = model_fields("gpt2-tiny")
    c.data = data_fields()
    c.sample = section_dict(SampleConfig)
    c.lora = section_dict(LoraSettings)
    return c
