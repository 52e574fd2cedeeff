"""Batches as the CLI's, built without the data stack (no Grain, tensorflow-datasets or ml_collections).

Every training batch has exactly the keys and shapes of ``flaxzoo.train.data.batch_shapes(data_config, rows)``
(``flaxzoo.train.batches.CAUSAL_KEYS`` / ``MLM_KEYS``) and packed rows like ``flaxzoo.train.data.packing``'s
(:func:`make_batch`): causal windows of a stream of documents (``seq/8`` to ``seq/2`` tokens, each ending in EOS) with
``segment_ids`` numbering them from 1 and ``targets`` ``IGNORE_INDEX`` across document ends; MLM rows of
``[CLS] ... [SEP]`` segments then padding, with ``attention_mask``, ``token_type_ids`` and BERT masking
(``flaxzoo.train.data.masking``'s rule: ``min(P, round(15 % of the non-special tokens))`` chosen, 80/10/10) into
``labels`` and ``masked_positions`` / ``masked_labels`` ``[rows, P]``. Every row holds at least two documents, so the
step takes the packed-attention path the CLI takes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flaxzoo.train.batches import CAUSAL_KEYS, IGNORE_INDEX, MLM_KEYS

MLM_PROB = 0.15  # DataConfig.mask_prob's default
# Special ids of the trained tokenizers (train/tokenizer.py): BPE's <|endoftext|> = 0 (EOS); WordPiece's [PAD],
# [CLS], [SEP], [MASK] = 0, 2, 3, 4. Ordinary tokens are drawn from [FIRST_WORD_ID, vocab_size).
EOS_ID, PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 0, 2, 3, 4
FIRST_WORD_ID = 5


def packed_causal(rng: np.random.Generator, rows: int, seq: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """``(windows, segment_ids)``, both ``[rows, seq + 1]`` int32, cut as ``flaxzoo.train.data.packing.pack_causal`` cuts
    the stream ``doc_1 EOS doc_2 EOS ...``: window ``k`` = ``stream[k*seq : k*seq + seq + 1]``, documents numbered
    from 1 within each window. Documents of ``seq/8`` to ``seq/2`` tokens (EOS included): every window holds two
    or more."""
    need = rows * seq + 1
    lengths: list[int] = []
    while sum(lengths) < need:  # a few hundred documents at most
        lengths.append(int(rng.integers(max(2, seq // 8), max(2, seq // 2) + 1)))
    stream = rng.integers(FIRST_WORD_ID, vocab, need, dtype=np.int32)
    ends = np.cumsum(lengths) - 1
    stream[ends[ends < need]] = EOS_ID
    docs = np.repeat(np.arange(1, len(lengths) + 1, dtype=np.int32), lengths)[:need]
    index = np.arange(rows)[:, None] * seq + np.arange(seq + 1)[None, :]
    return stream[index], docs[index] - docs[index[:, :1]] + 1


def packed_mlm(rng: np.random.Generator, rows: int, seq: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids, segment_ids)``, both ``[rows, seq]`` int32, laid out as ``flaxzoo.train.data.packing.pack_mlm``'s rows:
    segments ``[CLS] tokens [SEP]`` of ``seq/8`` to ``seq/2`` tokens packed greedily (two or more per row), numbered
    from 1, then ``[PAD]`` (segment 0) up to ``seq``."""
    ids = np.full((rows, seq), PAD_ID, np.int32)
    segments = np.zeros((rows, seq), np.int32)
    low, high = max(3, seq // 8), max(3, seq // 2)
    for row in range(rows):
        at, number = 0, 0
        while (length := int(rng.integers(low, high + 1))) <= seq - at:
            number += 1
            ids[row, at:at + length] = [CLS_ID, *rng.integers(FIRST_WORD_ID, vocab, length - 2), SEP_ID]
            segments[row, at:at + length] = number
            at += length
    return ids, segments


def mask_rows(rng: np.random.Generator, ids: np.ndarray, vocab: int, predictions: int) -> dict[str, np.ndarray]:
    """BERT masking of ``ids [rows, seq]`` by ``flaxzoo.train.data.masking.mask_tokens``'s rule (with numpy's generator in
    place of its counter-based hashes): per row ``min(P, max(1, round(candidates * MLM_PROB)))`` of the non-special
    tokens (0 in a row without any), uniformly without replacement, become ``[MASK]`` (80 %), a random token (10 %)
    or stay (10 %). ``input_ids``, ``labels`` ``[rows, seq]`` (``IGNORE_INDEX`` where not chosen),
    ``masked_positions`` / ``masked_labels`` ``[rows, P]`` (ascending, then 0 / ``IGNORE_INDEX``), P =
    ``predictions``."""
    rows, seq = ids.shape
    candidate = ids >= FIRST_WORD_ID
    candidates = candidate.sum(axis=1)
    count = np.where(candidates > 0, np.minimum(predictions, np.maximum(1, np.rint(candidates * MLM_PROB))), 0)
    first = np.argsort(np.where(candidate, rng.random(ids.shape), 2.0), axis=1)[:, :predictions]
    positions = np.sort(np.where(np.arange(predictions)[None, :] < count[:, None], first, seq), axis=1)
    valid = positions < seq
    chosen = np.zeros((rows, seq + 1), bool)
    np.put_along_axis(chosen, positions, True, axis=1)
    chosen = chosen[:, :seq]
    positions = np.where(valid, positions, 0)
    action = rng.random(ids.shape)
    inputs = np.where(chosen & (action < 0.8), MASK_ID, ids)
    inputs = np.where(chosen & (action >= 0.8) & (action < 0.9), rng.integers(FIRST_WORD_ID, vocab, ids.shape), inputs)
    return {"input_ids": inputs, "labels": np.where(chosen, ids, IGNORE_INDEX),
            "masked_positions": positions,
            "masked_labels": np.where(valid, np.take_along_axis(ids, positions, axis=1), IGNORE_INDEX)}


def make_batch(spec: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """A batch of ``spec["batch"]`` packed rows of ``spec["seq"]`` random tokens (fixed seed) with the CLI's keys and
    shapes (``flaxzoo.train.data.batch_shapes``), every array int32 ``[batch, seq]`` except ``[batch, P]`` ones. Causal
    (``CAUSAL_KEYS``): ``input_ids``, ``targets`` (the next token, ``IGNORE_INDEX`` where it starts another
    document), ``segment_ids``. MLM (``MLM_KEYS``): masked ``input_ids``, ``attention_mask`` (0 on padding),
    ``token_type_ids`` (0), ``segment_ids``, ``labels``, ``masked_positions`` / ``masked_labels`` ``[batch, P]``."""
    rng = np.random.default_rng(seed)
    vocab, rows, seq = spec["config"].vocab_size, spec["batch"], spec["seq"]
    if spec["predictions"] is None:
        windows, segments = packed_causal(rng, rows, seq, vocab)
        scored = segments[:, 1:] == segments[:, :-1]
        batch = {"input_ids": windows[:, :-1], "targets": np.where(scored, windows[:, 1:], IGNORE_INDEX),
                 "segment_ids": segments[:, :-1]}
        keys = CAUSAL_KEYS
    else:
        ids, segments = packed_mlm(rng, rows, seq, vocab)
        batch = {"attention_mask": (segments > 0), "token_type_ids": np.zeros_like(ids), "segment_ids": segments,
                 **mask_rows(rng, ids, vocab, spec["predictions"])}
        keys = MLM_KEYS
    return {key: np.ascontiguousarray(batch[key], np.int32) for key in keys}
