"""The step program of a run, for every task: the model's abstract state, its shardings on the mesh, and the jitted
train / eval / predict steps.

A task says what differs (:class:`StepProgram`'s inputs: the model factory, what trains, the optimizer, the objective
and its extra train-step variants, the batch shapes, the predict maker); the program does the rest the same way for
all: no data is read and nothing is allocated until one of its ``init`` functions runs. Pre-training
(:func:`pretraining_program`, run by ``flaxzoo.train.pretrain.Trainer``) and fine-tuning
(``flaxzoo.train.finetune.task.finetune_program``) build one; ``flaxzoo.train.tools.compile`` lowers and compiles
exactly the same step for compile-only TPU / GPU devices (``python -m flaxzoo.train.compile``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from flaxzoo.models.adapters.lora import LoraConfig, LoraError, apply_lora, check_train_fully, frozen_and_trainable
from flaxzoo.train import data as datalib
from flaxzoo.train import sharding as shardlib
from flaxzoo.train.config import ConfigError, TrainConfig
from flaxzoo.train.optim import make_optimizer
from flaxzoo.train.step import make_eval_step, make_predict_masked, make_train_step, new_train_state

log = logging.getLogger(__name__)

BatchShapes = Callable[[int], Mapping[str, tuple[tuple[int, ...], Any]]]  # rows -> {key: (shape, dtype)}


class StepProgram:
    """Everything of a run that the devices execute: see the module docstring.

    Inputs (what a task says): ``cfg`` (the task's checked config, kept for whoever reports on the program),
    ``mesh``; ``model(seed)`` builds the plain model (the one pretrained weights fit) and ``adapt`` turns it into the
    trained one (LoRA; None: as is), both traced under ``nnx.eval_shape`` / ``jax.jit``; ``lora`` (the
    ``LoraConfig`` or None: with it the frozen base in ``rest`` is sharded as parameters are); ``trainable`` (the
    ``nnx`` filter of what trains; the rest travels in ``rest``: no gradient, no optimizer state, not checkpointed);
    ``optimizer(abstract trained params) -> (tx, schedule)``; ``objective`` (a loss of ``flaxzoo.train.losses``);
    ``variants`` (further train steps, name -> the predicate on parameter paths that may move, e.g. the head alone);
    ``batch_shapes(rows)`` and ``batch_size`` (the global batch); ``seed``; ``make_predict(graphdef, placement)``
    (or None); ``accum_steps``, ``loss_chunk``; ``prepare_plain`` (applied to pretrained weights before they are
    split, e.g. a grown vocabulary).

    Attributes: ``graphdef``, ``tx`` / ``schedule``, ``param_count`` / ``trainable_count``, ``state_shardings`` (of
    the train state ``{"params", "opt_state", "step", "rng"}``), ``rest_shardings`` (RNG streams; LoRA's frozen base),
    ``batch_sharding`` and ``placement`` (which rows this process loads), ``activation_placement`` (what the steps
    trace the model under), ``target`` (the abstract sharded train state: what checkpoints restore into),
    ``abstract_rest``; jitted: ``init()`` (a fresh ``(state, rest)``), ``init_from_plain(plain params)``,
    ``init_rest()``, ``state_of(params)``, ``train_step``, ``steps[variant]``, ``eval_step``, ``predict`` (None
    without ``make_predict``); ``unsplit`` (parameters a mesh axis could not split).
    """

    def __init__(self, cfg: Any, mesh: jax.sharding.Mesh, *, model: Callable[[int], nnx.Module],
                 trainable: Any, optimizer: Callable[[Any], tuple[optax.GradientTransformation, optax.Schedule]],
                 objective: str, batch_shapes: BatchShapes, batch_size: int, seed: int,
                 adapt: Callable[[nnx.Module], nnx.Module] | None = None, lora: LoraConfig | None = None,
                 variants: Mapping[str, Callable[[tuple], bool]] | None = None,
                 make_predict: Callable[..., Callable] | None = None, accum_steps: int = 1, loss_chunk: int = 0,
                 prepare_plain: Callable[[Any], Any] | None = None):
        self.cfg, self.mesh, self.lora, self.trainable = cfg, mesh, lora, trainable
        self.model, self.batch_shapes, self.batch_size = model, batch_shapes, batch_size

        def build() -> nnx.Module:
            return adapt(model(seed)) if adapt else model(seed)

        abstract = nnx.eval_shape(build)
        self.graphdef, abstract_params, abstract_rest = nnx.split(abstract, trainable, ...)
        logical = nnx.to_pure_dict(nnx.get_partition_spec(abstract_params))
        abstract_params = nnx.to_pure_dict(abstract_params)
        self.param_count = int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param))))
        self.trainable_count = int(sum(np.prod(x.shape) for x in jax.tree.leaves(abstract_params)))
        self.tx, self.schedule = tx, schedule = optimizer(abstract_params)

        def state_of(params: Any) -> dict[str, Any]:
            return new_train_state(params, tx, seed)

        def init():
            _, params, rest = nnx.split(build(), trainable, ...)
            return state_of(nnx.to_pure_dict(params)), rest

        def from_plain(plain: Any) -> tuple[dict[str, Any], Any]:
            if prepare_plain is not None:
                plain = prepare_plain(plain)
            graphdef, _, others = nnx.split(model(seed), nnx.Param, ...)
            merged = nnx.merge(graphdef, plain, others)
            _, params, rest = nnx.split(adapt(merged) if adapt else merged, trainable, ...)
            return state_of(nnx.to_pure_dict(params)), rest

        abstract_state = jax.eval_shape(state_of, abstract_params)
        self.unsplit: list[str] = []
        param_shardings = shardlib.param_shardings(logical, abstract_params, mesh, self.unsplit)
        self.replicated = replicated = shardlib.replicated(mesh)
        # The frozen base (LoRA) is sharded as the parameters are; the rest of ``rest`` (RNG streams) is replicated.
        self.rest_shardings = rest_shardings = (
            shardlib.variable_shardings(abstract_rest, mesh, self.unsplit) if lora is not None
            else jax.tree.map(lambda _: replicated, abstract_rest))
        self.state_shardings = state_shardings = {
            "params": param_shardings,
            "opt_state": shardlib.tree_shardings_like(abstract_state["opt_state"], abstract_params, param_shardings,
                                                      mesh),
            "step": replicated, "rng": replicated,
        }
        self.batch_sharding = batch_sharding = shardlib.batch_sharding(mesh)
        self.placement = shardlib.BatchPlacement(batch_sharding, batch_size)
        self.activation_placement = activations = shardlib.activation_placement(mesh)
        self.init = jax.jit(init, out_shardings=(state_shardings, rest_shardings))
        # pretrained weights (the plain model's, sharded as plain_shardings) -> (state, rest), born sharded
        self.init_from_plain = jax.jit(from_plain, out_shardings=(state_shardings, rest_shardings))
        self.init_rest = jax.jit(lambda: init()[1], out_shardings=rest_shardings)
        self.state_of = jax.jit(state_of, out_shardings=state_shardings)
        self.target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state,
                                   state_shardings)
        self.abstract_rest = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                          abstract_rest, rest_shardings)

        def jit_train_step(moving: Callable[[tuple], bool] | None) -> Callable:
            step = make_train_step(self.graphdef, tx, schedule, objective=objective, accum_steps=accum_steps,
                                   loss_chunk=loss_chunk,
                                   micro_batch_sharding=batch_sharding if accum_steps > 1 else None,
                                   grad_shardings=param_shardings, trainable=moving, placement=activations)
            return jax.jit(step, in_shardings=(state_shardings, rest_shardings, batch_sharding, replicated),
                           out_shardings=(state_shardings, replicated), donate_argnums=(0,))

        self.train_step = jit_train_step(None)
        self.steps = {name: jit_train_step(moving) for name, moving in (variants or {}).items()}
        self.eval_step = jax.jit(make_eval_step(self.graphdef, objective=objective, loss_chunk=loss_chunk,
                                                placement=activations),
                                 in_shardings=(param_shardings, rest_shardings, batch_sharding),
                                 out_shardings=replicated)
        self.predict = (jax.jit(make_predict(self.graphdef, activations),
                                in_shardings=(param_shardings, rest_shardings, batch_sharding),
                                out_shardings=replicated) if make_predict is not None else None)

    @functools.cached_property
    def plain_shardings(self) -> Any:
        """The shardings of the plain model's parameters (what a sharded load of pretrained weights fills)."""
        plain = nnx.state(nnx.eval_shape(lambda: self.model(0)), nnx.Param)
        return shardlib.param_shardings(nnx.to_pure_dict(nnx.get_partition_spec(plain)), nnx.to_pure_dict(plain),
                                        self.mesh, self.unsplit)

    def abstract_batch(self, rows: int | None = None) -> dict[str, jax.ShapeDtypeStruct]:
        """The global batch (``batch_shapes``: ``[rows, ...]`` per key), abstract and sharded."""
        shapes = self.batch_shapes(self.batch_size if rows is None else rows)
        return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=self.batch_sharding)
                for k, (shape, dtype) in shapes.items()}

    def lower_train_step(self, variant: str | None = None) -> jax.stages.Lowered:
        """A train step (``variant``: one of ``steps``) lowered for the abstract state, rest and batch (with the
        accuracy flag traced)."""
        step = self.train_step if variant is None else self.steps[variant]
        return step.lower(self.target, self.abstract_rest, self.abstract_batch(),
                          jax.ShapeDtypeStruct((), jnp.bool_, sharding=self.replicated))

    def lower_eval_step(self) -> jax.stages.Lowered:
        return self.eval_step.lower(self.target["params"], self.abstract_rest, self.abstract_batch())


