"""Tokenized documents packed into fixed-length records, with per-token document numbers, and the cached packed
dataset (:func:`prepare`).

- ``causal`` (:func:`pack_causal`): the stream ``doc_1 EOS doc_2 EOS ...`` is cut into windows of ``seq_len + 1``
  tokens that overlap by one token (window ``k`` = ``stream[k*T : k*T + T + 1]``); no padding anywhere; the
  incomplete tail (< T tokens) is dropped. Each record also holds ``segment_ids`` ``[T + 1]``: the document of each
  token, numbered from 1 within the window (an EOS belongs to the document it ends). A batch row is
  ``input_ids = w[:-1]``, ``targets = w[1:]``, and a target whose document differs from its input's (a prediction
  across a document boundary) is not scored (see :mod:`flaxzoo.train.data.loader`).
- ``mlm`` (:func:`pack_mlm`): a row holds one or more segments ``[CLS] whole sentences of one document [SEP]``, then
  padding (segment 0) to ``seq_len``. Sentences are packed greedily, in order; a sentence never straddles two rows
  unless it alone exceeds ``seq_len - 2`` tokens (then it is cut into pieces of that length); sentences of
  different documents never share a segment. Records hold ``input_ids`` and ``segment_ids`` ``[T]`` (segments
  numbered from 1 within the row, 0 = padding).

The packed dataset (TFDS ``flaxzoo_packed``) is keyed by a hash of the corpus, the tokenizer, ``seq_len``, the
objective and :data:`PACK_FORMAT_VERSION`.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import tensorflow_datasets as tfds

from flaxzoo.train.data.builders import FlaxzooPacked, RawCorpus, cache_key, file_lock, prepare_builder, quiet_tfds, \
    raw_sources
from flaxzoo.train.data.config import DataConfig
from flaxzoo.train.data.corpus import split_sentences
from flaxzoo.train.data.tokenizers import build_tokenizer, check_tokenizer
from flaxzoo.train.tokenizer import TextTokenizer

PACK_FORMAT_VERSION = 2  # bump when the record layout changes: new cache keys (2: per-token segment_ids)


# ------------------------------------------------------------------------------------------------- packers
def pack_causal(docs_ids: Iterable[Sequence[int]], seq_len: int,
                eos_id: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(window, segment_ids)`` pairs, both ``[seq_len + 1]`` int32. Windows cover the stream
    ``doc_1 EOS doc_2 EOS ...``; window ``k`` is ``stream[k*seq_len : k*seq_len + seq_len + 1]`` (consecutive windows
    share one token, so the inputs ``w[:-1]`` of all windows are the stream, every token exactly once, in order).
    ``segment_ids`` numbers the documents of a window from 1 (the EOS after a document is part of it). The tail that
    does not fill a window is dropped. Empty documents are skipped."""
    if seq_len < 1:
        raise ValueError(f"seq_len={seq_len}: expected a positive integer")
    pending = np.empty(0, np.int32)
    docs = np.empty(0, np.int64)
    eos = np.array([eos_id], np.int32)
    number = 0
    for ids in docs_ids:
        if len(ids) == 0:
            continue
        number += 1
        piece = np.concatenate([np.asarray(ids, np.int32), eos])
        pending = np.concatenate([pending, piece])
        docs = np.concatenate([docs, np.full(len(piece), number, np.int64)])
        n = (len(pending) - 1) // seq_len
        for k in range(n):
            window = slice(k * seq_len, k * seq_len + seq_len + 1)
            d = docs[window]
            yield pending[window].copy(), (d - d[0] + 1).astype(np.int32)
        if n:
            pending, docs = pending[n * seq_len:], docs[n * seq_len:]


