"""Extractive question answering's data and scores (``task="qa"``, ``flaxzoo.train.finetune.qa``): SQuAD-style JSON
read into questions, each question and its context encoded as a pair in windows over a long context, the answer's
character span mapped to the window's word pieces and back, the best span of a question across its windows, and the
official SQuAD v1.1 evaluation's exact match and F1.

Windows follow BERT's ``run_squad.py``: the question keeps at most ``max_query_length`` word pieces; the context's
pieces are cut into windows of what is left of ``max_len`` after the question and the special tokens, each window
starting ``doc_stride`` pieces after the previous one (so consecutive windows overlap by the room less ``doc_stride``
pieces); a window that does not hold the whole answer points both positions at the first token ([CLS]).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import re
import string
from typing import Iterator, Sequence

import numpy as np
import tokenizers

from flaxzoo.train.finetune.tokens import epoch_order

PUNCTUATION = frozenset(string.punctuation)
CLS_INDEX = 0  # where a window without the answer (and an unanswerable question) points: the first token, [CLS]


@dataclasses.dataclass(frozen=True)
class Question:
    """One SQuAD question: ``answers`` are ``(text, answer_start)`` character spans of ``context`` (none for an
    unanswerable SQuAD 2.0 question, ``is_impossible``)."""

    id: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]
    is_impossible: bool = False


@dataclasses.dataclass(frozen=True)
class Window:
    """One encoded window of a question: ``input_ids`` / ``token_type_ids`` ``[pieces]``; ``offsets[i]`` the
    context characters ``(start, end)`` of piece ``i``, ``None`` outside the context (question, special tokens);
    ``start`` / ``end`` the answer's first and last piece (:data:`CLS_INDEX` when the window does not hold it)."""

    question: int  # index of the question in its split
    input_ids: tuple[int, ...]
    token_type_ids: tuple[int, ...]
    offsets: tuple[tuple[int, int] | None, ...]
    start: int
    end: int


def read_squad(path: str | pathlib.Path) -> list[Question]:
    """The questions of a SQuAD-style JSON file (``{"data": [{"title", "paragraphs": [{"context", "qas": [{"id",
    "question", "answers": [{"text", "answer_start"}], "is_impossible"?}]}]}]}``); ValueError naming the file and the
    entry for a malformed one or an answer that is not at its ``answer_start``."""
    try:
        data = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))["data"]
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: expected SQuAD-style JSON ({{'data': [{{'paragraphs': [...]}}]}}): {exc}") from None
    out = []
    for article in data:
        for paragraph in article.get("paragraphs", []):
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                answers = tuple((a["text"], int(a["answer_start"])) for a in qa.get("answers", []))
                for text, start in answers:
                    if context[start:start + len(text)] != text:
                        raise ValueError(f"{path}: question {qa['id']!r}: answer {text!r} is not at answer_start="
                                         f"{start} of its context (found {context[start:start + len(text)]!r})")
                out.append(Question(str(qa["id"]), qa["question"], context, answers,
                                    bool(qa.get("is_impossible", False))))
    if not out:
        raise ValueError(f"{path}: no questions; expected SQuAD-style JSON with at least one")
    return out


def truncated_question(tokenizer: tokenizers.Tokenizer, question: str, max_query_length: int) -> str:
    """``question`` cut after its ``max_query_length``-th word piece (the text up to that piece's end)."""
    offsets = tokenizer.encode(question, add_special_tokens=False).offsets
    return question if len(offsets) <= max_query_length else question[:offsets[max_query_length - 1][1]]


