"""Token classification (tagging, NER) on the fine-tuning task: ``task="tag"`` (``configs/finetune_ner.py``).

Everything but the data, the head and the scores is every fine-tune's (``FinetuneTask``: the one training loop's
checkpoints, resume, meshes, several processes, LoRA, layer-wise LR decay, freeze → unfreeze). What differs:

- the data: CoNLL files (``data.train_path``, ``data.test_path``, optionally ``data.validation_path``: a token and
  its tag per line, blank lines between sentences; ``flaxzoo.train.finetune.tokens.read_conll``);
- the words are encoded pre-tokenised and each word's tag goes to its first word piece, the other pieces and the
  special tokens ignored (Hugging Face's ``run_ner.py`` alignment);
- the model is the family's token classifier (``BertForTokenClassification`` for BERT, RoBERTa and a random
  encoder; no pooler: the head is the per-token classifier), trained on the
  mean cross-entropy over the labelled pieces (``train/losses.py`` ``token_classify``);
- the scores are seqeval's (conlleval's chunks, micro entity F1, per-type F1, token accuracy) on the word-level tag
  sequences: ``eval/metrics.json``, and each test sentence with its true and predicted tags in
  ``eval/predictions.jsonl``.
"""

from __future__ import annotations

import itertools
import pathlib
from typing import Any

import numpy as np

from flaxzoo.models import BertForTokenClassification
from flaxzoo.train.finetune.classifier import classifier_class
from flaxzoo.train.finetune.config import FinetuneConfig
from flaxzoo.train.finetune.tokens import (encode_tagged, entity_scores, load_tagged, tagged_batches_in_order,
                                           tagged_epoch_batches, word_sequences)
from flaxzoo.train.finetune.task import FinetuneTask
from flaxzoo.train.hooks import say
from flaxzoo.train.step import make_predict_masked


class Tagger(FinetuneTask):
    """One token-classification fine-tune; :meth:`run` trains (or resumes), scores and writes everything."""

    MODEL = BertForTokenClassification
    OBJECTIVE = "token_classify"
    make_predict = staticmethod(make_predict_masked)  # [batch, seq] argmax label ids
    HEADLINE = "f1"  # entity F1 (micro)

    def __init__(self, cfg: FinetuneConfig, workdir: str | pathlib.Path):
        self.MODEL = classifier_class(cfg, "token_classification")  # the family's own, BERT's by default
        super().__init__(cfg, workdir)

    def _load_data(self) -> tuple[str, ...]:
        data = self.cfg.data
        self.data = load_tagged(data.train_path, data.test_path, data.validation_path or None)
        words = self.data.words
        self.train_texts = [" ".join(sentence) for sentence in words["train"]]
        self.split_description = "; ".join(f"{split}: {path}" for split, path in (
            ("train", data.train_path), ("test", data.test_path), ("validation", data.validation_path)) if path)
        say(f"data: {self.split_description}; " + " / ".join(f"{len(s)} {split}" for split, s in words.items())
            + f" sentences; {len(self.data.label_names)} tags {list(self.data.label_names)}")
        return self.data.label_names

    def _encode(self) -> dict[str, list]:
        self.piece_labels, encoded = {}, {}
        for split, words in self.data.words.items():
            found = encode_tagged(self.tokenizer, words, self.data.labels[split], max_len=self.max_len)
            encoded[split], self.piece_labels[split] = found.ids, found.labels
            if found.dropped_words:
                say(f"{split}: {found.dropped_words} word(s) cut off by data.max_len={self.max_len} (not scored)")
        return encoded

    def epoch_batches(self, epoch: int, skip: int):
        data = self.cfg.data
        batches = tagged_epoch_batches(self.encoded["train"], self.piece_labels["train"], self.cfg.batch_size,
                                       seed=self.cfg.seed, epoch=epoch, group_by_length=data.group_by_length,
                                       max_len=self.max_len, pad_id=self.config.pad_token_id or 0)
        for batch in itertools.islice(batches, skip, None):
            yield {k: v[self.placement.rows] for k, v in batch.items()}

    def tag_sequences(self, split: str, params: Any = None, rest: Any = None) -> tuple[list, list]:
        """``(true, predicted)`` word-level tag ids of each sentence of ``split`` (the same on every process)."""
        if params is None:
            params, rest = self.state["params"], self.rest
        true, predicted = [], []
        for batch in tagged_batches_in_order(self.encoded[split], self.piece_labels[split], self.cfg.eval_batch_size,
                                             max_len=self.max_len, pad_id=self.config.pad_token_id or 0):
            local = {k: batch[k][self.eval_placement.rows] for k in ("input_ids", "attention_mask")}
            argmax = np.asarray(self.predict(params, rest, self.eval_placement.place(local)))
            gold, guess = word_sequences(argmax, batch["labels"])
            true += gold
            predicted += guess
        return true, predicted

    def scores(self, split: str, params: Any = None, rest: Any = None) -> dict[str, Any]:
        names = np.asarray(self.data.label_names, dtype=object)
        true, predicted = self.tag_sequences(split, params, rest)
        found = entity_scores([names[t].tolist() for t in true], [names[p].tolist() for p in predicted])
        return {"f1": found.f1, "precision": found.precision, "recall": found.recall, "macro_f1": found.macro_f1,
                "accuracy": found.accuracy, "per_type": found.per_type, "entities": found.true_entities,
                "predicted_entities": found.predicted_entities, "correct_entities": found.correct_entities}

    def evaluate_at(self, step: int, state, rest, writer) -> dict[str, Any] | None:
        """Entity F1 and token accuracy on ``data.validation_path``, when there is one."""
        if "validation" not in self.encoded:
            return None
        found = self.scores("validation", state["params"], rest)
        say(f"validation at step {step}: entity F1 {found['f1']:.4f}, token accuracy {found['accuracy']:.4f}")
        return {"val_f1": found["f1"], "val_accuracy": found["accuracy"]}

    def _finish(self, steps: int, train_s: float, validation: dict[str, Any] | None) -> dict[str, Any]:
        """Score the test file, write ``eval/`` (process 0), export the tagger (every process joins the save)."""
        metrics = {**self.scores("test"), "label_names": list(self.data.label_names), "split": self.split_description,
                   "test_sentences": len(self.encoded["test"]), **self.run_figures(steps, train_s)}
        if validation is not None:
            metrics["validation"] = {"f1": validation["val_f1"], "accuracy": validation["val_accuracy"]}

        def rows():
            names, (true, predicted) = self.data.label_names, self.tag_sequences("test")
            for words, gold, guess in zip(self.data.words["test"], true, predicted):
                yield {"words": words, "true": [names[i] for i in gold], "predicted": [names[i] for i in guess]}

        self.export_with_predictions(steps, metrics, rows)
        say(f"test: entity F1 {metrics['f1']:.4f} (precision {metrics['precision']:.4f}, recall "
            f"{metrics['recall']:.4f}), token accuracy {metrics['accuracy']:.4f} on {metrics['test_sentences']} "
            f"sentences; {self.workdir / 'eval'}")
        return metrics


__all__ = ["Tagger"]
