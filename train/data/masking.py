"""BERT-style masked-LM inputs, vectorised over a batch, from a counter-based random number generator.

Per row: the candidates are its non-special tokens (never ``[CLS]``, ``[SEP]``, ``[PAD]``, ``[MASK]`` or any other
special id); ``num_to_predict = min(max_predictions, max(1, round(candidates * prob)))`` of them (0 for a row without
candidates; ``round`` halves to even, as Python's and BERT's ``create_pretraining_data``) are chosen uniformly without
replacement: exactly that many, not a Bernoulli draw per token. A chosen token becomes ``[MASK]`` (80 %), a uniformly
drawn non-special token (10 %) or stays (10 %).

Randomness: every draw is a hash (splitmix64's finaliser) of the row's key and the token index, so a row's masking
depends on its key only, never on the batch it is in, the batch size, the number of processes or Grain workers. The
loader keys the record at position ``p`` of epoch ``e``'s order by :func:`example_keys` ``(seed, e, p)``.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from flaxzoo.train.batches import IGNORE_INDEX

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
# One salt per independent stream of draws of a row.
_SELECT, _ACTION, _REPLACEMENT = (np.uint64(s) for s in (0x5E1EC7, 0xAC7104, 0x4E91ACE))


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective, well-mixing hash of uint64 values (elementwise; wraps modulo 2**64)."""
    x = np.asarray(x, np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _fold(key: np.ndarray, value: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return mix64(key ^ ((np.asarray(value, np.uint64) + np.uint64(1)) * _GOLDEN))


def example_keys(seed: int, epoch: int | np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``uint64 [rows]``: the masking key of the record at each of ``positions`` of epoch ``epoch``'s order."""
    positions = np.asarray(positions, np.int64).reshape(-1)
    key = _fold(np.zeros(positions.shape, np.uint64), np.full(positions.shape, seed, np.uint64))
    key = _fold(key, np.broadcast_to(np.asarray(epoch, np.uint64), positions.shape))
    return _fold(key, positions.astype(np.uint64))


def token_draws(keys: np.ndarray, length: int, stream: np.uint64) -> np.ndarray:
    """``uint64 [rows, length]``: the draws of ``stream`` for the tokens of each row."""
    row = mix64(np.asarray(keys, np.uint64) ^ stream)
    with np.errstate(over="ignore"):
        counters = (np.arange(1, length + 1, dtype=np.uint64) * _GOLDEN)[None, :]
        return mix64(row[:, None] + counters)


@functools.lru_cache(maxsize=16)
def special_tables(vocab_size: int, special: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(is_special lookup table ``[vocab_size]`` bool, the non-special ids) for ``special``."""
    is_special = np.zeros(vocab_size, bool)
    is_special[[s for s in special if 0 <= s < vocab_size]] = True
    allowed = np.flatnonzero(~is_special).astype(np.int32)
    if len(allowed) == 0:
        raise ValueError(f"vocab_size={vocab_size}: no non-special token to sample random replacements from")
    is_special.setflags(write=False)
    allowed.setflags(write=False)
    return is_special, allowed


def num_to_predict(candidates: np.ndarray, prob: float, max_predictions: int) -> np.ndarray:
    """``min(max_predictions, max(1, round(candidates * prob)))``, 0 where there is no candidate."""
    candidates = np.asarray(candidates, np.int64)
    n = np.minimum(max_predictions, np.maximum(1, np.rint(candidates * prob).astype(np.int64)))
    return np.where(candidates > 0, n, 0)


def mask_tokens(ids: np.ndarray, keys: np.ndarray, *, vocab_size: int, mask_id: int, special_ids: Sequence[int],
                prob: float = 0.15, max_predictions: int) -> dict[str, np.ndarray]:
    """Mask ``ids [rows, T]`` (see the module docstring); ``keys [rows]`` uint64 (e.g. :func:`example_keys`).

    Returns int32 arrays: ``input_ids [rows, T]`` (masked), ``labels [rows, T]`` (the original id at the chosen
    positions, ``IGNORE_INDEX`` elsewhere), ``masked_positions [rows, P]`` (the chosen positions in ascending order,
    then 0) and ``masked_labels [rows, P]`` (their original ids, then ``IGNORE_INDEX``), P = ``max_predictions``.
    Every id must be in ``[0, vocab_size)``.
    """
    if not 0.0 < prob < 1.0:
        raise ValueError(f"prob={prob}: expected a rate in (0, 1)")
    if not 0 <= mask_id < vocab_size:
        raise ValueError(f"mask_id={mask_id}: expected a token id in [0, {vocab_size})")
    if max_predictions < 1:
        raise ValueError(f"max_predictions={max_predictions}: expected at least 1")
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"ids of shape {ids.shape}: expected [rows, seq]")
    rows, length = ids.shape
    keys = np.asarray(keys, np.uint64).reshape(-1)
    if keys.shape != (rows,):
        raise ValueError(f"{keys.shape[0]} keys for {rows} rows: expected one key per row")
    special = tuple(sorted({int(s) for s in special_ids} | {int(mask_id)}))
    is_special, allowed = special_tables(vocab_size, special)
    candidate = ~is_special[ids]
    count = num_to_predict(candidate.sum(axis=1), prob, max_predictions)

    # Uniform choice without replacement: the `count` candidates with the smallest draws (non-candidates last).
    draws = np.where(candidate, token_draws(keys, length, _SELECT) >> np.uint64(1), np.uint64(2**64 - 1))
    width = min(max_predictions, length)
    first = np.argsort(draws, axis=1, kind="stable")[:, :width]
    valid = np.arange(width)[None, :] < count[:, None]
    positions = np.sort(np.where(valid, first, length), axis=1)  # chosen ascending, then `length` (padding)
    valid = positions < length
    chosen = np.zeros((rows, length + 1), bool)
    np.put_along_axis(chosen, positions, True, axis=1)
    chosen = chosen[:, :length]

    action = (token_draws(keys, length, _ACTION) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    replacement = allowed[((token_draws(keys, length, _REPLACEMENT) >> np.uint64(32)) * np.uint64(len(allowed))
                           >> np.uint64(32)).astype(np.int64)]
    inputs = ids.astype(np.int32, copy=True)
    inputs = np.where(chosen & (action < 0.8), np.int32(mask_id), inputs)
    inputs = np.where(chosen & (action >= 0.8) & (action < 0.9), replacement, inputs).astype(np.int32)
    labels = np.where(chosen, ids, IGNORE_INDEX).astype(np.int32)

    positions = np.where(valid, positions, 0)
    masked_labels = np.where(valid, np.take_along_axis(ids, positions, axis=1), IGNORE_INDEX).astype(np.int32)
    if width < max_predictions:  # more slots than tokens: padding slots
        extra = max_predictions - width
        positions = np.pad(positions, ((0, 0), (0, extra)))
        masked_labels = np.pad(masked_labels, ((0, 0), (0, extra)), constant_values=IGNORE_INDEX)
    return {"input_ids": inputs, "labels": labels, "masked_positions": positions.astype(np.int32),
            "masked_labels": masked_labels}