def answer_pieces(offsets: Sequence[tuple[int, int] | None], start_char: int, end_char: int) -> tuple[int, int]:
    """``(first, last)`` piece of the context characters ``[start_char, end_char)`` in a window whose pieces cover
    ``offsets`` (``None`` outside the context); ``(CLS_INDEX, CLS_INDEX)`` when the window does not hold them all."""
    inside = [i for i, span in enumerate(offsets) if span is not None]
    if not inside or offsets[inside[0]][0] > start_char or offsets[inside[-1]][1] < end_char:
        return CLS_INDEX, CLS_INDEX
    first = next(i for i in inside if offsets[i][1] > start_char)
    last = next(i for i in reversed(inside) if offsets[i][0] < end_char)
    return first, last


def encode_questions(tokenizer: tokenizers.Tokenizer, questions: Sequence[Question], *, max_len: int,
                     doc_stride: int, max_query_length: int) -> list[Window]:
    """Every question's windows (see the module docstring), in question order. The answer trained on is the first
    gold answer (SQuAD's training questions have one)."""
    tok = tokenizers.Tokenizer.from_str(tokenizer.to_str())  # a copy: its truncation settings are set per question
    tok.no_padding()
    special = tok.num_special_tokens_to_add(True)
    windows = []
    for index, q in enumerate(questions):
        question = truncated_question(tok, q.question, max_query_length)
        room = max_len - special - len(tok.encode(question, add_special_tokens=False).ids)
        if room < 1:
            raise ValueError(f"data.max_len={max_len} leaves no room for the context after a question of "
                             f"{max_query_length} pieces and {special} special tokens; expected a larger max_len or "
                             "a smaller data.max_query_length")
        tok.enable_truncation(max_len, stride=max(0, min(room - doc_stride, room - 1)), strategy="only_second")
        first = tok.encode(question, q.context)
        for encoding in [first, *first.overflowing]:
            offsets = tuple(tuple(span) if seq == 1 else None
                            for span, seq in zip(encoding.offsets, encoding.sequence_ids))
            start = end = CLS_INDEX
            if q.answers and not q.is_impossible:
                text, at = q.answers[0]
                start, end = answer_pieces(offsets, at, at + len(text))
            windows.append(Window(index, tuple(encoding.ids), tuple(encoding.type_ids), offsets, start, end))
    return windows


