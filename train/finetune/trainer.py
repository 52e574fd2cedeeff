"""The fine-tuning job behind ``python -m flaxzoo.train --config configs/finetune_cls.py``: a pretrained encoder
becomes a text classifier, trained as a task of the one training loop pre-training runs on
(``flaxzoo.train.engine``: the same checkpoints, resume, stop signal, metrics, NaN check, evaluation cadence and
profiler).

1. check the config (``train/finetune/config.py``), then read and split the labelled data (``data.py``, cached);
2. load the encoder as a ``BertForSequenceClassification`` (``models.from_pretrained``: the pooler and classifier it
   lacks are initialised), or build one from ``model.*`` for ``init_from="scratch"``;
3. optionally extend the vocabulary (``vocab.py``) and report how the tokenizer cuts the words before and after;
4. train for ``epochs`` over the shuffled training split on the mesh of ``mesh.*`` (parameters and optimizer state
   sharded as in pre-training: ``fsdp`` / ``tensor`` split them, ``data`` x ``fsdp`` the batch; each process places
   the rows its devices hold): AdamW with global-norm clipping, a warmup + decay schedule, layer-wise LR decay, the
   head alone for ``freeze_steps`` steps (its own compiled step: no backward pass through the encoder), class
   weights; batches padded to a multiple of 8 tokens, the last batch of an epoch completed with rows of weight 0
   (``batching.py``). With LoRA (``lora.rank`` > 0) the trained state holds the adapters and the head only: the
   encoder's weights are frozen in ``rest``, as in pre-training;
5. every ``checkpoint_every`` steps an async orbax checkpoint of the training state in ``WORKDIR/train_checkpoints``
   (after the losses up to it were checked finite); a rerun resumes from the latest one bit for bit (the step's
   dropout key is ``fold_in(seed, step)``, epoch ``e``'s order a function of ``(seed, e)``). SIGTERM / SIGINT stop
   after the current step with a checkpoint (agreed across processes); a non-finite loss stops the run;
6. score the held-out test split once, at the end (it never selects anything), and write ``WORKDIR/eval/``
   (``report.py``), ``WORKDIR/metrics.jsonl`` and TensorBoard events (the training curve), the tokenizer and a
   flaxzoo checkpoint that ``models.from_pretrained(WORKDIR)`` loads as the classifier (with LoRA: the merged
   classifier, ``flaxzoo.models.lora.merge_lora``). A work directory that holds the finished classifier is left as it
   is: the run says so and ends.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import pathlib
import time
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx

from flaxzoo.models import BertForSequenceClassification, load_tokenizer
from flaxzoo.models.checkpoint import find_step_dir, save_checkpoint
from flaxzoo.models.lora import merge_lora
from flaxzoo.models.text import encode_for_classification, pad_batch
from flaxzoo.train import multihost
from flaxzoo.train import sharding as shardlib
from flaxzoo.train import storage
from flaxzoo.train.config import ConfigError
from flaxzoo.train.finetune import vocab as vocablib
from flaxzoo.train.finetune.config import SCRATCH, FinetuneConfig
from flaxzoo.train.finetune.classifier import (adapt, check_head_trained, describe_classifier, load_classifier_params,
                                               packaged_minilm, trainable_filter)
from flaxzoo.train.engine import LoopSettings, Task, run_task
from flaxzoo.train.finetune.batching import EpochIterator, class_weights, epoch_batches, hold_out_validation
from flaxzoo.train.finetune.data import LabelledSplit, load_labelled
from flaxzoo.train.finetune.report import scores, write_report
from flaxzoo.train.hooks import is_main, say, setup_compilation_cache
from flaxzoo.train.optim import make_finetune_optimizer
from flaxzoo.train.step import make_predict_probabilities, make_train_step, new_train_state

def is_head(keys: Sequence[Any]) -> bool:
    """The classifier head: every parameter outside the backbone (the pooler and the classifier)."""
    return "backbone" not in keys


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


class Finetuner(Task):
    """One fine-tuning run; :meth:`run` trains (or resumes), scores and writes everything."""

    MODEL_CLASS = BertForSequenceClassification.__name__

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
        self.data = load_labelled(cfg.data)
        names = self.data.label_names
        if cfg.num_labels and cfg.num_labels != len(names):
            raise ValueError(f"num_labels={cfg.num_labels} disagrees with the data: {len(names)} classes "
                             f"{list(names)}; expected {len(names)} (or 0 to follow the data)")
        if cfg.data.validation_fraction:
            self.data = hold_out_validation(self.data, cfg.data.validation_fraction, cfg.data.split_seed)
        counts = dict(zip(names, self.data.class_counts("train")))
        say(f"data: {self.data.split}; " + " / ".join(f"{len(t)} {s}" for s, t in self.data.texts.items())
            + f" examples; training classes {counts}"
            + "".join(f"; {n} empty {s} text(s) dropped" for s, n in self.data.dropped_empty.items() if n))
        config, tokenizer_source = describe_classifier(cfg, names)
        self.base = None
        if cfg.init_from != SCRATCH:
            from flaxzoo.models.hub.sources import open_source

            source = cfg.init_from or packaged_minilm()
            self.base = {"path": str(source), "fingerprint": open_source(source).fingerprint()}
        self.tokenizer = load_tokenizer(tokenizer_source)
        self.extension, self.vocabulary = vocablib.apply_settings(cfg.vocab, self.tokenizer, config.vocab_size,
                                                                  config.padded_vocab_size, self.data.texts["train"])
        if self.extension is not None:
            self.tokenizer = self.extension.tokenizer
        loaded_vocab = config.vocab_size
        self.vocab_size = self.extension.vocab_size if self.extension is not None else config.vocab_size
        config = config.replace(vocab_size=self.vocab_size, label_names=names,
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
        if self.lora is not None:  # a target or a train_fully entry that selects nothing: stop before any compile
            check_head_trained(self.lora, cfg, nnx.eval_shape(
                lambda: adapt(self.lora, cfg, BertForSequenceClassification(config, rngs=nnx.Rngs(0)))))
        self.unsplit: list[str] = []
        self.param_total = sum(x.size for x in jax.tree.leaves(self._plain_abstract(config)))
        loaded = self._plain_abstract(config.replace(vocab_size=loaded_vocab))  # the stored table's rows
        self.params = load_classifier_params(cfg, config.replace(vocab_size=loaded_vocab), shardlib.param_shardings(
            nnx.to_pure_dict(nnx.get_partition_spec(loaded)), nnx.to_pure_dict(loaded), self.mesh, self.unsplit))
        self.encoded = {split: encode_for_classification(self.tokenizer, texts, max_length=self.max_len,
                                                         truncation=cfg.data.truncation,
                                                         head_tokens=cfg.data.head_tokens)
                        for split, texts in self.data.texts.items()}

    @property
    def max_len(self) -> int:
        return self.cfg.data.max_len

    # ------------------------------------------------------------------------------------------------- state
    @staticmethod
    def _plain_abstract(config) -> nnx.State:
        """The parameters of a plain (not adapted) classifier in ``config``, as shapes."""
        return nnx.state(nnx.eval_shape(lambda: BertForSequenceClassification(config, rngs=nnx.Rngs(0))), nnx.Param)

    def _classifier(self) -> BertForSequenceClassification:
        """A fresh classifier (with LoRA: adapted); traced inside ``jax.jit`` / ``nnx.eval_shape``."""
        model = BertForSequenceClassification(self.config, rngs=nnx.Rngs(self.cfg.seed))
        return adapt(self.lora, self.cfg, model) if self.lora is not None else model

    def _build(self, steps: int) -> None:
        """Shardings, the sharded train state and the jitted steps. The loaded weights become global arrays from
        host memory (each process fills the shards its devices hold), then the trained part and ``rest`` are split
        off under ``jax.jit`` with their shardings: no device holds more than its shards."""
        cfg, config, mesh = self.cfg, self.config, self.mesh
        plain_graphdef = nnx.graphdef(nnx.eval_shape(lambda: BertForSequenceClassification(config, rngs=nnx.Rngs(0))))
        abstract = nnx.eval_shape(self._classifier)
        self.graphdef, abstract_trained, abstract_rest = nnx.split(abstract, trainable_filter(self.lora, self.cfg), ...)
        trained_logical = nnx.to_pure_dict(nnx.get_partition_spec(abstract_trained))
        abstract_trained = nnx.to_pure_dict(abstract_trained)
        param_shardings = shardlib.param_shardings(trained_logical, abstract_trained, mesh, self.unsplit)
        self.replicated = shardlib.replicated(mesh)
        self.rest_shardings = (shardlib.variable_shardings(abstract_rest, mesh, self.unsplit)
                               if self.lora is not None else jax.tree.map(lambda _: self.replicated, abstract_rest))
        self.trained_count = sum(x.size for x in jax.tree.leaves(abstract_trained))
        warmup = round(cfg.warmup_ratio * steps) if cfg.warmup_ratio else cfg.optim.warmup_steps
        optim = dataclasses.replace(cfg.optim, warmup_steps=warmup)
        if cfg.freeze_steps >= steps:
            raise ValueError(f"freeze_steps={cfg.freeze_steps} is not less than the run's {steps} steps ({cfg.epochs} "
                             "epochs): the encoder would never train; expected fewer steps (or more epochs)")
        self.freeze_steps = cfg.freeze_steps
        self.tx, self.schedule = make_finetune_optimizer(optim, steps, abstract_trained, config.num_layers,
                                                         freeze_steps=self.freeze_steps, is_head=is_head,
                                                         head_lr=cfg.head_lr or None)
        abstract_state = jax.eval_shape(lambda p: new_train_state(p, self.tx, cfg.seed), abstract_trained)
        self.state_shardings = {"params": param_shardings, "step": self.replicated, "rng": self.replicated,
                                "opt_state": shardlib.tree_shardings_like(abstract_state["opt_state"],
                                                                          abstract_trained, param_shardings, mesh)}
        self.target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state,
                                   self.state_shardings)
        self.batch_sharding = shardlib.batch_sharding(mesh)
        self.placement = shardlib.BatchPlacement(self.batch_sharding, cfg.batch_size)
        self.eval_placement = shardlib.BatchPlacement(self.batch_sharding, cfg.eval_batch_size)

        def split(params):
            if self.extension is not None:  # the new words' rows, grown where the sharded table lies
                params = vocablib.grow_table(jax.tree.map(lambda x: x, params), self.extension)
            model = nnx.merge(plain_graphdef, params, nnx.split(
                BertForSequenceClassification(config, rngs=nnx.Rngs(cfg.seed)), nnx.Param, ...)[2])
            if self.lora is not None:
                model = adapt(self.lora, self.cfg, model)
            _, trained, rest = nnx.split(model, trainable_filter(self.lora, self.cfg), ...)
            return new_train_state(nnx.to_pure_dict(trained), self.tx, cfg.seed), rest

        self.initial_state = jax.jit(split, out_shardings=(self.state_shardings, self.rest_shardings))
        activations = shardlib.activation_placement(mesh)
        shardings = (self.state_shardings, self.rest_shardings, self.batch_sharding, self.replicated)

        def jit_step(trainable):
            return jax.jit(make_train_step(self.graphdef, self.tx, self.schedule, objective="classify",
                                           trainable=trainable, grad_shardings=param_shardings,
                                           placement=activations),
                           in_shardings=shardings, out_shardings=(self.state_shardings, self.replicated),
                           donate_argnums=(0,))

        self.full_step = jit_step(None)
        self.head_step = jit_step(is_head) if self.freeze_steps else None
        self.predict = jax.jit(make_predict_probabilities(self.graphdef, activations),
                               in_shardings=(param_shardings, self.rest_shardings, self.batch_sharding),
                               out_shardings=self.replicated)

    def epoch_batches(self, epoch: int, skip: int):
        """This process's rows of epoch ``epoch``'s training batches (:func:`epoch_batches`), from batch ``skip``."""
        labels = self.data.labels["train"]
        weights = class_weights(labels, len(self.data.label_names), self.cfg.class_weights)
        batches = epoch_batches(self.encoded["train"], labels, weights[labels], self.cfg.batch_size,
                                seed=self.cfg.seed, epoch=epoch, group_by_length=self.cfg.data.group_by_length,
                                max_len=self.max_len, pad_id=self.config.pad_token_id or 0)
        for batch in itertools.islice(batches, skip, None):
            yield {k: v[self.placement.rows] for k, v in batch.items()}

    def probabilities(self, split: str, params: Any = None, rest: Any = None) -> np.ndarray:
        """``[examples, num_labels]`` class probabilities of ``split``, in order (the same on every process), by
        ``params`` / ``rest`` (default: the trained state's)."""
        if params is None:
            params, rest = self.state["params"], self.rest
        rows, size = self.encoded[split], self.cfg.eval_batch_size
        out = []
        for start in range(0, len(rows), size):
            chunk = rows[start:start + size]
            ids, mask = pad_batch(chunk, self.config.pad_token_id or 0, limit=self.max_len, num_rows=size)
            local = {"input_ids": ids[self.eval_placement.rows], "attention_mask": mask[self.eval_placement.rows]}
            out.append(np.asarray(self.predict(params, rest, self.eval_placement.place(local)))[:len(chunk)])
        return np.concatenate(out)

    def data_position_settings(self) -> dict[str, Any]:
        """The settings that decide which examples batch ``g`` holds (a resume with others is refused)."""
        return {"batch_size": self.cfg.batch_size, "seed": self.cfg.seed, "shuffle": True,
                "group_by_length": self.cfg.data.group_by_length, "max_len": self.max_len,
                "train_examples": len(self.encoded["train"]), "split": self.data.split,
                "vocab_size": self.vocab_size, "epochs": self.cfg.epochs}

    # ---------------------------------------------------------------------------------------- the engine's task
    def identity(self) -> dict[str, Any]:
        return {"model_class": self.MODEL_CLASS, "config": self.config.to_dict(),
                "data": self.data_position_settings(), "base": self.base}

    def initial(self):
        return self.initial_state(self.params)

    def resumed(self, restored):
        return restored.state, self.initial_state(self.params)[1]

    def prepare(self, start: int) -> None:
        cfg = self.cfg
        total = self.param_total
        lora = (f" (LoRA rank {self.lora.rank} on {','.join(self.lora.targets)}, alpha {self.lora.alpha:g}: "
                f"{self.trained_count:,} trained, {100 * self.trained_count / total:.2f}%)" if self.lora else "")
        say(f"model: {self.MODEL_CLASS} from {cfg.init_from or 'the packaged all-MiniLM-L6-v2'}, "
            f"{total:,} parameters{lora}, {self.config.num_labels} labels, compute {self.config.dtype}, remat "
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

    def evaluate_at(self, step: int, state, rest, writer) -> dict[str, Any] | None:
        """Macro-F1 and accuracy on the validation hold-out (``data.validation_fraction``), when there is one."""
        if "validation" not in self.encoded:
            return None
        found = scores(self.data.labels["validation"], self.probabilities("validation", state["params"], rest)
                       .argmax(-1), self.data.label_names)
        say(f"validation at step {step}: macro-F1 {found['macro_f1']:.4f}, accuracy {found['accuracy']:.4f}")
        return {"val_macro_f1": found["macro_f1"], "val_accuracy": found["accuracy"]}

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
            say(f"nothing to do: {self.workdir} holds the finished classifier (test macro-F1 "
                f"{metrics.get('macro_f1', float('nan')):.4f}; eval/metrics.json); use another --workdir for a new run")
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

    def _finish(self, steps: int, train_s: float, validation: dict[str, Any] | None) -> dict[str, Any]:
        """Score the test split, write ``eval/`` (process 0), export the classifier (every process joins the save)."""
        cfg = self.cfg
        probabilities = self.probabilities("test", self.state["params"], self.rest)
        extra = {"split": self.data.split, "train_examples": len(self.encoded["train"]),
                 "dropped_empty": self.data.dropped_empty,
                 "class_weights": dict(zip(self.data.label_names,
                                           class_weights(self.data.labels["train"], len(self.data.label_names),
                                                         cfg.class_weights).round(4).tolist())),
                 "vocabulary": self.vocabulary, "steps": steps, "epochs": cfg.epochs, "train_s": round(train_s, 2),
                 "trained_parameters": int(self.trained_count), "processes": jax.process_count(),
                 "mesh": list(cfg.mesh.shape), "backend": jax.default_backend(), "config": cfg.to_json_dict()}
        if validation is None and "validation" in self.encoded:  # resumed after the last step: not evaluated yet
            validation = self.evaluate_at(steps, self.state, self.rest, None)
        if validation is not None:  # the engine's evaluation at the last step
            extra["validation"] = {"macro_f1": validation["val_macro_f1"], "accuracy": validation["val_accuracy"]}
            extra["validation_examples"] = len(self.encoded["validation"])
        self._save(steps)
        extra["wall_s"] = round(time.perf_counter() - self.wall_start, 2)
        # eval/metrics.json after the export: the two together mark a finished work directory (process 0 writes)
        metrics = write_report(self.workdir / "eval", self.data.texts["test"], self.data.labels["test"],
                               probabilities, self.data.label_names, extra, write=is_main())
        say(f"test: macro-F1 {metrics['macro_f1']:.4f}, accuracy {metrics['accuracy']:.4f} on "
            f"{metrics['test_examples']} examples ({metrics['errors']} wrong: eval/errors.jsonl); {steps} steps in "
            f"{train_s:.1f} s, {extra['wall_s']:.1f} s in all; {self.workdir / 'eval'}")
        return metrics

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


def finetune(cfg: FinetuneConfig, workdir: str | pathlib.Path) -> FinetuneSummary:
    """Fine-tune as ``cfg`` says, into ``workdir`` (see the module docstring)."""
    return Finetuner(cfg, workdir).run()


__all__ = ["FinetuneSummary", "Finetuner", "LabelledSplit", "class_weights", "epoch_batches", "finetune",
           "packaged_minilm"]
