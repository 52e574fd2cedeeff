"""Pre-training as a task of the one training loop (``flaxzoo.train.engine``): causal LM and masked LM, from scratch
or from ``init_from``, with LoRA.

:func:`train` is the whole job behind ``python -m flaxzoo.train``:

1. check the config (``train/config.py``: a bad value stops here, before any data work or compilation);
2. prepare the data (tokenizer, packed splits: cached), check the tokenizer fits the model's vocabulary, compute the
   unigram baseline;
3. build the mesh and the sharded train state (initialised under ``jax.jit`` with ``out_shardings``), or restore the
   workdir's latest good checkpoint into it (any mesh, any device count);
4. run the steps on the engine (``flaxzoo.train.engine.run_task``): the host reads batch ``s + 1`` while the
   devices run step ``s``; metrics of a step are fetched one step late except where the loop needs them now
   (logging, evaluation, checkpoints, the end);
5. every ``log_every`` steps a row in ``metrics.jsonl`` and TensorBoard; every ``eval_every`` steps validation loss,
   perplexity (and masked-token accuracy) and a sample; every ``checkpoint_every`` steps an async checkpoint;
6. at the end (or on SIGTERM / SIGINT, after the current step) a final checkpoint, waited for. A non-finite loss or
   gradient stops the run with the step number; no checkpoint is written after it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from ml_collections import ConfigDict

from flaxzoo.models.inference.generate import generate
from flaxzoo.train import data as datalib
from flaxzoo.train import flops as flopslib
from flaxzoo.train import multihost
from flaxzoo.train import sharding as shardlib
from flaxzoo.train import storage
from flaxzoo.train.checkpoint import resolve_workdir
from flaxzoo.train.config import ConfigError, TrainConfig
from flaxzoo.train.engine import LoopResult, LoopSettings, Task, run_task
from flaxzoo.train.hooks import (MetricsWriter, is_main, say, setup_compilation_cache)
from flaxzoo.train.program import choose_remat, device_memory_bytes, pretraining_program

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Summary:
    """What a run did (returned by :func:`train`, printed at the end)."""

    workdir: str
    start_step: int
    last_step: int
    stopped_by: str | None = None  # "SIGTERM" / "SIGINT" when interrupted
    resumed_from: int | None = None
    final_eval: dict[str, float] | None = None
    unigram_perplexity: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    cpu_peak_flops: float | None = None
    flops_per_token: float | None = None
    param_count: int | None = None
    trainable_count: int | None = None  # LoRA: the adapters (and lora.train_fully's parameters); else param_count
    initial_eval: dict[str, float] | None = None  # eval_at_start: before the first step
    compile_s: float | None = None
    wall_s: float | None = None
    sample: str | None = None


class Trainer(Task):
    """The state of one run: the typed config, data, mesh, compiled steps, checkpoints. :meth:`run` trains."""

    def __init__(self, config: TrainConfig | ConfigDict, workdir: str | os.PathLike, *,
                 devices: list[jax.Device] | None = None):
        """``config``: a checked :class:`TrainConfig` (or a ``ConfigDict``, checked here for ``devices``);
        ``devices``: the devices of the mesh (default: all of them)."""
        self.wall_start = time.perf_counter()
        self.training_started = False  # set when the first step is dispatched: errors after it are run failures
        self.devices = list(jax.devices() if devices is None else devices)
        if not isinstance(config, TrainConfig):
            config = TrainConfig.from_config_dict(config, len(self.devices))
        if math.prod(config.mesh.shape) != len(self.devices):
            raise ConfigError("mesh", f"{config.mesh.shape} spans {math.prod(config.mesh.shape)} devices; this "
                                      f"trainer has {len(self.devices)}")
        storage.check_paths(workdir, data_dir=config.data.data_dir, init_from=config.init_from,
                            compilation_cache_dir=config.compilation_cache_dir)
        self.cfg = config
        self.workdir = resolve_workdir(workdir)
        if is_main():
            self.workdir.mkdir(parents=True, exist_ok=True)
        multihost.barrier("flaxzoo_workdir")
        multihost.check_shared(self.workdir, "the work directory")  # checkpoints need one folder for all
        setup_compilation_cache(config)
        self.model_config, self.model_cls = config.model, config.model_cls
        self.steps, self.tokens_per_step = config.steps, config.tokens_per_step
        self.mesh = shardlib.make_mesh(config.mesh.shape, self.devices)
        precision = config.precision
        say(f"devices: {len(self.devices)} x {self.devices[0].device_kind} ({jax.process_count()} process(es)); "
             f"mesh {shardlib.describe(self.mesh)}; compute {self.model_config.dtype}, params "
             f"{self.model_config.param_dtype}, remat {precision.describe('remat')}, scan_layers "
             f"{precision.describe('scan_layers')}")
        self._prepare_data()
        self._build_state()

    # ---------------------------------------------------------------------------------------------------- data
    def _prepare_data(self) -> None:
        cfg = self.cfg.data
        start = time.perf_counter()
        # Process 0 trains the tokenizer and packs the data into data_dir's cache; the others wait, then read it. A
        # failure there (bad paths, an unfit tokenizer) is raised on every process, not left for them to wait on.
        def load() -> None:
            self.tokenizer = datalib.build_tokenizer(cfg)
            self.sources = datalib.prepare(cfg, self.tokenizer)

        shared = multihost.check_shared(cfg.data_dir, "data.data_dir", required=False)
        failure = None
        if is_main() or not shared:
            try:
                load()
            except (ValueError, FileNotFoundError) as exc:
                if not multihost.is_multi_process():
                    raise
                failure = exc
        multihost.barrier("flaxzoo_data_prepared")
        if multihost.from_process_zero([failure is not None])[0]:
            if failure is not None:
                raise failure
            raise ValueError("process 0 could not prepare the data (its message says why)")
        if not is_main() and shared:
            load()
        if self.tokenizer.vocab_size > self.model_config.vocab_size:
            raise ValueError(f"the tokenizer has {self.tokenizer.vocab_size} tokens but model.vocab_size="
                             f"{self.model_config.vocab_size}: the embedding table needs a row per token id; raise "
                             f"model.vocab_size to at least {self.tokenizer.vocab_size} (or lower data.vocab_size)")
        if is_main():
            self.tokenizer.save(self.workdir / "tokenizer.json")
        ignore = self.tokenizer.special_ids if self.cfg.objective == "mlm" else ()
        self.unigram_ppl = datalib.unigram_baseline(self.sources, self.model_config.vocab_size, self.cfg.objective,
                                            ignore_ids=ignore)
        sizes = {k: len(v) for k, v in self.sources.items()}
        say(f"data: {cfg.source} corpus, {self.tokenizer.kind} tokenizer of {self.tokenizer.vocab_size} tokens, "
             f"{sizes} examples of {cfg.seq_len} tokens ({time.perf_counter() - start:.1f} s)"
             + (f"; unigram baseline perplexity {self.unigram_ppl:.1f}" if self.unigram_ppl else ""))

    def train_iterator(self, start: int = 0):
        """The train batches from global batch ``start`` on (the data position is the step)."""
        return datalib.make_iterator(self.cfg.data, "train", self.tokenizer, sources=self.sources, start=start,
                                     rows=self.placement.rows)

    # --------------------------------------------------------------------------------------------------- state
    def _build_state(self) -> None:
        """The step program (``flaxzoo.train.program.pretraining_program``): shardings, abstract state, jitted
        steps. On an accelerator ``precision.remat="auto"`` compiles the step with each policy and keeps the cheapest
        that fits the device memory (``flaxzoo.train.program.choose_remat``)."""
        cfg = self.cfg
        self.base = None
        if cfg.init_from:
            from flaxzoo.models.io.sources import open_source

            start = time.perf_counter()
            self.base = {"path": os.path.abspath(cfg.init_from) if os.path.exists(cfg.init_from) else cfg.init_from,
                         "fingerprint": open_source(cfg.init_from).fingerprint()}
            say(f"base: {self.base['path']} ({self.base['fingerprint'][:19]}..., {time.perf_counter() - start:.1f} s)")
        self.compiled_step, self.remat_search_s = None, None
        # This process's own device: every process sees the same kind, and only addressable devices report memory.
        capacity = device_memory_bytes(jax.local_devices()[0])
        if "remat" in cfg.precision.auto and shardlib.platform_of(self.devices[0]) != "cpu" and capacity:
            start = time.perf_counter()
            choice = choose_remat(cfg, self.mesh, capacity)
            if choice.compiled is None or choice.tried[-1][2] != "fits":
                raise ValueError(f"the train step fits {capacity / 2**30:.2f} GiB per device with no remat policy "
                                 f"({choice.describe(capacity)}); expected a smaller batch_size, more "
                                 "optim.accum_steps, precision.loss_chunk, or more devices on mesh.fsdp")
            self.cfg = cfg = choice.program.cfg
            self.model_config = cfg.model
            self.compiled_step = choice.compiled
            self.remat_search_s = time.perf_counter() - start
            say(f"{choice.describe(capacity)}; {self.remat_search_s:.1f} s")
            program = choice.program
        else:
            program = pretraining_program(cfg, self.mesh)
        for line in dict.fromkeys(program.unsplit):  # replicated where the mesh meant to split: said once each
            say(f"sharding: {line} (replicated on that axis)")
        self.program = program
        self.graphdef, self.tx, self.schedule, self.lora = program.graphdef, program.tx, program.schedule, program.lora
        self.param_count, self.trainable_count = program.param_count, program.trainable_count
        self.state_shardings, self.rest_shardings = program.state_shardings, program.rest_shardings
        self.replicated, self.batch_sharding, self.placement = (program.replicated, program.batch_sharding,
                                                                program.placement)
        self.target = program.target
        self._train_step, self._eval_step, self._predict = program.train_step, program.eval_step, program.predict
        self._trainable = program.trainable

    def _pretrained(self):
        """``(state, rest)`` from ``init_from``'s weights in this run's config (precision, layout), with LoRA adapters
        when asked for: read shard by shard (``flaxzoo.models.io.sharded.load_sharded``: each process reads only the
        slices its devices hold), then split under ``jax.jit`` with the state's shardings."""
        from flaxzoo.models.io import sharded

        plain = sharded.load_sharded(self.cfg.init_from, cls=self.model_cls, scan_layers=self.model_config.scan_layers,
                             dtype=self.model_config.dtype, param_dtype=self.model_config.param_dtype,
                             shardings=self.program.plain_shardings, seed=self.cfg.seed)
        return self.program.init_from_plain(nnx.to_pure_dict(plain))

    def initial_state(self):
        """A fresh ``(state, rest)``, sharded over the mesh: random, or ``init_from``'s weights."""
        return self._pretrained() if self.cfg.init_from else self.program.init()

    def resumed_rest(self):
        """``rest`` for a resumed run: the RNG streams, and (``init_from``) the frozen base weights again."""
        return self._pretrained()[1] if self.cfg.init_from else self.program.init_rest()

    def meta(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.base is not None:
            extra["base"] = self.base
        if self.lora is not None:
            extra["lora"] = {**self.lora.to_dict(), "train_fully": list(self.cfg.lora.fully_trained)}
        return {**extra, "model_class": self.model_cls.__name__, "config": self.model_config.to_dict(),
                "train_config": self.cfg.to_json_dict(), "tokenizer": "tokenizer.json",
                "data": {k: list(v) if isinstance(v, tuple) else v
                         for k, v in self.cfg.data.to_dict().items()}}

    # ---------------------------------------------------------------------------------------------------- eval
    def evaluate(self, params, rest) -> dict[str, float] | None:
        """Validation loss, perplexity, accuracy over ``eval_batches`` batches (0 = all; the last one completed with
        rows that score nothing, so a split smaller than a batch is evaluated too), or None without a validation
        split."""
        if "validation" not in self.sources:
            return None
        try:
            iterator = datalib.make_iterator(self.cfg.data, "validation", self.tokenizer, sources=self.sources,
                                             num_epochs=1, shuffle=False, pad_last=True, rows=self.placement.rows)
        except ValueError as exc:
            log.warning("no evaluation: %s", exc)
            return None
        limit = self.cfg.eval_batches
        totals = None
        for i, batch in enumerate(iterator):
            if limit and i >= limit:
                break
            out = self._eval_step(params, rest, self.placement.place(batch))
            totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
        if totals is None:
            return None
        totals = jax.device_get(totals)
        tokens = max(float(totals["tokens"]), 1.0)
        loss = float(totals["loss_sum"]) / tokens
        return {"val_loss": loss, "val_perplexity": float(math.exp(min(loss, 80.0))),
                "val_accuracy": float(totals["correct"]) / tokens, "val_tokens": int(tokens)}

    def sample(self, params, rest) -> str | None:
        """A generated continuation of ``sample.prompt`` (causal) or a filled-in masked validation example (MLM)."""
        cfg = self.cfg.sample
        if cfg.max_new_tokens == 0:
            return None
        model = nnx.merge(self.graphdef, params, rest)
        if self.cfg.objective == "causal":
            ids = self.tokenizer.encode(cfg.prompt) if cfg.prompt else []
            if not ids:
                ids = [self.tokenizer.eos_id or 0]
            room = self.model_config.max_position_embeddings - len(ids)
            new = min(cfg.max_new_tokens, room) if self.model_config.position in ("learned", "sinusoidal") \
                else cfg.max_new_tokens
            if new < 1:
                return None
            out = generate(model, np.asarray([ids], np.int32), new, temperature=cfg.temperature,
                           top_k=cfg.top_k or None, rng=jax.random.key(self.cfg.seed))
            return self.tokenizer.decode(np.asarray(out[0]).tolist())
        if "validation" not in self.sources:
            return None
        try:
            batch = next(datalib.make_iterator(self.cfg.data, "validation", self.tokenizer, sources=self.sources,
                                               num_epochs=1, shuffle=False, rows=self.placement.rows))
        except (ValueError, StopIteration):
            return None
        predicted = np.asarray(self._predict(params, rest, self.placement.place(batch)))
        row = int(self.placement.rows[0])  # this process's first row (the sample is printed by process 0: row 0)
        ids, labels, keep = batch["input_ids"][0], batch["labels"][0], batch["attention_mask"][0].astype(bool)
        masked = labels != datalib.IGNORE_INDEX
        filled = np.where(masked, predicted[row], ids)
        truth = np.where(masked, labels, ids)
        shown = [f"[{self.tokenizer.decode([p])}|{self.tokenizer.decode([t])}]" if m else self.tokenizer.decode([i])
                 for i, p, t, m in zip(ids[keep], filled[keep], truth[keep], masked[keep])]
        return ("masked positions as [predicted|original]: " + " ".join(shown))

    # ---------------------------------------------------------------------------------------- the engine's task
    @property
    def settings(self) -> LoopSettings:
        cfg = self.cfg
        return LoopSettings(steps=self.steps, log_every=cfg.log_every, eval_every=cfg.eval_every,
                            checkpoint_every=cfg.checkpoint_every, keep_checkpoints=cfg.keep_checkpoints,
                            profile_steps=cfg.profile_steps)

    def identity(self) -> dict[str, Any]:
        return {"model_class": self.model_cls.__name__, "config": self.model_config.to_dict(),
                "data": self.meta()["data"], "base": self.base}

    def initial(self):
        return self.initial_state()

    def resumed(self, restored):
        return restored.state, self.resumed_rest()

    def prepare(self, start: int) -> None:
        """Compile the step, count its FLOPs, measure the peak; say what is trained."""
        cfg = self.cfg
        compile_start = time.perf_counter()
        self.compiled_train_step = self.compiled_step or self.program.lower_train_step().compile()
        self.compile_s = self.remat_search_s or time.perf_counter() - compile_start
        self.flops_per_token = flopslib.flops_per_token(
            self.model_config, cfg.seq_len, self.model_cls, trained=self.trainable_count if self.lora else None,
            predictions=cfg.data.predictions if cfg.objective == "mlm" else None)
        self.meter = flopslib.PeakMeter(self.devices)
        trained = (f" ({self.trainable_count:,} trained: {100 * self.trainable_count / self.param_count:.2f}%)"
                   if self.trainable_count != self.param_count else "")
        say(f"model: {self.model_cls.__name__}, {self.param_count:,} parameters{trained}, "
            f"{self.flops_per_token / 1e6:.2f} MFLOP per token ({'4N + 6N_trained' if self.lora else '6N'} + 12LTd"
            f"{', the MLM head on the predicted positions' if cfg.objective == 'mlm' else ''}); peak "
            f"{self.meter.peak / 1e9:.1f} GFLOP/s ({self.meter.source}); train step compiled in {self.compile_s:.1f} s")
        self.training_started = True

    def batches(self, position: int):
        return self.train_iterator(start=position)

    def place(self, batch):
        return self.placement.place(batch)

    def step_fn(self, step: int):
        return self.compiled_train_step

    def line(self, step: int, row: dict[str, Any]) -> str:
        shown = f"{100 * row['mfu']:.2f}%" if "mfu" in row else "n/a"
        return (f"step {step}/{self.steps}  loss {row['loss']:.4f}  tokens/s {row.get('tokens_per_s', 0):,.0f}  "
                f"MFU {shown}")

    def at_start(self, state, rest, writer: MetricsWriter, result: LoopResult) -> None:
        if not self.cfg.eval_at_start:
            return
        self.initial_eval = self.evaluate(state["params"], rest)
        if self.initial_eval is not None:
            writer.write({"step": 0, **self.initial_eval})
            say(f"eval at step 0: loss {self.initial_eval['val_loss']:.4f}, perplexity "
                f"{self.initial_eval['val_perplexity']:.2f}")

    def evaluate_at(self, step: int, state, rest, writer: MetricsWriter) -> dict[str, Any] | None:
        """Validation loss / perplexity (MLM: masked-token accuracy) and a sample, said and logged."""
        result = self.evaluate(state["params"], rest)
        if result is not None:
            line = f"eval at step {step}: loss {result['val_loss']:.4f}, perplexity {result['val_perplexity']:.2f}"
            if self.cfg.objective == "mlm":
                line += f", masked-token accuracy {100 * result['val_accuracy']:.2f}%"
            if self.unigram_ppl:
                line += f" (unigram baseline {self.unigram_ppl:.1f})"
            say(line)
        text = self.sample(state["params"], rest)
        if text is not None:
            self.last_sample = text
            say(f"sample at step {step}: {text!r}")
            writer.text("sample", text, step)
        return result

    def run(self) -> Summary:
        """Train from the latest good checkpoint (or from scratch) to ``steps`` (``flaxzoo.train.engine``)."""
        self.initial_eval, self.last_sample, self.compile_s, self.meter = None, None, None, None
        result = run_task(self)
        return Summary(workdir=str(self.workdir), start_step=result.start_step, last_step=result.last_step,
                       stopped_by=result.stopped_by, resumed_from=result.resumed_from, final_eval=result.final_eval,
                       unigram_perplexity=self.unigram_ppl, tokens_per_s=result.tokens_per_s, mfu=result.mfu,
                       cpu_peak_flops=self.meter.peak if self.meter is not None and self.meter.cpu else None,
                       flops_per_token=self.flops_per_token, param_count=self.param_count,
                       trainable_count=self.trainable_count, initial_eval=self.initial_eval,
                       compile_s=self.compile_s, wall_s=time.perf_counter() - self.wall_start,
                       sample=self.last_sample)


def train(config: ConfigDict | TrainConfig, workdir: str | os.PathLike) -> Summary:
    """Check ``config`` (once: :meth:`TrainConfig.from_config_dict`), then train (or resume) in ``workdir``. See the
    module docstring."""
    cfg = config if isinstance(config, TrainConfig) else TrainConfig.from_config_dict(config)
    return Trainer(cfg, workdir).run()
