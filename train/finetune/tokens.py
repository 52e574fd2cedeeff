"""Token classification (NER, tagging): CoNLL files in, word-piece batches out, entity scores back.

- Reading: :func:`read_conll` reads one file (a token and its tag per line, the tag in the *last* column, so 2-column
  files and 4-column CoNLL-2003 files both work; blank lines between sentences; ``-DOCSTART-`` lines skipped);
  :func:`load_tagged` reads the splits and numbers the tags: ``"O"`` first, then the others sorted (so ``O`` is
  label 0 whenever the training file has it), taken from the training file; a test (or validation) tag the
  training file never shows is refused, naming the file and line.
- Encoding: :func:`encode_tagged` tokenizes each sentence's words with a ``tokenizers.Tokenizer``
  (``is_pretokenized=True``), truncated to ``max_len`` pieces with the special tokens kept, and labels each piece
  by :func:`align_labels`, as Hugging Face's ``run_ner.py`` does: the first piece of a word gets the word's label,
  the other pieces and the special tokens ``IGNORE_INDEX`` (-100, not scored), or with ``label_all_tokens`` the
  word's label too (``B-X`` turned into ``I-X`` by :func:`b_to_i_labels`).
- Batching: ``[batch, seq]`` ``input_ids``, ``attention_mask`` and ``labels`` (int32), ``seq`` a multiple of 8, each
  batch completed to ``batch_size`` rows whose labels are all -100; an epoch is shuffled by ``(seed, epoch)`` exactly
  as ``flaxzoo.train.finetune.batching.epoch_batches`` shuffles a classifier's rows.
- Scoring: :func:`tagging_scores` keeps the positions whose label is not -100 (with batches encoded without
  ``label_all_tokens`` these are the first piece of each word, so the sequences are word-level) and scores them as
  ``seqeval`` does by default (conlleval-compatible, not strict): entities (chunks) of BIO (IOB2) or IOBES tags,
  micro precision / recall / F1, per-type scores, the macro F1 over types and the token accuracy.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Iterator, Sequence

import numpy as np
import tokenizers

from flaxzoo.models.inference.text import pad_batch, plain_tokenizer, truncating_tokenizer
from flaxzoo.train.batches import IGNORE_INDEX
from flaxzoo.train.finetune.batching import GROUP

OUTSIDE = "O"
DOCSTART = "-DOCSTART-"
PREFIXES = ("B", "I", "E", "S")  # BIO (IOB2) and IOBES chunk prefixes


# ======================================================================================================== reading
@dataclasses.dataclass(frozen=True)
class TaggedSentences:
    """The sentences of one file: ``words[i]`` and ``tags[i]`` (strings) have one entry per token."""

    words: list[list[str]]
    tags: list[list[str]]


@dataclasses.dataclass(frozen=True)
class TaggedSplit:
    """Words and integer labels per split (``"train"``, ``"test"``, maybe ``"validation"``): ``labels[split][i]`` is
    an int32 ``[words]`` array for sentence ``words[split][i]``; label ``k`` is ``label_names[k]``."""

    words: dict[str, list[list[str]]]
    labels: dict[str, list[np.ndarray]]
    label_names: tuple[str, ...]


def read_conll(path: str | os.PathLike, known_tags: Sequence[str] | None = None) -> TaggedSentences:
    """The sentences of the CoNLL-style file ``path`` (see the module docstring). ``known_tags``: when given, a tag
    outside them is refused. ValueError naming the file and line for a line with one column, a tag outside
    ``known_tags`` or a file without tokens."""
    known = None if known_tags is None else set(known_tags)
    words: list[list[str]] = []
    tags: list[list[str]] = []
    sentence: tuple[list[str], list[str]] = ([], [])
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error}); expected a CoNLL file") from None
    for number, line in enumerate([*lines, ""], start=1):
        columns = line.split()
        if not columns or columns[0] == DOCSTART:
            if sentence[0]:
                words.append(sentence[0])
                tags.append(sentence[1])
                sentence = ([], [])
            continue
        if len(columns) == 1:
            raise ValueError(f"{path}:{number}: one column {line.strip()!r}; expected a token and its tag separated "
                             "by whitespace (the tag in the last column)")
        if known is not None and columns[-1] not in known:
            raise ValueError(f"{path}:{number}: tag {columns[-1]!r} is not one of the training file's tags "
                             f"{sorted(known)}")
        sentence[0].append(columns[0])
        sentence[1].append(columns[-1])
    if not words:
        raise ValueError(f"{path}: no tokens; expected lines of a token and its tag, sentences separated by blank "
                         "lines (CoNLL)")
    return TaggedSentences(words, tags)


def tag_order(tags: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """The distinct tags of ``tags`` (per sentence): ``"O"`` first when present, then the others sorted."""
    distinct = {tag for sentence in tags for tag in sentence}
    return (OUTSIDE,) * (OUTSIDE in distinct) + tuple(sorted(distinct - {OUTSIDE}))


def load_tagged(train_path: str | os.PathLike, test_path: str | os.PathLike,
                validation_path: str | os.PathLike | None = None) -> TaggedSplit:
    """The splits of CoNLL files, numbered by the training file's tags (:func:`tag_order`); the other files may only
    use those (ValueError naming the file and line otherwise)."""
    train = read_conll(train_path)
    names = tag_order(train.tags)
    index = {name: i for i, name in enumerate(names)}
    paths = {"train": train_path, "test": test_path, "validation": validation_path}
    words, labels = {}, {}
    for split, path in paths.items():
        if path is None:
            continue
        sentences = train if split == "train" else read_conll(path, known_tags=names)
        words[split] = sentences.words
        labels[split] = [np.asarray([index[t] for t in tags], np.int32) for tags in sentences.tags]
    return TaggedSplit(words, labels, names)


# ======================================================================================================= encoding
@dataclasses.dataclass(frozen=True)
class EncodedTags:
    """Per sentence: ``ids[i]`` ``[pieces]`` token ids (special tokens included) and ``labels[i]`` ``[pieces]``
    (``IGNORE_INDEX`` where not scored), both int32; ``dropped_words``: words (over all sentences) without a piece in
    the encoding, so without a scored label: cut by ``max_len`` (as in Hugging Face's recipe), or tokenized to
    nothing."""

    ids: list[np.ndarray]
    labels: list[np.ndarray]
    dropped_words: int


def b_to_i_labels(label_names: Sequence[str]) -> np.ndarray:
    """``[labels]`` int32: label ``k``'s id for the non-first pieces of a word under ``label_all_tokens``: the id of
    ``I-X`` for ``B-X`` when ``I-X`` is a label, else ``k`` itself (Hugging Face's ``b_to_i_label``)."""
    index = {name: i for i, name in enumerate(label_names)}
    return np.asarray([index.get("I-" + name[2:], i) if name.startswith("B-") else i
                       for i, name in enumerate(label_names)], np.int32)


def align_labels(word_ids: Sequence[int | None], word_labels: Sequence[int], label_all_tokens: bool = False,
                 b_to_i: Sequence[int] | None = None) -> np.ndarray:
    """``[pieces]`` int32 labels of one encoded sentence from its ``word_ids`` (``Encoding.word_ids``: a word index
    per piece, None for special tokens) and its ``[words]`` labels: a word's first piece gets the word's label; its
    other pieces ``IGNORE_INDEX``, or with ``label_all_tokens`` the word's label mapped by ``b_to_i`` (default: kept
    as it is); special tokens ``IGNORE_INDEX``."""
    out = np.full(len(word_ids), IGNORE_INDEX, np.int32)
    previous = None
    for position, word in enumerate(word_ids):
        if word is not None and not 0 <= word < len(word_labels):
            raise ValueError(f"word_ids[{position}] = {word}: expected a word index below {len(word_labels)} "
                             "(the number of word labels)")
        if word is not None and word != previous:
            out[position] = word_labels[word]
        elif word is not None and label_all_tokens:
            label = word_labels[word]
            out[position] = label if b_to_i is None else b_to_i[label]
        previous = word
    return out


def encode_tagged(tokenizer: tokenizers.Tokenizer, words: Sequence[Sequence[str]],
                  labels: Sequence[Sequence[int]], *, max_len: int, label_all_tokens: bool = False,
                  b_to_i: Sequence[int] | None = None) -> EncodedTags:
    """Each sentence's ``words`` encoded pre-tokenized, truncated to ``max_len`` pieces (special tokens included and
    kept; the tokenizer's own truncation and padding ignored: a copy is used), with its per-piece labels
    (:func:`align_labels`). ValueError naming a sentence whose words and labels differ in number, or a ``max_len``
    without room for one piece beside the special tokens."""
    if len(words) != len(labels):
        raise ValueError(f"{len(words)} sentences but {len(labels)} label sequences: expected one per sentence")
    for i, (sentence, tags) in enumerate(zip(words, labels)):
        if len(sentence) != len(tags):
            raise ValueError(f"sentence {i}: {len(sentence)} words but {len(tags)} labels; expected one per word")
    special = 0 if tokenizer.post_processor is None else tokenizer.post_processor.num_special_tokens_to_add(False)
    if not isinstance(max_len, (int, np.integer)) or isinstance(max_len, bool) or max_len <= special:
        raise ValueError(f"max_len={max_len!r}: expected an integer above the tokenizer's {special} special tokens")
    encoder = truncating_tokenizer(plain_tokenizer(tokenizer), int(max_len))
    encodings = encoder.encode_batch([list(s) for s in words], is_pretokenized=True) if words else []
    ids, piece_labels, dropped = [], [], 0
    for encoding, tags in zip(encodings, labels):
        ids.append(np.asarray(encoding.ids, np.int32))
        piece_labels.append(align_labels(encoding.word_ids, tags, label_all_tokens, b_to_i))
        dropped += len(tags) - len({w for w in encoding.word_ids if w is not None})
    return EncodedTags(ids, piece_labels, dropped)


# ======================================================================================================= batching
def tagged_batch(rows: Sequence[Sequence[int]], labels: Sequence[Sequence[int]], num_rows: int, max_len: int,
                 pad_id: int) -> dict[str, np.ndarray]:
    """``{"input_ids", "attention_mask", "labels"}``, each ``[num_rows, seq]`` int32: ``rows`` padded to the longest
    (rounded up to a multiple of 8, at most ``max_len``), ``labels`` padded with ``IGNORE_INDEX``, and rows of padding
    (mask 0, labels all ``IGNORE_INDEX``) up to ``num_rows``."""
    ids, mask = pad_batch(rows, pad_id, limit=max_len, num_rows=num_rows)
    padded = np.full(ids.shape, IGNORE_INDEX, np.int32)
    for i, row in enumerate(labels):
        if len(row) != len(rows[i]):
            raise ValueError(f"row {i}: {len(rows[i])} token ids but {len(row)} labels; expected one per token")
        padded[i, :len(row)] = row
    return {"input_ids": ids, "attention_mask": mask, "labels": padded}


def epoch_order(lengths: Sequence[int], batch_size: int, *, seed: int, epoch: int,
                group_by_length: bool) -> list[np.ndarray]:
    """The row indices of each batch of epoch ``epoch``, as ``batching.epoch_batches`` orders them: a permutation
    seeded by ``(seed, epoch)``; with ``group_by_length`` each run of ``GROUP`` batches is sorted by length and the
    batches are shuffled again."""
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: expected a positive integer")
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    if group_by_length:
        sizes = np.asarray(lengths)
        runs = [order[i:i + GROUP * batch_size] for i in range(0, len(order), GROUP * batch_size)]
        order = np.concatenate([run[np.argsort(sizes[run], kind="stable")] for run in runs])
    starts = list(range(0, len(order), batch_size))
    if group_by_length:
        starts = [starts[i] for i in rng.permutation(len(starts))]
    return [order[start:start + batch_size] for start in starts]


def tagged_epoch_batches(rows: Sequence[Sequence[int]], labels: Sequence[Sequence[int]], batch_size: int, *,
                         seed: int, epoch: int, group_by_length: bool, max_len: int,
                         pad_id: int) -> Iterator[dict[str, np.ndarray]]:
    """The :func:`tagged_batch` batches of one epoch: every row once, in :func:`epoch_order`, each batch
    ``batch_size`` rows (the last completed with rows of padding)."""
    for chosen in epoch_order([len(r) for r in rows], batch_size, seed=seed, epoch=epoch,
                              group_by_length=group_by_length):
        yield tagged_batch([rows[i] for i in chosen], [labels[i] for i in chosen], batch_size, max_len, pad_id)


def tagged_batches_in_order(rows: Sequence[Sequence[int]], labels: Sequence[Sequence[int]], batch_size: int, *,
                            max_len: int, pad_id: int) -> Iterator[dict[str, np.ndarray]]:
    """The :func:`tagged_batch` batches of ``rows`` in order (for evaluation), the last completed with padding
    rows."""
    for start in range(0, len(rows), batch_size):
        yield tagged_batch(rows[start:start + batch_size], labels[start:start + batch_size], batch_size, max_len,
                           pad_id)


# ======================================================================================================== scoring
@dataclasses.dataclass(frozen=True)
class EntityScores:
    """Entity-level micro ``precision`` / ``recall`` / ``f1``, ``macro_f1`` (the mean F1 of the types found in the
    true or predicted tags), token ``accuracy``, ``per_type[type] = {"precision", "recall", "f1", "support"}``
    (support: true entities of the type), and the entity counts. A ratio with a zero denominator is 0 (seqeval's
    default)."""

    precision: float
    recall: float
    f1: float
    macro_f1: float
    accuracy: float
    per_type: dict[str, dict[str, float]]
    true_entities: int
    predicted_entities: int
    correct_entities: int


def split_tag(tag: str) -> tuple[str, str]:
    """``(prefix, type)`` of a tag: ``"B-PER"`` → ``("B", "PER")``; ``"O"`` → ``("O", "_")``; a bare ``"B"`` /
    ``"I"`` / ``"E"`` / ``"S"`` has type ``"_"`` (as seqeval). ValueError for any other tag."""
    if tag == OUTSIDE:
        return OUTSIDE, "_"
    prefix, _, kind = tag.partition("-")
    if prefix not in PREFIXES:
        raise ValueError(f"tag {tag!r}: expected 'O' or one of {'/'.join(PREFIXES)} followed by '-' and an entity "
                         "type (BIO or IOBES tags)")
    return prefix, kind or "_"


def entity_chunks(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The entities of one sentence's tags as ``(type, first, last)`` word positions (``last`` included), by
    conlleval's rules (seqeval's default mode). A chunk ends before a tag when the previous tag is ``E`` or ``S``,
    or is ``B``/``I`` and this one is ``B``, ``S`` or ``O``, or the previous tag is inside a chunk and the type
    changes. A chunk starts at a tag that is ``B`` or ``S``, or an ``I``/``E`` after ``O``, ``E`` or ``S``, or a
    non-``O`` tag whose type differs from the previous tag's: so an ``I-X`` after ``O`` or after another type starts
    an entity."""
    chunks = []
    previous, previous_type, first = OUTSIDE, "_", 0
    for position, tag in enumerate([*tags, OUTSIDE]):
        prefix, kind = split_tag(tag)
        inside_before = previous != OUTSIDE
        ends = (previous in ("E", "S") or (previous in ("B", "I") and prefix in ("B", "S", OUTSIDE))
                or (inside_before and previous_type != kind))
        starts = (prefix in ("B", "S") or (prefix in ("I", "E") and previous in (OUTSIDE, "E", "S"))
                  or (prefix != OUTSIDE and previous_type != kind))
        if ends:
            chunks.append((previous_type, first, position - 1))
        if starts:
            first = position
        previous, previous_type = prefix, kind
    return chunks


def _ratio(numerator: float, denominator: float) -> float:
    return float(numerator / denominator) if denominator else 0.0


def _f1(precision: float, recall: float) -> float:
    return _ratio(2 * precision * recall, precision + recall)


def entity_scores(true_tags: Sequence[Sequence[str]], predicted_tags: Sequence[Sequence[str]]) -> EntityScores:
    """:class:`EntityScores` of ``predicted_tags`` against ``true_tags`` (per sentence, tag strings); an entity is
    right when its type, first and last word are. ValueError naming a sentence whose two sequences differ in
    length."""
    if len(true_tags) != len(predicted_tags):
        raise ValueError(f"{len(true_tags)} true but {len(predicted_tags)} predicted sentences: expected as many")
    true, predicted, same, tokens = set(), set(), 0, 0
    for i, (gold, guess) in enumerate(zip(true_tags, predicted_tags)):
        if len(gold) != len(guess):
            raise ValueError(f"sentence {i}: {len(gold)} true tags but {len(guess)} predicted; expected as many")
        true.update((kind, i, a, b) for kind, a, b in entity_chunks(gold))
        predicted.update((kind, i, a, b) for kind, a, b in entity_chunks(guess))
        same += sum(g == p for g, p in zip(gold, guess))
        tokens += len(gold)
    correct = true & predicted
    per_type = {}
    for kind in sorted({e[0] for e in true | predicted}):
        n_true, n_pred = sum(e[0] == kind for e in true), sum(e[0] == kind for e in predicted)
        hits = sum(e[0] == kind for e in correct)
        precision, recall = _ratio(hits, n_pred), _ratio(hits, n_true)
        per_type[kind] = {"precision": precision, "recall": recall, "f1": _f1(precision, recall), "support": n_true}
    precision, recall = _ratio(len(correct), len(predicted)), _ratio(len(correct), len(true))
    macro = _ratio(sum(s["f1"] for s in per_type.values()), len(per_type))
    return EntityScores(precision, recall, _f1(precision, recall), macro, _ratio(same, tokens), per_type, len(true),
                        len(predicted), len(correct))


def word_sequences(predictions: np.ndarray, labels: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``(true, predicted)`` label ids per row of ``[rows, seq]`` ``predictions`` and ``labels``, keeping the
    positions whose label is not ``IGNORE_INDEX``; rows with none (padding rows) are dropped."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.shape != labels.shape or labels.ndim != 2:
        raise ValueError(f"predictions {predictions.shape} and labels {labels.shape}: expected the same [rows, seq]")
    scored = labels != IGNORE_INDEX
    rows = [r for r in range(labels.shape[0]) if scored[r].any()]
    return [labels[r][scored[r]] for r in rows], [predictions[r][scored[r]] for r in rows]


def tagging_scores(predictions: np.ndarray, labels: np.ndarray, label_names: Sequence[str]) -> EntityScores:
    """:func:`entity_scores` of ``[rows, seq]`` argmax ``predictions`` against ``labels`` (``IGNORE_INDEX`` where
    not scored), ids named by ``label_names``. Encode evaluation batches without ``label_all_tokens``, so that the
    scored positions are the first piece of each word (word-level scores, as seqeval's)."""
    names = np.asarray(label_names, dtype=object)
    true, predicted = word_sequences(predictions, labels)
    for ids in (*true, *predicted):
        bad = ids[(ids < 0) | (ids >= len(names))]
        if bad.size:
            raise ValueError(f"label id {int(bad[0])}: expected ids in [0, {len(names)}) (the label_names)")
    return entity_scores([names[t].tolist() for t in true], [names[p].tolist() for p in predicted])


__all__ = ["EncodedTags", "EntityScores", "TaggedSentences", "TaggedSplit", "align_labels", "b_to_i_labels",
           "encode_tagged", "entity_chunks", "entity_scores", "epoch_order", "load_tagged", "read_conll",
           "split_tag", "tag_order", "tagged_batch", "tagged_batches_in_order", "tagged_epoch_batches",
           "tagging_scores", "word_sequences"]