def pack_mlm(documents: Iterable[Iterable[Sequence[int]]], seq_len: int, *, cls_id: int, sep_id: int,
             pad_id: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(input_ids, segment_ids)`` rows of ``seq_len`` tokens from ``documents`` (each an iterable of sentences,
    each a sequence of token ids): segments ``[CLS] sentences [SEP]`` of one document each, packed greedily in order,
    then ``pad_id`` (segment 0). A sentence longer than ``seq_len - 2`` is cut into pieces of that length; any other
    sentence lies whole in one row. ``segment_ids`` numbers a row's segments from 1."""
    budget = seq_len - 2
    if budget < 1:
        raise ValueError(f"seq_len={seq_len}: expected at least 3 for [CLS] A [SEP]")
    cls = np.array([cls_id], np.int32)
    sep = np.array([sep_id], np.int32)
    row: list[np.ndarray] = []  # the closed segments of the row being filled, each [CLS] ... [SEP]
    used = 0  # tokens in ``row``
    segment: list[np.ndarray] = []  # the open segment's pieces
    segment_len = 0

    def emit() -> tuple[np.ndarray, np.ndarray]:
        ids = np.full(seq_len, pad_id, np.int32)
        segments = np.zeros(seq_len, np.int32)
        at = 0
        for number, part in enumerate(row, 1):
            ids[at:at + len(part)] = part
            segments[at:at + len(part)] = number
            at += len(part)
        return ids, segments

    for sentences in documents:
        for sentence in sentences:
            sentence = np.asarray(sentence, np.int32)
            for start in range(0, len(sentence), budget):
                piece = sentence[start:start + budget]
                if segment and used + segment_len + len(piece) + 2 <= seq_len:
                    segment.append(piece)
                    segment_len += len(piece)
                    continue
                if segment:
                    row.append(np.concatenate([cls, *segment, sep]))
                    used += segment_len + 2
                if used + len(piece) + 2 > seq_len:
                    yield emit()
                    row, used = [], 0
                segment, segment_len = [piece], len(piece)
        if segment:  # a document's last segment: the next document starts a new one
            row.append(np.concatenate([cls, *segment, sep]))
            used += segment_len + 2
            segment, segment_len = [], 0
    if row:
        yield emit()


# ------------------------------------------------------------------------------------------------ tokenizing
def tokenized(texts: Iterable[str], tok: TextTokenizer, chunk: int = 512) -> Iterator[list[int]]:
    """``tok.encode`` of each text, encoded ``chunk`` texts at a time."""
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == chunk:
            yield from tok.encode_batch(batch)
            batch = []
    if batch:
        yield from tok.encode_batch(batch)


def tokenized_sentences(texts: Iterable[str], tok: TextTokenizer, chunk: int = 256) -> Iterator[list[list[int]]]:
    """Per document of ``texts``: its sentences (:func:`split_sentences`) as token ids, ``chunk`` documents' sentences
    encoded at a time."""
    batch: list[list[str]] = []

    def flush() -> Iterator[list[list[int]]]:
        flat = tok.encode_batch([s for doc in batch for s in doc]) if any(batch) else []
        at = 0
        for doc in batch:
            yield flat[at:at + len(doc)]
            at += len(doc)

    for text in texts:
        batch.append(split_sentences(text))
        if len(batch) == chunk:
            yield from flush()
            batch = []
    if batch:
        yield from flush()


def record_generators(cfg: DataConfig, corpus: RawCorpus, tok: TextTokenizer):
    """``{split: generate(stats) -> records}`` for :class:`~flaxzoo.train.data.builders.FlaxzooPacked`."""
    roles = check_tokenizer(tok, cfg.objective)

    def make(split: str):
        def generate(stats: dict[str, int]) -> Iterator[dict[str, np.ndarray]]:
            counts = {"documents": 0, "tokens": 0}

            def docs() -> Iterator[str]:
                for text in corpus.texts(split):
                    counts["documents"] += 1
                    yield text

            if cfg.objective == "causal":
                def counted(ids_iter: Iterable[list[int]]) -> Iterator[list[int]]:
                    for ids in ids_iter:
                        counts["tokens"] += len(ids)
                        yield ids

                for window, segments in pack_causal(counted(tokenized(docs(), tok)), cfg.seq_len, roles["eos"]):
                    yield {"input_ids": window, "segment_ids": segments}
            else:
                def counted_docs(docs_iter: Iterable[list[list[int]]]) -> Iterator[list[list[int]]]:
                    for sentences in docs_iter:
                        counts["tokens"] += sum(map(len, sentences))
                        yield sentences

                for ids, segments in pack_mlm(counted_docs(tokenized_sentences(docs(), tok)), cfg.seq_len,
                                              cls_id=roles["cls"], sep_id=roles["sep"], pad_id=roles["pad"]):
                    yield {"input_ids": ids, "segment_ids": segments}
            stats.update(counts)

        return generate

    return {split: make(split) for split in corpus.sources}


def record_features(cfg: DataConfig) -> dict[str, int]:
    """The fields of a packed record and their lengths."""
    width = cfg.seq_len + 1 if cfg.objective == "causal" else cfg.seq_len
    return {"input_ids": width, "segment_ids": width}


def prepare(cfg: DataConfig, tokenizer: TextTokenizer | None = None) -> dict[str, Any]:
    """Packed examples per split (``"train"``, and ``"validation"`` when the corpus has one): random-access data
    sources of fixed-length records (:func:`record_features`), built once and cached under
    ``data_dir/flaxzoo_packed/<objective><seq_len>_<key>``."""
    corpus = raw_sources(cfg)
    tok = tokenizer if tokenizer is not None else build_tokenizer(cfg, corpus)
    check_tokenizer(tok, cfg.objective)
    key = cache_key(corpus.corpus_id, tok.fingerprint(), cfg.seq_len, cfg.objective, PACK_FORMAT_VERSION)
    name = f"{cfg.objective}{cfg.seq_len}_{key}"
    data_dir = pathlib.Path(os.path.expanduser(cfg.data_dir))
    with quiet_tfds(), file_lock(data_dir):
        builder = FlaxzooPacked(data_dir=str(data_dir), config=tfds.core.BuilderConfig(name=name),
                                file_format="array_record", seq_len=cfg.seq_len, features=record_features(cfg),
                                generators=record_generators(cfg, corpus, tok))
        prepare_builder(builder)
        return {split: builder.as_data_source(split) for split in builder.info.splits}
