"""The sections of the training config besides the model and the data: ``optim.*`` (:class:`OptimConfig`),
``mesh.*`` (:class:`MeshConfig`), ``precision.*`` (:class:`PrecisionConfig`, "auto" decided by
:func:`execution_defaults`), ``sample.*`` (:class:`SampleConfig`) and ``lora.*`` (:class:`LoraSettings`).

Each is a :class:`~flaxzoo.train.config_checks.Section`: its fields check themselves at construction. Pre-training's
:class:`~flaxzoo.train.config.TrainConfig` holds them all; fine-tuning (``flaxzoo.train.finetune.config``) reuses
``optim``, ``mesh`` and ``lora``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, ClassVar, Mapping

from flaxzoo.models.config import DTYPES, REMAT_POLICIES
from flaxzoo.models.adapters.lora import BASE_DTYPES as LORA_BASE_DTYPES, LoraConfig, LoraError
from flaxzoo.train.config_checks import (BOOL, TEXT, ConfigError, Section, Spec, checked, choice, integer,
                                         names_list, number, reject_unknown_keys)
from flaxzoo.train.precision import training_precision_error

SCHEDULES = ("cosine", "linear", "constant")


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


LOSS_CHUNK_BYTES = 256 * 2**20


def auto_loss_chunk(rows: int, positions: int, vocab: int, budget: int = LOSS_CHUNK_BYTES) -> int:
    """Positions per cross-entropy chunk for ``rows`` rows per device of ``positions`` scored positions with
    ``vocab`` logits each: 0 (the whole sequence in one piece) when its float32 logits ``[rows, positions, vocab]``
    fit in ``budget`` bytes, else the largest power of two of positions whose logits do (at least 1).

    GPT-2's 50,304 logits at 8 rows of 1024 per device: 1.5 GiB at once, chunks of 128 (0.2 GiB); Llama 3's 128,256
    at 8 rows of 2048: 7.8 GiB, chunks of 64; a CPU run's 8,000-token vocabulary at 16 rows of 128: 62 MiB, one
    piece."""
    per_position = 4 * max(rows, 1) * vocab
    if per_position * positions <= budget:
        return 0
    fitting = max(1, budget // per_position)
    return 1 << (fitting.bit_length() - 1)


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
    # Positions per cross-entropy chunk: the logits exist one [batch, chunk, vocab] piece at a time (flaxzoo.train.losses);
    # auto: from the vocabulary and the rows per device (:func:`auto_loss_chunk`).
    loss_chunk: Any = checked("auto", Spec("int", low=0, also=("auto",),
                                           note="(0 = the whole sequence at once; auto: float32 logits of at most "
                                                f"{LOSS_CHUNK_BYTES // 2**20} MiB per device at a time)"))
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

    def with_loss_chunk(self, rows: int, positions: int, vocab: int) -> "PrecisionConfig":
        """The same settings with ``loss_chunk="auto"`` decided for ``rows`` rows per device, ``positions`` scored
        positions per row and ``vocab`` logits per position on a device (:func:`auto_loss_chunk`)."""
        if self.loss_chunk != "auto":
            return self
        return dataclasses.replace(self, loss_chunk=auto_loss_chunk(rows, positions, vocab),
                                   auto=tuple(sorted({*self.auto, "loss_chunk"})))

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


@dataclasses.dataclass(frozen=True)
class LoraSettings(Section):
    """``lora.*``: low-rank adapters on the frozen model (``flaxzoo.models.adapters.lora``); ``rank`` 0 = off."""

    SECTION: ClassVar[str] = "lora"
    rank: int = checked(0, integer(0, note="(0 = off: every parameter trains)"))
    alpha: float = checked(16.0, number(0.0, low_open=True))
    targets: str = checked("attention,mlp", TEXT)
    base_dtype: str = checked("float32", choice(*LORA_BASE_DTYPES))
    train_fully: str = checked("", TEXT)

    def _validate(self) -> None:
        if self.rank == 0:
            changed = [f.name for f in dataclasses.fields(self)
                       if f.name != "rank" and getattr(self, f.name) != f.default]
            if changed:
                raise ConfigError("lora.rank", f"0 turns LoRA off, but lora.{changed[0]} is set "
                                               f"({getattr(self, changed[0])!r}); set lora.rank >= 1 to use LoRA")
            return
        self.spec()

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def spec(self) -> LoraConfig | None:
        """The ``flaxzoo.models.adapters.lora.LoraConfig`` (None when off); its errors are reported on ``lora.FIELD``."""
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


def compilation_cache_path(enabled: bool, directory: str) -> str | None:
    """The persistent compilation cache's directory: ``directory``, else ``$FLAXZOO_JAX_CACHE``, else
    ``~/.cache/flaxzoo/jax``; None when ``enabled`` is false."""
    if not enabled:
        return None
    return (directory or os.environ.get("FLAXZOO_JAX_CACHE")
            or os.path.join(os.path.expanduser("~"), ".cache", "flaxzoo", "jax"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig(Section):
    """The keys every task's config has, declared once: the ``optim``, ``mesh``, ``precision`` and ``lora`` sections,
    the seed, the logging / evaluation / checkpoint cadence (steps), the global batch, the compilation cache,
    profiling and ``init_from``. Pre-training (``flaxzoo.train.config.TrainConfig``) and fine-tuning
    (``flaxzoo.train.finetune.config.FinetuneConfig``) add their own keys and sections; a task may give
    ``eval_every``, ``checkpoint_every``, ``keep_checkpoints`` and ``batch_size`` its own default. ``SECTIONS``
    names a task's sections."""

    optim: OptimConfig
    mesh: MeshConfig
    precision: PrecisionConfig
    lora: LoraSettings = dataclasses.field(default_factory=LoraSettings)
    seed: int = checked(0, integer(0))
    log_every: int = checked(10, integer(1))
    eval_every: int = checked(200, integer(0, note="(0 = only at the end)"))
    checkpoint_every: int = checked(200, integer(0, note="(0 = only at the end)"))
    keep_checkpoints: int = checked(3, integer(1))
    batch_size: int = checked(16, integer(1))
    compilation_cache: bool = checked(True, BOOL)
    compilation_cache_dir: str = checked("", TEXT)
    profile_steps: tuple[int, int] | None = checked("", Spec("window"))
    init_from: str = checked("", TEXT)

    SECTIONS: ClassVar[tuple[str, ...]] = ("optim", "mesh", "precision", "lora")

    @classmethod
    def top_level(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """The top-level keys of ``values`` (a whole config as plain dicts), each checked by its spec; an unknown key
        (neither a top-level key nor a section) is an error naming it."""
        reject_unknown_keys("", values, [*cls.keys(), *cls.SECTIONS])
        top = {name: values[name] for name in cls.keys() if name in values}
        for name, value in top.items():
            cls.__dataclass_fields__[name].metadata["spec"].check(name, value)
        return top

    def check_rows(self, key: str, rows: int) -> None:
        """``rows`` (the global batch of ``key``) split evenly over the mesh's batch axes, or :class:`ConfigError`."""
        axes = self.mesh.batch_axes
        if rows % axes:
            raise ConfigError(key, f"{rows} is not divisible by mesh.data x mesh.fsdp = {self.mesh.data} x "
                                   f"{self.mesh.fsdp} = {axes} devices; expected a multiple of {axes} (the batch is "
                                   "sharded over both, each device takes the same number of rows)")

    def cache_dir(self) -> str | None:
        """Where the persistent compilation cache lives, or None when ``compilation_cache`` is off."""
        return compilation_cache_path(self.compilation_cache, self.compilation_cache_dir)
