"""Extractive question answering on the fine-tuning task: ``task="qa"`` (``configs/finetune_qa.py``), BERT's SQuAD
fine-tuning (Devlin et al., 2019, section 4.2).

Everything but the data, the head and the scores is every fine-tune's (``FinetuneTask``: the one training loop's
checkpoints, resume, meshes, several processes, LoRA, layer-wise LR decay, freeze → unfreeze). What differs:

- the data: SQuAD-style JSON files (``data.train_path``; ``data.test_path``, the dev file scored at the end), read
  by ``flaxzoo.train.finetune.spans.read_squad``;
- each question and its context are encoded as a pair with the tokenizer's character offsets, a long context in
  windows of ``data.max_len`` pieces every ``data.doc_stride`` context pieces, the question cut to
  ``data.max_query_length`` pieces; the answer's characters map to its first and last piece in each window that holds
  it, the other windows point at [CLS] (``spans.encode_questions``);
- the model is the family's question-answering class (``BertForQuestionAnswering`` for BERT, RoBERTa and a random
  encoder: a span head ``qa_outputs`` on every token), trained on the mean of the start and end cross-entropies
  (``train/losses.py`` ``span``);
- the prediction of a question is its best span across its windows (start ≤ end, at most
  ``data.max_answer_length`` pieces, inside the context) as the context's characters; the scores are the official
  SQuAD v1.1 evaluation's exact match and F1 (percent): ``eval/metrics.json``, and each dev question with its
  prediction and gold answers in ``eval/predictions.jsonl``.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from flaxzoo.models import BertForQuestionAnswering
from flaxzoo.train.finetune.classifier import classifier_class
from flaxzoo.train.finetune.config import FinetuneConfig
from flaxzoo.train.finetune.spans import (best_answers, encode_questions, read_squad, span_batch, span_epoch_batches,
                                          squad_scores)
from flaxzoo.train.finetune.task import FinetuneTask
from flaxzoo.train.hooks import say
from flaxzoo.train.step import make_predict_spans

LABELS = ("start", "end")  # the span head's two outputs (its num_labels is 2)


class QuestionAnswering(FinetuneTask):
    """One extractive question-answering fine-tune; :meth:`run` trains (or resumes), scores and writes
    everything."""

    MODEL = BertForQuestionAnswering
    OBJECTIVE = "span"
    make_predict = staticmethod(make_predict_spans)  # [batch, 2, seq] start and end logits
    HEADLINE = "f1"  # SQuAD F1

    def __init__(self, cfg: FinetuneConfig, workdir: str | pathlib.Path):
        self.MODEL = classifier_class(cfg, "question_answering")  # the family's own, BERT's by default
        super().__init__(cfg, workdir)

    def _load_data(self) -> tuple[str, ...]:
        data = self.cfg.data
        self.questions = {"train": read_squad(data.train_path), "test": read_squad(data.test_path)}
        self.train_texts = [q.question + " " + q.context for q in self.questions["train"]]
        self.split_description = f"train: {data.train_path}; test: {data.test_path}"
        say(f"data: {self.split_description}; " + " / ".join(f"{len(q)} {split}" for split, q in
                                                                self.questions.items()) + " questions")
        return LABELS

    def _encode(self) -> dict[str, list]:
        data = self.cfg.data
        encoded = {split: encode_questions(self.tokenizer, questions, max_len=self.max_len,
                                           doc_stride=data.doc_stride, max_query_length=data.max_query_length)
                   for split, questions in self.questions.items()}
        outside = sum(1 for w in encoded["train"] if w.start == 0 and w.end == 0)
        say("windows: " + " / ".join(f"{len(w)} {split}" for split, w in encoded.items())
            + f"; {outside} training window(s) without their answer (pointed at [CLS])")
        return encoded

    @property
    def token_types(self) -> bool:
        """Whether the batches carry ``token_type_ids`` (a model with a segment embedding table of 2 or more)."""
        return self.config.type_vocab_size > 1

    def epoch_batches(self, epoch: int, skip: int):
        batches = span_epoch_batches(self.encoded["train"], self.cfg.batch_size, seed=self.cfg.seed, epoch=epoch,
                                     group_by_length=self.cfg.data.group_by_length, max_len=self.max_len,
                                     pad_id=self.config.pad_token_id or 0, token_types=self.token_types)
        for index, batch in enumerate(batches):
            if index >= skip:
                yield {k: v[self.placement.rows] for k, v in batch.items()}

    def answers(self, split: str, params: Any = None, rest: Any = None) -> list[str]:
        """The predicted answer text of each question of ``split`` (the same on every process)."""
        if params is None:
            params, rest = self.state["params"], self.rest
        windows, size = self.encoded[split], self.cfg.eval_batch_size
        starts, ends = [], []
        for at in range(0, len(windows), size):
            chunk = windows[at:at + size]
            batch = span_batch(chunk, size, self.max_len, self.config.pad_token_id or 0, self.token_types)
            keys = ("input_ids", "attention_mask") + (("token_type_ids",) if self.token_types else ())
            local = {k: batch[k][self.eval_placement.rows] for k in keys}
            logits = np.asarray(self.predict(params, rest, self.eval_placement.place(local)))[:len(chunk)]
            for w, row in zip(chunk, logits):
                starts.append(row[0, :len(w.input_ids)])
                ends.append(row[1, :len(w.input_ids)])
        questions = self.questions[split]
        return best_answers(questions, windows, starts, ends, max_answer_length=self.cfg.data.max_answer_length,
                            allow_null=any(q.is_impossible for q in questions))

    def scores(self, split: str, params: Any = None, rest: Any = None) -> tuple[dict[str, float], list[str]]:
        predicted = self.answers(split, params, rest)
        truths = [[text for text, _ in q.answers] for q in self.questions[split]]
        return squad_scores(predicted, truths), predicted

    def evaluate_at(self, step: int, state, rest, writer) -> dict[str, Any] | None:
        return None  # the dev file is scored once, at the end

    def _finish(self, steps: int, train_s: float, validation: dict[str, Any] | None) -> dict[str, Any]:
        """Score the dev file, write ``eval/`` (process 0), export the model (every process joins the save)."""
        found, predicted = self.scores("test")
        metrics = {**found, "split": self.split_description, "test_questions": len(self.questions["test"]),
                   "test_windows": len(self.encoded["test"]), "train_windows": len(self.encoded["train"]),
                   **self.run_figures(steps, train_s)}
        self.export_with_predictions(steps, metrics, lambda: (
            {"id": q.id, "question": q.question, "predicted": guess, "answers": [text for text, _ in q.answers]}
            for q, guess in zip(self.questions["test"], predicted)))
        say(f"test: exact match {metrics['exact_match']:.2f}, F1 {metrics['f1']:.2f} on {metrics['test_questions']} "
            f"questions; {self.workdir / 'eval'}")
        return metrics


__all__ = ["QuestionAnswering"]
