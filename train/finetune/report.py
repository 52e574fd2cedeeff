"""What a fine-tuning run writes under ``WORKDIR/eval``: ``metrics.json`` (macro-F1, accuracy, scikit-learn's
per-class report, the split), ``confusion_matrix.png`` and ``errors.jsonl`` (the misclassified test examples)."""

from __future__ import annotations

import json
import pathlib
from typing import Any, Sequence

import numpy as np


def scores(true: np.ndarray, predicted: np.ndarray, names: Sequence[str]) -> dict[str, Any]:
    """``macro_f1``, ``accuracy``, ``report`` (``classification_report(output_dict=True)``) and the confusion
    matrix (rows: true class, columns: predicted) of integer labels."""
    from sklearn.metrics import accuracy_score, classification_report, confusion_matrix, f1_score

    labels = list(range(len(names)))
    return {
        "macro_f1": float(f1_score(true, predicted, labels=labels, average="macro", zero_division=0)),
        "accuracy": float(accuracy_score(true, predicted)),
        "report": classification_report(true, predicted, labels=labels, target_names=list(names), output_dict=True,
                                         zero_division=0),
        "confusion_matrix": confusion_matrix(true, predicted, labels=labels).tolist(),
    }


def plot_confusion_matrix(matrix: Sequence[Sequence[int]], names: Sequence[str], path: pathlib.Path,
                          title: str) -> None:
    """A PNG of ``matrix``: class names on both axes, the count in every cell."""
    from matplotlib.figure import Figure  # no pyplot: the caller's backend (a notebook's inline one) is left alone

    counts = np.asarray(matrix)
    size = max(4.0, 0.9 * len(names) + 2.0)
    fig = Figure(figsize=(size, size * 0.9))
    ax = fig.subplots()
    image = ax.imshow(counts, cmap="Blues")
    ax.set_xticks(range(len(names)), labels=names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), labels=names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    threshold = counts.max() / 2 if counts.size else 0
    for i in range(counts.shape[0]):
        for j in range(counts.shape[1]):
            ax.text(j, i, str(counts[i, j]), ha="center", va="center",
                    color="white" if counts[i, j] > threshold else "black")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_errors(path: pathlib.Path, texts: Sequence[str], true: np.ndarray, predicted: np.ndarray,
                 probabilities: np.ndarray, names: Sequence[str]) -> int:
    """One JSON line per misclassified example (``text``, ``true``, ``predicted``, ``probability`` of the
    prediction); returns how many."""
    wrong = np.flatnonzero(true != predicted)
    with open(path, "w") as fh:
        for i in wrong:
            fh.write(json.dumps({"text": texts[i], "true": names[true[i]], "predicted": names[predicted[i]],
                                 "probability": round(float(probabilities[i, predicted[i]]), 4)}) + "\n")
    return len(wrong)


def write_report(eval_dir: pathlib.Path, texts: Sequence[str], true: np.ndarray, probabilities: np.ndarray,
                 names: Sequence[str], extra: dict[str, Any], *, write: bool = True) -> dict[str, Any]:
    """Score the test predictions and write the three files; returns the metrics written (``write=False``: the
    metrics only, as the processes other than process 0 of a multi-process run compute them)."""
    predicted = probabilities.argmax(axis=-1)
    metrics = {**scores(true, predicted, names), "label_names": list(names), "test_examples": int(len(true)),
               **extra}
    if not write:
        return {**metrics, "errors": int((predicted != np.asarray(true)).sum())}
    eval_dir.mkdir(parents=True, exist_ok=True)
    metrics["errors"] = write_errors(eval_dir / "errors.jsonl", texts, true, predicted, probabilities, names)
    plot_confusion_matrix(metrics["confusion_matrix"], names, eval_dir / "confusion_matrix.png",
                          f"test split: macro-F1 {metrics['macro_f1']:.3f}, accuracy {metrics['accuracy']:.3f}")
    (eval_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics
