"""The fine-tuning batches: an epoch's shuffled (optionally length-grouped) batches, each completed to ``batch_size``
rows with weight-0 rows; class weights; the validation split held out of the training split."""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, Sequence

import numpy as np

from flaxzoo.models.inference.text import pad_batch
from flaxzoo.train.finetune.data import LabelledSplit, stratified_split

GROUP = 16  # batches whose examples are sorted by length together (data.group_by_length)


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


class EpochIterator:
    """Global batches from ``position`` on, epoch after epoch: batch ``g`` is batch ``g % steps_per_epoch`` of epoch
    ``g // steps_per_epoch`` (``make_epoch(epoch, skip)`` yields an epoch's batches from its batch ``skip``), so the
    data position is the step. ``position`` is the next batch's index (what a training checkpoint stores)."""

    def __init__(self, make_epoch: Callable[[int, int], Iterator[dict[str, np.ndarray]]], steps_per_epoch: int,
                 position: int = 0):
        self.make_epoch, self.steps_per_epoch, self.position = make_epoch, steps_per_epoch, position
        self.current: Iterator[dict[str, np.ndarray]] | None = None

    def __iter__(self) -> "EpochIterator":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        epoch, index = divmod(self.position, self.steps_per_epoch)
        if self.current is None or index == 0:
            self.current = self.make_epoch(epoch, index)
        self.position += 1
        return next(self.current)