def span_batch(windows: Sequence[Window], num_rows: int, max_len: int, pad_id: int,
               token_types: bool) -> dict[str, np.ndarray]:
    """``windows`` as one batch of ``num_rows`` rows padded to a multiple of 8 pieces (at most ``max_len``):
    ``input_ids``, ``attention_mask`` (and ``token_type_ids`` when ``token_types``) ``[rows, seq]``,
    ``start_positions`` / ``end_positions`` / ``example_weights`` ``[rows]`` (weight 0 on the rows that complete the
    batch)."""
    longest = max((len(w.input_ids) for w in windows), default=1)
    seq = min(max_len, -(-longest // 8) * 8)
    ids = np.full((num_rows, seq), pad_id, np.int32)
    mask, types = np.zeros((num_rows, seq), np.int32), np.zeros((num_rows, seq), np.int32)
    starts, ends, weights = np.zeros(num_rows, np.int32), np.zeros(num_rows, np.int32), np.zeros(num_rows, np.float32)
    for row, w in enumerate(windows):
        n = len(w.input_ids)
        ids[row, :n], mask[row, :n], types[row, :n] = w.input_ids, 1, w.token_type_ids
        starts[row], ends[row], weights[row] = w.start, w.end, 1.0
    batch = {"input_ids": ids, "attention_mask": mask, "start_positions": starts, "end_positions": ends,
             "example_weights": weights}
    if token_types:
        batch["token_type_ids"] = types
    return batch


def span_epoch_batches(windows: Sequence[Window], batch_size: int, *, seed: int, epoch: int, group_by_length: bool,
                       max_len: int, pad_id: int, token_types: bool) -> Iterator[dict[str, np.ndarray]]:
    """The :func:`span_batch` batches of one epoch, in ``tokens.epoch_order`` (the other tasks' order)."""
    for chosen in epoch_order([len(w.input_ids) for w in windows], batch_size, seed=seed, epoch=epoch,
                              group_by_length=group_by_length):
        yield span_batch([windows[i] for i in chosen], batch_size, max_len, pad_id, token_types)


def best_answers(questions: Sequence[Question], windows: Sequence[Window], start_logits: Sequence[np.ndarray],
                 end_logits: Sequence[np.ndarray], *, max_answer_length: int, n_best: int = 20,
                 allow_null: bool = False) -> list[str]:
    """Each question's answer text: the span ``start <= end``, at most ``max_answer_length`` pieces, inside the
    context, with the highest ``start_logit + end_logit`` over the question's windows (among each window's
    ``n_best`` starts and ends, as BERT's ``run_squad.py``), as the context's characters. ``allow_null`` (SQuAD
    2.0): "" when some window's [CLS] score ``start[0] + end[0]`` is higher. ``start_logits[k]`` / ``end_logits[k]``:
    window ``k``'s ``[pieces]`` scores."""
    best: dict[int, tuple[float, str]] = {}
    null: dict[int, float] = {}
    for w, starts, ends in zip(windows, start_logits, end_logits):
        starts, ends = np.asarray(starts, np.float64), np.asarray(ends, np.float64)
        null[w.question] = max(null.get(w.question, -np.inf), starts[CLS_INDEX] + ends[CLS_INDEX])
        n = len(w.offsets)
        top_starts = np.argsort(-starts[:n], kind="stable")[:n_best]
        top_ends = np.argsort(-ends[:n], kind="stable")[:n_best]
        for s in top_starts:
            for e in top_ends:
                if w.offsets[s] is None or w.offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                    continue
                score = starts[s] + ends[e]
                if w.question not in best or score > best[w.question][0]:
                    text = questions[w.question].context[w.offsets[s][0]:w.offsets[e][1]]
                    best[w.question] = (float(score), text)
    out = []
    for i in range(len(questions)):
        score, text = best.get(i, (-np.inf, ""))
        out.append("" if allow_null and null.get(i, -np.inf) > score else text)
    return out


# ================================================================================= the official SQuAD v1.1 scores
def normalize_answer(text: str) -> str:
    """SQuAD v1.1's normalisation: lower case, punctuation removed, the articles a / an / the removed, whitespace
    collapsed to single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, truth: str) -> float:
    """1.0 when the normalised texts are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(truth))


def f1_score(prediction: str, truth: str) -> float:
    """The F1 of the normalised texts' token bags (their multiset intersection); 0 when they share no token (two
    empty texts included, as the v1.1 script)."""
    predicted, true = normalize_answer(prediction).split(), normalize_answer(truth).split()
    same = sum((collections.Counter(predicted) & collections.Counter(true)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(true)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Sequence[str], truths: Sequence[Sequence[str]]) -> dict[str, float]:
    """``{"exact_match", "f1"}`` in percent: each question's best score over its gold answers, averaged. An
    unanswerable question (no gold answer, SQuAD 2.0) scores 1 on both when the prediction is empty, else 0 (the
    v2.0 script's rule: v1.1's F1 would give a correct abstention 0)."""
    if len(predictions) != len(truths) or not truths:
        raise ValueError(f"{len(predictions)} predictions for {len(truths)} questions; expected one per question")
    em = [max(exact_match(p, t) for t in ts) if ts else exact_match(p, "") for p, ts in zip(predictions, truths)]
    f1 = [max(f1_score(p, t) for t in ts) if ts else exact_match(p, "") for p, ts in zip(predictions, truths)]
    return {"exact_match": 100.0 * sum(em) / len(em), "f1": 100.0 * sum(f1) / len(f1)}


__all__ = ["CLS_INDEX", "Question", "Window", "answer_pieces", "best_answers", "encode_questions", "exact_match",
           "f1_score", "normalize_answer", "read_squad", "span_batch", "span_epoch_batches", "squad_scores",
           "truncated_question"]