def pretraining_program(cfg: TrainConfig, mesh: jax.sharding.Mesh) -> StepProgram:
    """The step program of a pre-training config: its model class (LoRA adapters when asked for), the pre-training
    optimizer, the loader's batches (``flaxzoo.train.data.batch_shapes``: ``segment_ids`` included, int32), gradient
    accumulation and loss chunking; the masked-token predictions of an MLM (the eval sample)."""
    config, cls, seed, lora = cfg.model, cfg.model_cls, cfg.seed, cfg.lora.spec()

    def model(seed: int) -> nnx.Module:
        return cls(config, rngs=nnx.Rngs(seed))

    def adapt(plain: nnx.Module) -> nnx.Module:
        return apply_lora(plain, lora, seed=seed)

    try:
        if lora:
            check_train_fully(nnx.eval_shape(lambda: adapt(model(seed))), cfg.lora.fully_trained)
        return StepProgram(
            cfg, mesh, model=model, adapt=adapt if lora else None, lora=lora,
            trainable=frozen_and_trainable(cfg.lora.fully_trained) if lora else nnx.Param,
            optimizer=lambda params: make_optimizer(cfg.optim, cfg.steps, params, config.num_layers),
            objective=cfg.objective, batch_size=cfg.batch_size, seed=seed,
            batch_shapes=lambda rows: {k: (shape, jnp.int32)
                                       for k, shape in datalib.batch_shapes(cfg.data, rows).items()},
            make_predict=make_predict_masked if cfg.objective == "mlm" else None,
            accum_steps=cfg.optim.accum_steps, loss_chunk=cfg.precision.loss_chunk)
    except LoraError as exc:  # a target or train_fully entry this model lacks: reported on its config key
        raise ConfigError(f"lora.{exc.field}", str(exc)) from None


