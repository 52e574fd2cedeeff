"""The TF-IDF baseline of ``train/finetune/baselines.py`` on a small separable synthetic split (the torch and
frozen-encoder baselines are too slow for the suite; ``python -m flaxzoo.train.finetune.baselines`` runs them)."""

import dataclasses

import numpy as np
import pytest

from flaxzoo.train.finetune.baselines import tfidf_baseline

TOPICS = {"sport": ["match", "goal", "striker", "league", "coach"],
          "money": ["shares", "bank", "profit", "market", "inflation"],
          "tech": ["software", "chip", "broadband", "phone", "robot"]}
FILLER = ["the", "new", "after", "big", "week", "report", "says", "over"]


@dataclasses.dataclass(frozen=True)
class Split:
    texts: dict
    labels: dict
    label_names: tuple
    split: str


def synthetic_split(class_sizes: tuple[int, ...], seed: int) -> Split:
    """Sentences of two topic words and three fillers, every fourth one in the test split; two test labels are
    then flipped, so the (unequal) classes score below 1 and macro-F1 differs from accuracy."""
    rng = np.random.default_rng(seed)
    texts, labels = {"train": [], "test": []}, {"train": [], "test": []}
    for label, (words, size) in enumerate(zip(TOPICS.values(), class_sizes)):
        for i in range(size):
            part = "test" if i % 4 == 0 else "train"
            sentence = list(rng.choice(words, 2, replace=False)) + list(rng.choice(FILLER, 3))
            texts[part].append(" ".join(rng.permutation(sentence)))
            labels[part].append(label)
    labels["test"][0], labels["test"][-1] = 1, 0
    return Split(texts, {k: np.asarray(v, np.int64) for k, v in labels.items()}, tuple(TOPICS), "synthetic")


def numpy_macro_f1(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> float:
    f1 = []
    for c in range(n_classes):
        tp = np.sum((y_pred == c) & (y_true == c))
        fp, fn = np.sum((y_pred == c) & (y_true != c)), np.sum((y_pred != c) & (y_true == c))
        f1.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(f1))


def test_tfidf_baseline_scores_its_own_predictions():
    split = synthetic_split(class_sizes=(60, 40, 24), seed=0)
    row = tfidf_baseline(split)
    predictions, truth = np.asarray(row["test_predictions"]), split.labels["test"]
    assert row["method"] == "tfidf" and predictions.shape == truth.shape
    assert row["macro_f1"] == pytest.approx(numpy_macro_f1(truth, predictions, len(split.label_names)), abs=1e-12)
    assert row["accuracy"] == pytest.approx(float(np.mean(predictions == truth)), abs=1e-12)
    assert 0.9 < row["macro_f1"] < 1.0 and row["macro_f1"] != pytest.approx(row["accuracy"])
    assert row["n_train"] == 93 and row["n_test"] == 31 and row["wall_s"] >= 0
    assert {"cpu", "torch", "transformers", "sklearn"} <= row.keys()
