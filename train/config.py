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
- ``lora.*``: LoRA (``models/adapters/lora.py``, computed by qwix): ``rank`` (0 = off: every parameter trains), ``alpha``
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

Where the pieces live (all importable from here): the checking machinery (``ConfigError``, ``Spec``, ``Section`` ...)
in ``flaxzoo.train.config_checks``; the ``optim`` / ``mesh`` / ``precision`` / ``sample`` / ``lora`` sections and
``RunConfig`` (the keys every task's config shares: the base of :class:`TrainConfig` and of fine-tuning's
``FinetuneConfig``) in ``flaxzoo.train.config_sections``; the ``model`` and ``data`` sections in
``flaxzoo.train.config_model_data``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax
from ml_collections import ConfigDict

from flaxzoo.models import TransformerConfig
from flaxzoo.train.config_checks import (BOOL, TEXT, ConfigError, Section, Spec, checked, choice, integer, names_list,
                                         number, plain_values, reject_unknown_keys, section_dict)
from flaxzoo.train.config_model_data import (DATA_FIELDS_EXCLUDED, DATA_FIELDS_FROM_TOP, EXECUTION_FIELDS,
                                             build_model_config, data_fields, data_from_values, model_fields,
                                             model_from_values, pretrained_model)
from flaxzoo.train.config_sections import (SCHEDULES, LoraSettings, MeshConfig, OptimConfig, PrecisionConfig,
                                           RunConfig, SampleConfig, compilation_cache_path, execution_defaults)
from flaxzoo.train.data import DataConfig

__all__ = [  # the names other modules import from here, wherever they are defined
    "BOOL", "DATA_FIELDS_EXCLUDED", "DATA_FIELDS_FROM_TOP", "EXECUTION_FIELDS", "PRETRAINING_CLASSES", "SCHEDULES",
    "TEXT", "ConfigError", "LoraSettings", "MeshConfig", "OptimConfig", "PrecisionConfig", "SampleConfig", "Section",
    "RunConfig", "Spec", "TrainConfig", "base_config", "checked", "choice", "compilation_cache_path", "data_fields",
    "data_from_values", "execution_defaults", "integer", "model_fields", "model_from_values", "names_list",
    "number", "pretrained_model", "reject_unknown_keys", "section_dict"]