@dataclasses.dataclass(frozen=True)
class MemoryFigures:
    """Bytes per device of a compiled program (``compiled.memory_analysis()``)."""

    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    code: int

    @property
    def total(self) -> int:
        """What the program needs resident: its arguments, the outputs that do not reuse (alias) a donated
        argument, its temporaries and its code."""
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.code

    @classmethod
    def of(cls, compiled: jax.stages.Compiled) -> "MemoryFigures":
        stats = compiled.memory_analysis()
        return cls(arguments=int(stats.argument_size_in_bytes), outputs=int(stats.output_size_in_bytes),
                   aliased=int(stats.alias_size_in_bytes), temporaries=int(stats.temp_size_in_bytes),
                   code=int(stats.generated_code_size_in_bytes))


def device_memory_bytes(device: jax.Device) -> int | None:
    """The bytes a program may use on ``device``: its runtime's limit (``memory_stats()["bytes_limit"]``), or None
    when the device reports none (CPU)."""
    try:
        stats = device.memory_stats()
    except Exception:  # compile-only and CPU devices may not implement it
        stats = None
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


REMAT_ORDER = ("none", "dots", "full")  # cheapest recomputation first


@dataclasses.dataclass
class RematChoice:
    """What ``precision.remat="auto"`` chose on an accelerator, and the figures it was chosen by."""

    remat: str
    program: StepProgram  # its ``cfg``: the config with this policy
    compiled: jax.stages.Compiled | None
    tried: list[tuple[str, MemoryFigures | None, str]]  # (policy, memory or None, "fits" / "does not fit" / error)

    def describe(self, capacity: int) -> str:
        parts = [f"{policy}: {fig.total / 2**30:.2f} GiB {verdict}" if fig else f"{policy}: {verdict}"
                 for policy, fig, verdict in self.tried]
        return (f"remat {self.remat} (auto: the cheapest policy whose step fits {capacity / 2**30:.2f} GiB per "
                f"device; {'; '.join(parts)})")


def choose_remat(cfg: TrainConfig, mesh: jax.sharding.Mesh, capacity: int) -> RematChoice:
    """The cheapest remat policy (``REMAT_ORDER``) whose compiled train step fits ``capacity`` bytes per device.

    Each candidate is compiled for ``mesh`` (real or compile-only devices); the first that fits is returned with
    its program and executable (so a run does not compile it again). When none fits, the last (``full``) is
    returned with the figures of all three. An out-of-memory compile error (TPU refuses programs over HBM) counts as
    not fitting."""
    tried: list[tuple[str, MemoryFigures | None, str]] = []
    last: RematChoice | None = None
    for policy in REMAT_ORDER:
        candidate = dataclasses.replace(cfg, precision=dataclasses.replace(cfg.precision, remat=policy))
        program = pretraining_program(candidate, mesh)
        try:
            compiled = program.lower_train_step().compile()
        except Exception as exc:  # XlaRuntimeError RESOURCE_EXHAUSTED on TPU
            if "RESOURCE_EXHAUSTED" not in str(exc) and "out of memory" not in str(exc).lower():
                raise
            tried.append((policy, None, "does not fit (" + str(exc).splitlines()[0][:120] + ")"))
            last = RematChoice(policy, program, None, tried)
            continue
        figures = MemoryFigures.of(compiled)
        fits = figures.total <= capacity
        tried.append((policy, figures, "fits" if fits else "does not fit"))
        last = RematChoice(policy, program, compiled, tried)
        if fits:
            return last
    assert last is not None
    return last
