"""The one training loop: every task (causal LM, masked LM, sequence classification, token classification) runs its
steps here, with the same checkpoints, resume, stop signal, metrics, NaN check, evaluation cadence and profiler.

A task (:class:`Task`) says what is its own: the state and how it starts, the batches from a data position, the
compiled step for a step number, what a logged row adds, and its evaluation. :func:`run_task` does the rest, top
to bottom: restore → batch → step → hooks (metrics, evaluation, checkpoint, profiler, preemption) → the final
checkpoint.

The metrics of a step are fetched one step late (the host places batch ``s + 1`` while the devices run step ``s``),
except where the loop needs them now: a logged row, an evaluation, a checkpoint. Every step's loss and gradient norm
are checked finite before a checkpoint can hold that step's state.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from flaxzoo.train import flops as flopslib
from flaxzoo.train.checkpoint import Checkpointer, Restored
from flaxzoo.train.hooks import MetricsWriter, NonFiniteLossError, StopSignal, is_main, say, say_everywhere


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    """The config keys every task reads the same way."""

    steps: int
    log_every: int
    eval_every: int = 0  # 0: only at the last step
    checkpoint_every: int = 0  # 0: only at the last step and at a stop
    keep_checkpoints: int = 3
    profile_steps: tuple[int, int] | None = None
    checkpoint_directory: str = "checkpoints"


@dataclasses.dataclass
class LoopResult:
    """What :func:`run_task` did; ``state`` / ``rest`` are the last step's."""

    start_step: int
    last_step: int
    resumed_from: int | None = None
    stopped_by: str | None = None  # "SIGTERM" / "SIGINT" when stopped before the last step
    final_eval: dict[str, Any] | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_flops: float | None = None
    train_s: float = 0.0
    state: Any = None
    rest: Any = None