PRETRAINING_CLASSES = {"GPTForCausalLM": "causal", "BertForMaskedLM": "mlm"}
# What each model class's ``task`` pre-trains with (ModernBertForMaskedLM is a masked LM as BertForMaskedLM is).
PRETRAINING_TASKS = {"causal_lm": "causal", "masked_lm": "mlm"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig(RunConfig):
    """The whole, checked training config: what the loop reads (``cfg.steps``, ``cfg.optim.accum_steps``, ...).

    ``model`` is the resolved ``TransformerConfig`` (preset, set fields, and the execution fields of ``precision``),
    ``model_cls`` its class, ``data`` the ``DataConfig`` of the pipeline (``seq_len``, ``batch_size``, ``seed`` from
    the top level, ``objective`` from the model), ``mesh`` the resolved mesh shape, ``objective`` "causal" or "mlm".
    """

    data: DataConfig
    model: TransformerConfig
    model_cls: type
    sample: SampleConfig
    steps: int = checked(1000, integer(1))
    eval_batches: int = checked(0, integer(0, note="(validation batches per evaluation; 0 = the whole split)"))
    seq_len: int = checked(128, integer(1))
    eval_at_start: bool = checked(False, BOOL)
    objective: str = dataclasses.field(init=False, default="causal")  # from the model: "causal" | "mlm"

    SECTIONS: ClassVar[tuple[str, ...]] = (*RunConfig.SECTIONS, "data", "model", "sample")

    def __post_init__(self) -> None:
        object.__setattr__(self, "objective", "causal" if self.model.causal else "mlm")
        if not self.precision.resolved:
            object.__setattr__(self, "precision", self.precision.resolve(jax.default_backend(),
                                                                          self.model.num_layers))
        execution = self.precision.model_fields()
        if any(getattr(self.model, k) != v for k, v in execution.items()):
            object.__setattr__(self, "model", build_model_config(self.model.replace, execution))
        if self.precision.loss_chunk == "auto":
            object.__setattr__(self, "precision", self.precision.with_loss_chunk(*self.loss_shape()))
        super().__post_init__()

    def loss_shape(self) -> tuple[int, int, int]:
        """``(rows, positions, vocab)`` of the logits one device holds for the loss: a micro-batch's rows over
        ``mesh.data`` x ``mesh.fsdp``, the scored positions per row (``seq_len``; a masked LM's ``predictions``) and
        the padded vocabulary over ``mesh.tensor`` (where it divides)."""
        rows = self.batch_size // self.optim.accum_steps // self.mesh.batch_axes
        positions = self.seq_len if self.objective == "causal" else self.data.predictions
        vocab, tensor = self.model.padded_vocab_size, self.mesh.tensor
        return max(rows, 1), positions, vocab // tensor if vocab % tensor == 0 else vocab

    def _validate(self) -> None:
        if self.lora.enabled and not self.init_from:
            raise ConfigError("lora.rank", f"{self.lora.rank}: LoRA adapts a pretrained model, but init_from is "
                                           "empty; set init_from to the base (a Hugging Face directory, a GGUF file, a "
                                           "flaxzoo work directory)")
        if not self.mesh.resolved:
            raise ConfigError("mesh", f"{self.mesh.shape}: expected resolved axis sizes (MeshConfig.resolve)")
        batch, accum, axes = self.batch_size, self.optim.accum_steps, self.mesh.batch_axes
        self.check_rows("batch_size", batch)
        if batch % accum:
            raise ConfigError("optim.accum_steps", f"{accum} does not divide batch_size={batch}")
        if (batch // accum) % axes:
            raise ConfigError("optim.accum_steps", f"{accum}: micro-batches of batch_size / accum_steps = "
                                                   f"{batch // accum} rows are not divisible by mesh.data x "
                                                   f"mesh.fsdp = {axes}")
        model, cls_name = self.model, self.model_cls.__name__
        task_objective = PRETRAINING_TASKS.get(getattr(self.model_cls, "task", None))
        if task_objective is None:
            raise ConfigError("model.cls", f"{cls_name!r} has no pre-training objective here; expected "
                                           "a causal LM (GPTForCausalLM) or a masked LM (BertForMaskedLM, "
                                           "ModernBertForMaskedLM)")
        if task_objective != self.objective:
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
        values = config.to_dict() if isinstance(config, ConfigDict) else plain_values(dict(config))
        device_count = jax.device_count() if device_count is None else device_count
        backend = jax.default_backend() if backend is None else backend
        top = cls.top_level(values)  # the scalars first: their specs, as __post_init__ checks them again
        for section in cls.SECTIONS:
            if not isinstance(values.get(section), Mapping):
                raise ConfigError(section, f"{values.get(section)!r}: expected a section of keys "
                                           "(flaxzoo.train.config.base_config() has them all)")

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
        model = build_model_config(model.replace, precision.model_fields())
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
            out[f.name] = plain_values(value)
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


def accelerator_config(*, batch_size: int, seq_len: int, lr: float, remat: str = "dots",
                       mesh: tuple[int, int, int] = (1, -1, 1)) -> ConfigDict:
    """``base_config`` with the long pre-training run the accelerator configs share: 10,000 steps, a log line every
    10, an evaluation (20 batches) and a checkpoint every 1,000, AdamW with weight decay 0.1 after 500 warm-up
    steps, ``mesh`` = (data, fsdp, tensor) sizes (default: FSDP over every device), a sample after "The". The model,
    the data and any other optimizer choice are the config's own."""
    c = base_config()
    c.steps, c.log_every, c.eval_every, c.eval_batches, c.checkpoint_every = 10000, 10, 1000, 20, 1000
    c.batch_size, c.seq_len = batch_size, seq_len
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = mesh
    c.optim.lr, c.optim.warmup_steps, c.optim.weight_decay = lr, 500, 0.1
    c.precision.remat = remat
    c.sample.prompt = "The"
    return c
