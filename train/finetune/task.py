"""The fine-tuning task every fine-tune is (``FinetuneTask``): sequence classification (``trainer.Finetuner``) and
token classification (``tagger.Tagger``) say only their data, head and scores; loading, sharding, the optimizer, the
training loop (``flaxzoo.train.engine``), resume and export are here once."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
import time
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from flaxzoo.models import load_tokenizer
from flaxzoo.models.io.checkpoint import find_step_dir, save_checkpoint
from flaxzoo.models.adapters.lora import merge_lora
from flaxzoo.models.config import TransformerConfig
from flaxzoo.train import multihost
from flaxzoo.train import sharding as shardlib
from flaxzoo.train import storage
from flaxzoo.train.config import ConfigError
from flaxzoo.train.data.tokenizers import cached_trained_tokenizer
from flaxzoo.train.finetune import vocab as vocablib
from flaxzoo.train.finetune.config import SCRATCH, FinetuneConfig
from flaxzoo.train.finetune.classifier import (adapt, check_head_trained, describe_classifier, load_classifier_params,
                                               packaged_minilm, trainable_filter)
from flaxzoo.train.engine import LoopSettings, Task, run_task
from flaxzoo.train.finetune.batching import EpochIterator
from flaxzoo.train.hooks import is_main, say, setup_compilation_cache
from flaxzoo.train.optim import make_finetune_optimizer
from flaxzoo.train.program import StepProgram
from flaxzoo.train.tokenizer import KINDS as TOKENIZER_KINDS

def is_head(keys: Sequence[Any]) -> bool:
    """The classifier head: every parameter outside the backbone (the pooler and the classifier)."""
    return "backbone" not in keys


def finetune_program(cfg: FinetuneConfig, config: TransformerConfig, model_class: type, mesh: jax.sharding.Mesh,
                     steps: int, *, objective: str, make_predict: Callable | None = None,
                     prepare_plain: Callable[[Any], Any] | None = None) -> StepProgram:
    """The step program of a fine-tune of ``steps`` steps: ``model_class`` in ``config`` (LoRA-adapted when
    ``lora.*`` asks), the fine-tuning optimizer (layer-wise LR decay, the head's own LR, the encoder frozen for the
    first ``freeze_steps``: a ``"head"`` step variant then moves the head alone), ``objective``'s loss and
    ``make_predict``; batches ``[batch_size, data.max_len]`` (:func:`batch_shapes`). ``prepare_plain``: applied
    to the pretrained weights before they are split (a grown vocabulary)."""
    if cfg.freeze_steps >= steps:
        raise ValueError(f"freeze_steps={cfg.freeze_steps} is not less than the run's {steps} steps ({cfg.epochs} "
                         "epochs): the encoder would never train; expected fewer steps (or more epochs)")
    warmup = round(cfg.warmup_ratio * steps) if cfg.warmup_ratio else cfg.optim.warmup_steps
    optim = dataclasses.replace(cfg.optim, warmup_steps=warmup)
    lora = cfg.lora.spec()
    token_types = cfg.task == "qa" and config.type_vocab_size > 1

    def optimizer(params):
        return make_finetune_optimizer(optim, steps, params, config.num_layers, freeze_steps=cfg.freeze_steps,
                                       is_head=is_head, head_lr=cfg.head_lr or None)

    return StepProgram(
        cfg, mesh, model=lambda seed: model_class(config, rngs=nnx.Rngs(seed)),
        adapt=(lambda model: adapt(lora, cfg, model)) if lora is not None else None, lora=lora,
        trainable=trainable_filter(lora, cfg), optimizer=optimizer, objective=objective,
        variants={"head": is_head} if cfg.freeze_steps else None, batch_size=cfg.batch_size, seed=cfg.seed,
        batch_shapes=lambda rows: batch_shapes(cfg.task, rows, cfg.data.max_len, token_types,
                                               target=cfg.data.target_width, packed=cfg.data.pack_pairs),
        make_predict=make_predict, prepare_plain=prepare_plain)


def batch_shapes(task: str, rows: int, seq: int, token_types: bool = False, *, target: int = 0,
                 packed: bool = False) -> dict[str, tuple[tuple[int, ...], Any]]:
    """``{key: (shape, dtype)}`` of one training batch of ``task`` as its fine-tuner builds it (``token_types``:
    ``qa``'s batches for a model with segment embeddings carry ``token_type_ids``; ``target``: ``seq2seq``'s
    target length; ``packed``: its rows of several pairs, with segment ids on both sides)."""
    tokens = {"input_ids": ((rows, seq), jnp.int32), "attention_mask": ((rows, seq), jnp.int32)}
    if task == "seq2seq":  # flaxzoo.train.finetune.seq2seq.pair_batch / packed_pair_batch
        segments = {"segment_ids": ((rows, seq), jnp.int32),
                    "decoder_segment_ids": ((rows, target), jnp.int32)} if packed else {}
        return {**tokens, **segments, **{key: ((rows, target), jnp.int32)
                                         for key in ("decoder_input_ids", "decoder_attention_mask", "labels")}}
    if task == "qa":  # flaxzoo.train.finetune.spans.span_batch
        types = {"token_type_ids": ((rows, seq), jnp.int32)} if token_types else {}
        return {**tokens, **types, "start_positions": ((rows,), jnp.int32), "end_positions": ((rows,), jnp.int32),
                "example_weights": ((rows,), jnp.float32)}
    if task == "tag":  # a tag per position (IGNORE_INDEX where none is scored): flaxzoo.train.finetune.tokens
        return {**tokens, "labels": ((rows, seq), jnp.int32)}
    return {**tokens, "labels": ((rows,), jnp.int32), "example_weights": ((rows,), jnp.float32)}


@dataclasses.dataclass
class FinetuneSummary:
    workdir: str
    steps: int
    metrics: dict[str, Any] | None  # the test scores (eval/metrics.json); None when stopped before the end
    wall_s: float
    train_s: float
    last_step: int = 0
    resumed_from: int | None = None
    stopped_by: str | None = None  # "SIGTERM" / "SIGINT" when stopped before the last step


class FinetuneTask(Task):
    """What every fine-tuning task shares (a subclass says its data, head and scores): a pretrained encoder (or a
    random one) with a fresh head, loaded shard by shard onto the mesh, trained on the one training loop with the
    recipe's optimizer (layer-wise LR decay, the head alone first, LoRA), exported as a flaxzoo checkpoint.

    A subclass sets ``MODEL`` (the class trained), ``OBJECTIVE`` (its loss in ``train/losses.py``'s ``LOSSES``),
    ``make_predict`` (``(graphdef, placement) -> predict(params, rest, batch)``) and writes ``_load_data`` (sets
    ``data``, ``train_texts``, ``split_description``; returns the label names), ``_encode``, ``epoch_batches``,
    ``evaluate_at`` and ``_finish`` (the test scores and ``eval/``)."""

    MODEL: type
    OBJECTIVE: str
    make_predict: Callable | None
    HEADLINE = "macro_f1"  # the test score a finished work directory's rerun reports (a key of eval/metrics.json)
    FRESH_HEAD = True  # the model gets a new, random head (a classifier); False: every weight is the checkpoint's

    @property
    def MODEL_CLASS(self) -> str:  # noqa: N802 (the name checkpoints record)
        return self.MODEL.__name__

    def __init__(self, cfg: FinetuneConfig, workdir: str | pathlib.Path):
        self.wall_start = time.perf_counter()
        storage.check_paths(workdir, data_dir=cfg.data.data_dir, init_from=cfg.init_from, local_workdir=True,
                            compilation_cache_dir=cfg.compilation_cache_dir)
        self.cfg = cfg
        self.workdir = pathlib.Path(workdir).absolute()
        self.finished = find_step_dir(self.workdir) is not None and (self.workdir / "eval" / "metrics.json").is_file()
        if self.finished:  # run() says so; nothing is loaded
            return
        devices = jax.devices()
        if math.prod(cfg.mesh.shape) != len(devices):
            raise ConfigError("mesh", f"{cfg.mesh.shape} spans {math.prod(cfg.mesh.shape)} devices; this run has "
                                      f"{len(devices)}")
        if is_main():
            self.workdir.mkdir(parents=True, exist_ok=True)
        multihost.barrier("flaxzoo_finetune_workdir")
        multihost.check_shared(self.workdir, "the work directory")
        setup_compilation_cache(cfg)
        self.devices = devices
        self.mesh = shardlib.make_mesh(cfg.mesh.shape, devices)
        names = self._load_data()  # None: a task without labels
        if names is not None and cfg.num_labels and cfg.num_labels != len(names):
            raise ValueError(f"num_labels={cfg.num_labels} disagrees with the data: {len(names)} classes "
                             f"{list(names)}; expected {len(names)} (or 0 to follow the data)")
        config, tokenizer_source = describe_classifier(cfg, names, self.MODEL)
        self.base = None
        if cfg.init_from != SCRATCH:
            from flaxzoo.models.io.sources import open_source

            source = cfg.init_from or packaged_minilm()
            self.base = {"path": str(source), "fingerprint": open_source(source).fingerprint()}
        self.tokenizer = self._tokenizer(tokenizer_source, config.vocab_size)
        self.extension, self.vocabulary = vocablib.apply_settings(cfg.vocab, self.tokenizer, config.vocab_size,
                                                                  config.padded_vocab_size, self.train_texts)
        if self.extension is not None:
            self.tokenizer = self.extension.tokenizer
        loaded_vocab = config.vocab_size
        self.vocab_size = self.extension.vocab_size if self.extension is not None else config.vocab_size
        config = config.replace(vocab_size=self.vocab_size, **({} if names is None else {"label_names": names}),
                                **({} if cfg.dropout < 0 else {"dropout": cfg.dropout}),
                                dtype=cfg.resolved_dtype(), param_dtype="float32")
        if self.tokenizer.get_vocab_size() > config.vocab_size:
            raise ValueError(f"the tokenizer ({tokenizer_source}) has {self.tokenizer.get_vocab_size()} tokens but the "
                             f"model's vocab_size is {config.vocab_size}; expected a tokenizer whose ids fit the "
                             "model's embedding table (the model's own tokenizer)")
        positions = config.max_position_embeddings - config.position_offset
        if config.position in ("learned", "sinusoidal") and self.max_len > positions:
            raise ValueError(f"data.max_len={self.max_len} exceeds the model's {positions} positions; expected at "
                             f"most {positions}")
        self.config = config
        self.lora = cfg.lora.spec()
        if self.lora is not None and self.FRESH_HEAD:  # a target or train_fully entry that selects nothing: stop now
            check_head_trained(self.lora, cfg, nnx.eval_shape(
                lambda: adapt(self.lora, cfg, self.MODEL(config, rngs=nnx.Rngs(0)))))
        self.unsplit: list[str] = []
        self.param_total = sum(x.size for x in jax.tree.leaves(self._plain_abstract(config)))
        loaded = self._plain_abstract(config.replace(vocab_size=loaded_vocab))  # the stored table's rows
        self.params = load_classifier_params(cfg, config.replace(vocab_size=loaded_vocab), shardlib.param_shardings(
            nnx.to_pure_dict(nnx.get_partition_spec(loaded)), nnx.to_pure_dict(loaded), self.mesh, self.unsplit),
            self.MODEL)
        self.encoded = self._encode()

    def _tokenizer(self, source: str, vocab_size: int):
        """The tokenizer at ``source``, or with ``tokenizer`` a kind (``"wordpiece"`` / ``"bpe"``, a model from
        scratch) one of that kind trained on the training texts, at most ``vocab_size`` pieces (the model's table),
        once: cached in ``data.data_dir`` by a hash of the texts, so that every process and every rerun reads the same
        pieces; saved with the model."""
        kind = self.cfg.tokenizer
        if kind not in TOKENIZER_KINDS:
            return load_tokenizer(source)
        digest = hashlib.sha256("\0".join(self.train_texts).encode()).hexdigest()
        trained = cached_trained_tokenizer(lambda: self.train_texts, kind, vocab_size, self.cfg.data.data_dir,
                                           identity=("finetune training texts", digest))
        say(f"tokenizer: {kind}, {trained.vocab_size} pieces trained on the {len(self.train_texts)} training texts")
        return trained.tokenizer

    @property
    def max_len(self) -> int:
        return self.cfg.data.max_len

    # ------------------------------------------------------------------------------------------------- state
    def _plain_abstract(self, config) -> nnx.State:
        """The parameters of a plain (not adapted) classifier in ``config``, as shapes."""
        return nnx.state(nnx.eval_shape(lambda: self.MODEL(config, rngs=nnx.Rngs(0))), nnx.Param)

    def _build(self, steps: int) -> None:
        """The step program (:func:`finetune_program`). The loaded weights become global arrays from host memory
        (each process fills the shards its devices hold), then the trained part and ``rest`` are split off under
        ``jax.jit`` with their shardings (``init_from_plain``): no device holds more than its shards."""
        grow = None
        if self.extension is not None:  # the new words' rows, grown where the sharded table lies
            extension = self.extension
            grow = lambda params: vocablib.grow_table(jax.tree.map(lambda x: x, params), extension)  # noqa: E731

        self.program = program = finetune_program(self.cfg, self.config, self.MODEL, self.mesh, steps,
                                                  objective=self.OBJECTIVE, make_predict=self.make_predict,
                                                  prepare_plain=grow)
        self.unsplit += program.unsplit
        self.graphdef, self.tx, self.schedule = program.graphdef, program.tx, program.schedule
        self.replicated, self.state_shardings, self.rest_shardings = (program.replicated, program.state_shardings,
                                                                      program.rest_shardings)
        self.trained_count, self.target = program.trainable_count, program.target
        self.batch_sharding, self.placement = program.batch_sharding, program.placement
        self.eval_placement = shardlib.BatchPlacement(self.batch_sharding, self.cfg.eval_batch_size)
        self.freeze_steps = self.cfg.freeze_steps
        self.full_step, self.head_step = program.train_step, program.steps.get("head")
        self.predict = program.predict

    def data_position_settings(self) -> dict[str, Any]:
        """The settings that decide which examples batch ``g`` holds (a resume with others is refused)."""
        return {"batch_size": self.cfg.batch_size, "seed": self.cfg.seed, "shuffle": True,
                "group_by_length": self.cfg.data.group_by_length, "max_len": self.max_len,
                "train_examples": len(self.encoded["train"]), "split": self.split_description,
                "vocab_size": self.vocab_size, "epochs": self.cfg.epochs}

    # ---------------------------------------------------------------------------------------- the engine's task
    def identity(self) -> dict[str, Any]:
        return {"model_class": self.MODEL_CLASS, "config": self.config.to_dict(),
                "data": self.data_position_settings(), "base": self.base}

    def initial(self):
        return self.program.init_from_plain(self.params)

    def resumed(self, restored):
        return restored.state, self.program.init_from_plain(self.params)[1]

    def prepare(self, start: int) -> None:
        cfg = self.cfg
        total = self.param_total
        lora = (f" (LoRA rank {self.lora.rank} on {','.join(self.lora.targets)}, alpha {self.lora.alpha:g}: "
                f"{self.trained_count:,} trained, {100 * self.trained_count / total:.2f}%)" if self.lora else "")
        say(f"model: {self.MODEL_CLASS} from {cfg.init_from or 'the packaged all-MiniLM-L6-v2'}, "
            f"{total:,} parameters{lora}, " + (f"{self.config.num_labels} labels, " if self.FRESH_HEAD else "")
            + f"compute {self.config.dtype}, remat "
            f"{self.config.remat}, scan_layers {self.config.scan_layers}; mesh {shardlib.describe(self.mesh)} "
            f"({jax.process_count()} process(es)); {cfg.epochs} epochs x {self.steps_per_epoch} steps of "
            f"{cfg.batch_size}"
            + (f"; head alone for the first {self.freeze_steps} steps" if self.freeze_steps else ""))
        for line in dict.fromkeys(self.unsplit):
            say(f"sharding: {line} (replicated on that axis)")

    def batches(self, position: int) -> EpochIterator:
        return EpochIterator(self.epoch_batches, self.steps_per_epoch, position)

    def place(self, batch):
        return self.placement.place(batch)

    def step_fn(self, step: int):
        return self.head_step if step <= self.freeze_steps else self.full_step

    def with_accuracy(self, step: int) -> bool:
        return True  # a logged row's training accuracy is the mean over its steps

    def row_extra(self, step: int) -> dict[str, Any]:
        return {"epoch": (step - 1) // self.steps_per_epoch + 1, "frozen_encoder": step <= self.freeze_steps}

    def line(self, step: int, row: dict[str, Any]) -> str:
        return (f"step {step}/{self.settings.steps} (epoch {row['epoch']})  loss {row['loss']:.4f}  train accuracy "
                f"{100 * row['accuracy']:.1f}%" + ("  [head only]" if row["frozen_encoder"] else ""))

    def meta(self) -> dict[str, Any]:
        """The training checkpoint's description: what must match for a rerun to resume from it."""
        return {**self.identity(), "train_config": self.cfg.to_json_dict(), "tokenizer": "tokenizer.json"}

    # --------------------------------------------------------------------------------------------------- run
    def run(self) -> FinetuneSummary:
        """Train from the latest training checkpoint (or from the start) on the engine (``flaxzoo.train.engine``),
        then score and export; see the module docstring. A work directory that holds the finished classifier is
        left alone."""
        if self.finished:
            metrics = json.loads((self.workdir / "eval" / "metrics.json").read_text())
            say(f"nothing to do: {self.workdir} holds the finished model (test {self.HEADLINE} "
                f"{metrics.get(self.HEADLINE, float('nan')):.4f}; eval/metrics.json); use another --workdir for a new "
                "run")
            return FinetuneSummary(workdir=str(self.workdir), steps=int(metrics.get("steps", 0)), metrics=metrics,
                                   wall_s=time.perf_counter() - self.wall_start, train_s=0.0,
                                   last_step=int(metrics.get("steps", 0)))
        cfg = self.cfg
        self.steps_per_epoch = -(-len(self.encoded["train"]) // cfg.batch_size)
        steps = cfg.epochs * self.steps_per_epoch
        self.settings = LoopSettings(steps=steps, log_every=cfg.log_every, eval_every=cfg.eval_every,
                                     checkpoint_every=cfg.checkpoint_every, keep_checkpoints=cfg.keep_checkpoints,
                                     profile_steps=cfg.profile_steps, checkpoint_directory="train_checkpoints")
        self._build(steps)
        result = run_task(self)
        summary = FinetuneSummary(workdir=str(self.workdir), steps=steps, metrics=None, wall_s=0.0,
                                  train_s=result.train_s, last_step=result.last_step,
                                  resumed_from=result.resumed_from, stopped_by=result.stopped_by)
        self.state, self.rest = result.state, result.rest
        if summary.stopped_by is None:
            summary.metrics = self._finish(steps, summary.train_s, result.final_eval)
        summary.wall_s = time.perf_counter() - self.wall_start
        return summary

    def run_figures(self, steps: int, train_s: float) -> dict[str, Any]:
        """What every task's ``eval/metrics.json`` says of the run besides its scores."""
        return {"steps": steps, "epochs": self.cfg.epochs, "train_s": round(train_s, 2),
                "trained_parameters": int(self.trained_count), "mesh": list(self.cfg.mesh.shape),
                "config": self.cfg.to_json_dict()}

    def export_with_predictions(self, steps: int, metrics: dict[str, Any],
                                rows: Callable[[], Iterable[dict[str, Any]]]) -> None:
        """Export the model (every process joins), then, on process 0, ``eval/predictions.jsonl`` (``rows()``, one
        JSON object a line) and ``eval/metrics.json``: written after the export, the two together mark a finished
        work directory."""
        self._save(steps)
        if is_main():
            eval_dir = self.workdir / "eval"
            eval_dir.mkdir(parents=True, exist_ok=True)
            with open(eval_dir / "predictions.jsonl", "w") as out:
                for row in rows():
                    out.write(json.dumps(row) + "\n")
            (eval_dir / "metrics.json").write_text(json.dumps(metrics, indent=1))

    def _save(self, steps: int) -> None:
        """The classifier as a flaxzoo checkpoint at the last step (LoRA: merged, a plain classifier), and its
        tokenizer. The weights are gathered onto every process first (a replicated copy), then saved together."""
        gather = jax.jit(lambda params, rest: (params, rest), out_shardings=(self.replicated, self.replicated))
        params, rest = gather(self.state["params"], self.rest)
        model = nnx.merge(self.graphdef, params, rest)
        if self.lora is not None:
            model = merge_lora(model)
        model.eval()
        save_checkpoint(model, self.workdir, step=steps, train_config=self.cfg.to_json_dict())
        if is_main():
            self.tokenizer.save(str(self.workdir / "tokenizer.json"))
        multihost.barrier("flaxzoo_finetune_saved")


__all__ = ["FinetuneSummary", "FinetuneTask", "batch_shapes", "finetune_program", "is_head"]