class Task:
    """What a task gives the engine (subclassed by ``flaxzoo.train.pretrain.Trainer`` and the fine-tuners)."""

    workdir: Any  # an ``epath.Path``
    settings: LoopSettings
    devices: list
    target: Any  # the train state as ``jax.ShapeDtypeStruct``s with their shardings (what a checkpoint restores to)
    replicated: jax.sharding.Sharding  # the mesh's replicated sharding
    wall_start: float  # ``time.perf_counter()`` when the run began (a logged row's ``elapsed_s`` counts from it)
    tokens_per_step: int | None = None  # with flops_per_token and a meter: tokens/s and MFU in each logged row
    flops_per_token: float | None = None
    meter: flopslib.PeakMeter | None = None  # set by :meth:`prepare` where MFU is reported

    def identity(self) -> dict[str, Any]:
        """``Checkpointer.restore_latest``'s checks: ``model_class``, ``config``, ``data``, ``base``."""
        raise NotImplementedError

    def initial(self) -> tuple[Any, Any]:
        """A fresh ``(state, rest)``, sharded over the mesh."""
        raise NotImplementedError

    def resumed(self, restored: Restored) -> tuple[Any, Any]:
        """``(state, rest)`` from a restored checkpoint (``rest``: what the checkpoint does not hold)."""
        raise NotImplementedError

    def prepare(self, start: int) -> None:
        """Before the first step: compile, say what is trained."""

    def batches(self, position: int) -> Iterator[dict[str, np.ndarray]]:
        """This process's rows of the global batches from ``position`` on; ``.position`` is the next one's."""
        raise NotImplementedError

    def place(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        raise NotImplementedError

    def step_fn(self, step: int) -> Callable:
        """The compiled ``(state, rest, batch, with_accuracy) -> (state, metrics)`` for ``step``."""
        raise NotImplementedError

    def with_accuracy(self, step: int) -> bool:
        """Whether ``step`` computes its training accuracy (an argmax over the logits): at logged steps."""
        return step % self.settings.log_every == 0 or step == self.settings.steps

    def row_extra(self, step: int) -> dict[str, Any]:
        return {}

    def line(self, step: int, row: dict[str, Any]) -> str:
        """The printed line of a logged row."""
        return f"step {step}/{self.settings.steps}  loss {row['loss']:.4f}"

    def evaluate_at(self, step: int, state: Any, rest: Any, writer: MetricsWriter) -> dict[str, Any] | None:
        """The evaluation at ``step`` (and any sample): says what it found; its metrics join the logged row."""
        return None

    def at_start(self, state: Any, rest: Any, writer: MetricsWriter, result: LoopResult) -> None:
        """After a fresh start, before the first step (pre-training's ``eval_at_start``)."""

    def meta(self) -> dict[str, Any]:
        """What the checkpoint says of itself."""
        raise NotImplementedError


class MetricWindow:
    """The metrics of the steps since the last logged row; :meth:`take` checks each step finite as it is fetched."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, Any]] = []
        self.reset()

    def reset(self) -> None:
        self.steps, self.sums, self.accuracy, self.lr = 0, {"loss": 0.0, "grad_norm": 0.0}, [], None
        self.started, self.paused = time.perf_counter(), 0.0

    def take(self, keep_last: bool, accuracy_steps: set[int], last_saved: int | None) -> None:
        ready, self.pending = (self.pending[:-1], self.pending[-1:]) if keep_last else (self.pending, [])
        for step, metrics in ready:
            values = {k: float(v) for k, v in jax.device_get(metrics).items()}
            if not (math.isfinite(values["loss"]) and math.isfinite(values["grad_norm"])):
                raise NonFiniteLossError(step, values, last_saved)
            self.steps += 1
            for key in self.sums:
                self.sums[key] += values[key]
            if step in accuracy_steps:
                self.accuracy.append(values["accuracy"])
                accuracy_steps.discard(step)
            self.lr = values["lr"]

    def row(self, step: int) -> dict[str, Any]:
        return {"step": step, **{k: v / self.steps for k, v in self.sums.items()},
                **({"accuracy": float(np.mean(self.accuracy))} if self.accuracy else {}), "lr": self.lr}


def run_task(task: Task) -> LoopResult:
    """Train ``task`` from its latest good checkpoint (or from the start) to ``settings.steps``; SIGTERM / SIGINT
    stop it after a step, with a checkpoint (agreed across processes)."""
    with StopSignal() as stop:
        return _run(task, stop)


def _run(task: Task, stop: StopSignal) -> LoopResult:
    s = task.settings
    checkpointer = Checkpointer(task.workdir, keep=s.keep_checkpoints, directory=s.checkpoint_directory)
    restored = checkpointer.restore_latest(task.target, **task.identity())
    if restored is not None:
        for step, reason in restored.damaged:
            say_everywhere(f"checkpoint at step {step} is damaged ({reason}); moved to "
                           f"{checkpointer.damaged_directory}")
        where = checkpointer.directory / str(restored.step)
        say_everywhere(f"resumed from checkpoint at step {restored.step} ({where})")
        (state, rest), start = task.resumed(restored), int(restored.step)
    else:
        (state, rest), start = task.initial(), 0
    result = LoopResult(start_step=start, last_step=start, resumed_from=start if restored is not None else None,
                        state=state, rest=rest)
    if start >= s.steps:
        say(f"nothing to do: the checkpoint is at step {start} and steps={s.steps}")
        checkpointer.close()
        return result
    task.prepare(start)
    iterator = task.batches(restored.data_position if restored is not None else 0)
    meter = task.meter if task.flops_per_token and task.tokens_per_step else None
    writer = MetricsWriter(task.workdir, start)
    if start == 0:
        task.at_start(state, rest, writer, result)
    tty = sys.stderr.isatty()  # a live bar on a terminal; in a log file one plain line per logged row instead
    bar = tqdm(total=s.steps, initial=start, desc="train", unit="step", dynamic_ncols=True,
               disable=not (is_main() and tty), file=sys.stderr)
    window, accuracy_steps, throughput = MetricWindow(), set(), []
    flags = {on: jax.device_put(jnp.bool_(on), task.replicated) for on in (False, True)}
    last_saved, tracing, mfu_warned = checkpointer.latest_step(), False, False
    train_start = time.perf_counter()
    try:
        for step in range(start + 1, s.steps + 1):
            if s.profile_steps is not None and step == s.profile_steps[0]:
                jax.profiler.start_trace(str(task.workdir / "profile"))
                tracing = True
            with_accuracy = task.with_accuracy(step)
            if with_accuracy:
                accuracy_steps.add(step)
            state, metrics = task.step_fn(step)(state, rest, task.place(next(iterator)), flags[with_accuracy])
            if tracing and step == s.profile_steps[1]:
                jax.block_until_ready(state)
                jax.profiler.stop_trace()
                tracing = False
                say(f"profile of steps {s.profile_steps[0]}..{step}: {task.workdir / 'profile'} (TensorBoard's "
                    "profile plugin)")
            window.pending.append((step, metrics))
            stopping = stop.agreed(step)
            final = step == s.steps or stopping
            do_log = step % s.log_every == 0 or final
            do_eval = bool(s.eval_every and step % s.eval_every == 0) or step == s.steps
            do_save = bool(s.checkpoint_every and step % s.checkpoint_every == 0) or final
            window.take(not (do_log or do_eval or do_save), accuracy_steps, last_saved)
            bar.update(1)
            row = None
            if do_log and window.steps:
                row = window.row(step)
                if meter is not None:
                    elapsed = time.perf_counter() - window.started - window.paused
                    tokens_per_s = window.steps * task.tokens_per_step / max(elapsed, 1e-9)
                    utilisation = meter.mfu(task.flops_per_token, tokens_per_s)
                    if utilisation is None and meter.untrusted and not mfu_warned:
                        say(meter.untrusted)
                        mfu_warned = True
                    throughput.append((tokens_per_s, utilisation))
                    row["tokens_per_s"] = tokens_per_s
                    if utilisation is not None:
                        row["mfu"] = utilisation
                row.update(task.row_extra(step))
                row["elapsed_s"] = time.perf_counter() - task.wall_start
                bar.set_postfix(loss=f"{row['loss']:.4f}", refresh=False)
                if not tty:
                    say(task.line(step, row))
                window.reset()
            pause_start = time.perf_counter()
            if do_eval:
                evaluation = task.evaluate_at(step, state, rest, writer)
                if evaluation is not None:
                    row = {**(row or {"step": step}), **evaluation}
                    result.final_eval = evaluation
            if row is not None:
                writer.write(row)
            if do_save:
                checkpointer.save(step, state, iterator.position, task.meta())
                last_saved = step
            window.paused += time.perf_counter() - pause_start
            result.last_step = step
            if not stopping and not stop.multi_process and stop.name is not None:
                stopping = True  # the signal came during this step's evaluation / save (one process: no agreement)
            if stopping:
                if last_saved != step:
                    window.take(False, accuracy_steps, last_saved)
                    checkpointer.save(step, state, iterator.position, task.meta())
                result.stopped_by = stop.name
                say_everywhere(f"{stop.name} received: stopped after step {step}, checkpoint saved")
                break
    finally:
        if tracing:  # the run ended (or failed) inside the profiled window: keep what was traced
            jax.profiler.stop_trace()
        bar.close()
        writer.close()
        checkpointer.close()  # waits for the async saves in flight (all of them checked finite)
    jax.block_until_ready(state)
    result.train_s = time.perf_counter() - train_start
    result.state, result.rest = state, rest
    if throughput:
        steady = throughput[1:] or throughput  # the first window holds the first step's dispatch
        result.tokens_per_s = float(np.median([t for t, _ in steady]))
        utilisations = [m for _, m in steady if m is not None]
        result.mfu = float(np.median(utilisations)) if utilisations else None
    if meter is not None:
        result.peak_flops = meter.peak
    return result


__all__ = ["LoopResult", "LoopSettings", "MetricWindow", "Task", "run_task"]
