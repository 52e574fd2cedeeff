"""The step program of a run: the model's abstract state, its shardings on the mesh, and the jitted train / eval steps.

Built from a checked :class:`~flaxzoo.train.config.TrainConfig` and a mesh alone: no data is read and nothing is allocated
until :meth:`StepProgram.initial_state` is called. ``flaxzoo.train.pretrain.Trainer`` runs it; ``flaxzoo.train.tools.compile`` lowers and
compiles exactly the same step for compile-only TPU / GPU devices (``python -m flaxzoo.train.compile``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxzoo.models.adapters.lora import LoraError, apply_lora, check_train_fully, frozen_and_trainable
from flaxzoo.models.modeling import abstract_model
from flaxzoo.train import data as datalib
from flaxzoo.train import sharding as shardlib
from flaxzoo.train.config import ConfigError, TrainConfig
from flaxzoo.train.optim import make_optimizer
from flaxzoo.train.step import make_eval_step, make_predict_masked, make_train_step, new_train_state

log = logging.getLogger(__name__)


class StepProgram:
    """Everything of a run that the devices execute: see the module docstring.

    Attributes: ``graphdef`` (the model's static structure), ``tx`` / ``schedule`` (the optimizer), ``lora`` (the
    ``flaxzoo.models.adapters.lora.LoraConfig`` or None), ``param_count`` / ``trainable_count``, ``state_shardings`` (of the train
    state ``{"params", "opt_state", "step", "rng"}``), ``rest_shardings`` (RNG streams; LoRA's frozen base),
    ``batch_sharding`` and ``placement`` (which rows this process loads), ``activation_placement`` (what the
    steps trace the model under: activation shardings, the platform), ``target`` (the abstract sharded train
    state: what checkpoints restore into),
    ``train_step`` / ``eval_step`` / ``predict`` (jitted), ``unsplit`` (parameters a mesh axis could not split).
    """

    def __init__(self, cfg: TrainConfig, mesh: jax.sharding.Mesh):
        self.cfg, self.mesh = cfg, mesh
        config, cls, seed = cfg.model, cfg.model_cls, cfg.seed
        self.lora = cfg.lora.spec()
        lora = self.lora
        # What trains: every parameter, or (LoRA) the adapters and lora.train_fully's modules; the rest is frozen
        # and travels in ``rest`` (no gradient, no optimizer state, not in the checkpoints).
        self.trainable = frozen_and_trainable(cfg.lora.fully_trained) if lora else nnx.Param

        def build() -> nnx.Module:
            model = cls(config, rngs=nnx.Rngs(seed))
            return apply_lora(model, lora, seed=seed) if lora else model

        try:
            abstract = nnx.eval_shape(build) if lora else abstract_model(config, cls)
            if lora:
                check_train_fully(abstract, cfg.lora.fully_trained)
        except LoraError as exc:  # a target or train_fully entry this model lacks: reported on its config key
            raise ConfigError(f"lora.{exc.field}", str(exc)) from None
        self.graphdef, abstract_params, abstract_rest = nnx.split(abstract, self.trainable, ...)
        logical = nnx.to_pure_dict(nnx.get_partition_spec(abstract_params))
        abstract_params = nnx.to_pure_dict(abstract_params)
        self.param_count = int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param))))
        self.trainable_count = int(sum(np.prod(x.shape) for x in jax.tree.leaves(abstract_params)))
        self.tx, self.schedule = make_optimizer(cfg.optim, cfg.steps, abstract_params, config.num_layers)
        tx = self.tx

        def state_of(params: Any) -> dict[str, Any]:
            return new_train_state(params, tx, seed)

        def init():
            _, params, rest = nnx.split(build(), self.trainable, ...)
            return state_of(nnx.to_pure_dict(params)), rest

        abstract_state = jax.eval_shape(state_of, abstract_params)
        self.unsplit: list[str] = []
        param_shardings = shardlib.param_shardings(logical, abstract_params, mesh, self.unsplit)
        self.replicated = shardlib.replicated(mesh)
        # The frozen base (LoRA) is sharded as the parameters are; the rest of ``rest`` (RNG streams) is replicated.
        self.rest_shardings = (shardlib.variable_shardings(abstract_rest, mesh, self.unsplit) if lora
                               else self.replicated)
        self.state_shardings = {
            "params": param_shardings,
            "opt_state": shardlib.tree_shardings_like(abstract_state["opt_state"], abstract_params, param_shardings,
                                                      mesh),
            "step": self.replicated, "rng": self.replicated,
        }
        self.batch_sharding = shardlib.batch_sharding(mesh)
        self.placement = shardlib.BatchPlacement(self.batch_sharding, cfg.batch_size)
        self.activation_placement = shardlib.activation_placement(mesh)
        self.init = jax.jit(init, out_shardings=(self.state_shardings, self.rest_shardings))

        def from_plain(plain: Any) -> tuple[dict[str, Any], Any]:
            fresh = cls(config, rngs=nnx.Rngs(seed))
            graphdef, _, others = nnx.split(fresh, nnx.Param, ...)
            model = nnx.merge(graphdef, plain, others)
            _, params, rest = nnx.split(apply_lora(model, lora, seed=seed) if lora else model, self.trainable, ...)
            return state_of(nnx.to_pure_dict(params)), rest

        plain = nnx.state(abstract_model(config, cls), nnx.Param)
        self.plain_shardings = shardlib.param_shardings(nnx.to_pure_dict(nnx.get_partition_spec(plain)),
                                                        nnx.to_pure_dict(plain), mesh, self.unsplit)
        # pretrained weights (the plain model's, sharded as plain_shardings) -> (state, rest), born sharded
        self.init_from_plain = jax.jit(from_plain, out_shardings=(self.state_shardings, self.rest_shardings))
        self.init_rest = jax.jit(lambda: init()[1], out_shardings=self.rest_shardings)
        self.state_of = jax.jit(state_of, out_shardings=self.state_shardings)
        self.target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state,
                                   self.state_shardings)
        rest_shardings = self.rest_shardings
        self.abstract_rest = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_rest,
            rest_shardings if lora else jax.tree.map(lambda _: self.replicated, abstract_rest))
        objective, accum, chunk = cfg.objective, cfg.optim.accum_steps, cfg.precision.loss_chunk
        train_step = make_train_step(self.graphdef, tx, self.schedule, objective=objective, accum_steps=accum,
                                     loss_chunk=chunk, micro_batch_sharding=self.batch_sharding if accum > 1 else None,
                                     grad_shardings=param_shardings,
                                     placement=self.activation_placement)
        self.train_step = jax.jit(train_step, in_shardings=(self.state_shardings, rest_shardings,
                                                            self.batch_sharding, self.replicated),
                                  out_shardings=(self.state_shardings, self.replicated), donate_argnums=(0,))
        self.eval_step = jax.jit(make_eval_step(self.graphdef, objective=objective, loss_chunk=chunk,
                                                placement=self.activation_placement),
                                 in_shardings=(param_shardings, rest_shardings, self.batch_sharding),
                                 out_shardings=self.replicated)
        self.predict = (jax.jit(make_predict_masked(self.graphdef, self.activation_placement),
                                out_shardings=self.replicated)
                        if objective == "mlm" else None)

    def abstract_batch(self, rows: int | None = None) -> dict[str, jax.ShapeDtypeStruct]:
        """The global batch the loader feeds (``flaxzoo.train.data.batch_shapes``: ``segment_ids`` included), abstract and
        sharded."""
        shapes = datalib.batch_shapes(self.cfg.data, self.cfg.batch_size if rows is None else rows)
        return {k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=self.batch_sharding) for k, shape in shapes.items()}

    def lower_train_step(self) -> jax.stages.Lowered:
        """The train step lowered for the abstract state, rest and batch (with the accuracy flag traced)."""
        return self.train_step.lower(self.target, self.abstract_rest, self.abstract_batch(),
                                     jax.ShapeDtypeStruct((), jnp.bool_, sharding=self.replicated))

    def lower_eval_step(self) -> jax.stages.Lowered:
        return self.eval_step.lower(self.target["params"], self.abstract_rest, self.abstract_batch())


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
    program: StepProgram
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
        program = StepProgram(candidate, mesh)
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
