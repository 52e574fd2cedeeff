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
   classifier, ``flaxzoo.models.adapters.lora.merge_lora``). A work directory that holds the finished classifier is left as it
   is: the run says so and ends.
"""

from __future__ import annotations

import itertools
import pathlib
import time
from typing import Any

import jax
import numpy as np

from flaxzoo.models import BertForSequenceClassification
from flaxzoo.models.inference.classifier import encode_for_classification
from flaxzoo.models.inference.text import pad_batch
from flaxzoo.train.finetune.batching import class_weights, epoch_batches, hold_out_validation
from flaxzoo.train.finetune.classifier import classifier_class, packaged_minilm
from flaxzoo.train.finetune.config import FinetuneConfig
from flaxzoo.train.finetune.data import LabelledSplit, load_labelled
from flaxzoo.train.finetune.report import scores, write_report
from flaxzoo.train.finetune.task import FinetuneSummary, FinetuneTask, is_head
from flaxzoo.train.hooks import is_main, say
from flaxzoo.train.step import make_predict_probabilities


class Finetuner(FinetuneTask):
    """One text-classification fine-tune; :meth:`run` trains (or resumes), scores and writes everything."""

    MODEL = BertForSequenceClassification
    OBJECTIVE = "classify"
    make_predict = staticmethod(make_predict_probabilities)  # [batch, num_labels] class probabilities

    def __init__(self, cfg: FinetuneConfig, workdir: str | pathlib.Path):
        self.MODEL = classifier_class(cfg)  # a decoder init_from: its GPTForSequenceClassification
        super().__init__(cfg, workdir)

    def _load_data(self) -> tuple[str, ...]:
        """Read and split the labelled texts (``self.data``), say what they are; the label names. Sets
        ``train_texts`` (what the vocabulary statistics read) and ``split_description``."""
        cfg = self.cfg
        self.data = load_labelled(cfg.data)
        names = self.data.label_names
        if cfg.data.validation_fraction:
            self.data = hold_out_validation(self.data, cfg.data.validation_fraction, cfg.data.split_seed)
        counts = dict(zip(names, self.data.class_counts("train")))
        say(f"data: {self.data.split}; " + " / ".join(f"{len(t)} {s}" for s, t in self.data.texts.items())
            + f" examples; training classes {counts}"
            + "".join(f"; {n} empty {s} text(s) dropped" for s, n in self.data.dropped_empty.items() if n))
        self.train_texts, self.split_description = self.data.texts["train"], self.data.split
        return names

    def _encode(self) -> dict[str, list]:
        """Token ids of each split's examples (``[pieces]`` each)."""
        data = self.cfg.data
        return {split: encode_for_classification(self.tokenizer, texts, max_length=self.max_len,
                                                 truncation=data.truncation, head_tokens=data.head_tokens)
                for split, texts in self.data.texts.items()}

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

    def evaluate_at(self, step: int, state, rest, writer) -> dict[str, Any] | None:
        """Macro-F1 and accuracy on the validation hold-out (``data.validation_fraction``), when there is one."""
        if "validation" not in self.encoded:
            return None
        found = scores(self.data.labels["validation"], self.probabilities("validation", state["params"], rest)
                       .argmax(-1), self.data.label_names)
        say(f"validation at step {step}: macro-F1 {found['macro_f1']:.4f}, accuracy {found['accuracy']:.4f}")
        return {"val_macro_f1": found["macro_f1"], "val_accuracy": found["accuracy"]}

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


def finetune(cfg: FinetuneConfig, workdir: str | pathlib.Path) -> FinetuneSummary:
    """Fine-tune as ``cfg`` says, into ``workdir`` (see the module docstring)."""
    return Finetuner(cfg, workdir).run()


__all__ = ["FinetuneSummary", "Finetuner", "LabelledSplit", "class_weights", "epoch_batches", "finetune", "is_head",
           "packaged_minilm"]
