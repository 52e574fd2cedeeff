"""T5's span-corruption pre-training objective (Raffel et al., 2020, section 3.1.4), as a numpy data transform.

Per row of ``length`` tokens:

- ``num_noise_tokens = round(length * noise_density)``, clipped to ``[1, length - 1]``;
- ``num_noise_spans = max(1, round(num_noise_tokens / mean_noise_span_length))``;
- ``num_nonnoise_tokens = length - num_noise_tokens``.

``round`` halves to even (Python's, numpy's and TensorFlow's ``round``). The noise tokens are split into
``num_noise_spans`` non-empty spans by a uniformly random composition (every one of the ``C(n - 1, s - 1)`` ways equally
likely: T5's random segmentation), the non-noise tokens likewise; the spans alternate, non-noise first, so a row never
starts with noise and always ends with it.

The encoder input is the row with each noise span replaced by one sentinel, then EOS; the target is each noise span's
sentinel followed by the span, then EOS. Noise span ``k`` gets ``sentinel_ids[k]`` (``<extra_id_k>``). As in Hugging
Face's ``run_t5_mlm_flax.py``, the target has no final sentinel after the last span (some T5 versions append one).

Both widths depend on ``length`` only, so a batch of equal-length rows gives rectangular arrays without padding:

- inputs: ``num_nonnoise_tokens + num_noise_spans + 1``;
- targets: ``num_noise_tokens + num_noise_spans + 1``.

Randomness: row ``i`` of a :func:`corrupt_spans` call draws from its own generator, seeded by
``SeedSequence((seed, epoch, row_offset + i))`` (:func:`example_rng`), so a row's corruption never depends on the batch
it is in.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def span_counts(length: int, noise_density: float = 0.15, mean_noise_span_length: float = 3.0) -> tuple[int, int]:
    """``(num_noise_tokens, num_noise_spans)`` for a row of ``length`` tokens (see the module docstring).

    Raises ValueError for a density outside (0, 1), a mean span length below 1, a length below 2, or more noise spans
    than non-noise tokens (the non-noise spans could not all be non-empty).
    """
    if not 0.0 < noise_density < 1.0:
        raise ValueError(f"noise_density={noise_density}: expected a fraction in (0, 1)")
    if not mean_noise_span_length >= 1.0:
        raise ValueError(f"mean_noise_span_length={mean_noise_span_length}: expected at least 1")
    if length < 2:
        raise ValueError(f"length={length}: expected at least 2 tokens (one noise and one non-noise)")
    num_noise_tokens = min(max(round(length * noise_density), 1), length - 1)
    num_noise_spans = max(round(num_noise_tokens / mean_noise_span_length), 1)
    num_nonnoise_tokens = length - num_noise_tokens
    if num_noise_spans > num_nonnoise_tokens:
        raise ValueError(
            f"length={length}, noise_density={noise_density}, mean_noise_span_length={mean_noise_span_length}: "
            f"{num_noise_spans} noise spans need as many non-empty non-noise spans, but there are only "
            f"{num_nonnoise_tokens} non-noise tokens; expected a lower density or longer spans")
    return num_noise_tokens, num_noise_spans


def corrupted_lengths(length: int, noise_density: float = 0.15,
                      mean_noise_span_length: float = 3.0) -> tuple[int, int]:
    """``(inputs_length, targets_length)``: the widths of :func:`corrupt_spans`' outputs for rows of ``length``
    tokens, EOS included."""
    num_noise_tokens, num_noise_spans = span_counts(length, noise_density, mean_noise_span_length)
    return length - num_noise_tokens + num_noise_spans + 1, num_noise_tokens + num_noise_spans + 1


def input_and_target_lengths(inputs_length: int, noise_density: float = 0.15,
                             mean_noise_span_length: float = 3.0) -> tuple[int, int]:
    """``(raw_tokens_length, targets_length)``: T5's ``compute_input_and_target_lengths``.

    ``raw_tokens_length`` is the longest row that corrupts into exactly ``inputs_length`` encoder tokens (EOS
    included); ``targets_length`` is its target width. E.g. 512 with 0.15 / 3.0 gives (568, 114). At density 0.5 T5
    shortens the row by one when the targets would be longer than the inputs; so does this function, where the shorter
    row still gives ``inputs_length`` encoder tokens.
    """
    if inputs_length < 3:
        raise ValueError(f"inputs_length={inputs_length}: expected at least 3 (a token, a sentinel and EOS)")

    def encoder_length(length: int) -> int:
        return corrupted_lengths(length, noise_density, mean_noise_span_length)[0]

    # The encoder length grows by 0 or 1 per raw token (a new token is either kept or noise that may open a span) and
    # is at most length + 1, so the search starts below the answer and stops on it.
    length = max(2, inputs_length - 1)
    while encoder_length(length + 1) <= inputs_length:
        length += 1
    if encoder_length(length) != inputs_length:
        raise ValueError(f"inputs_length={inputs_length}: no row length corrupts into exactly that many encoder tokens "
                         f"with noise_density={noise_density}, mean_noise_span_length={mean_noise_span_length}")
    targets_length = corrupted_lengths(length, noise_density, mean_noise_span_length)[1]
    if noise_density == 0.5 and targets_length > inputs_length and encoder_length(length - 1) == inputs_length:
        length -= 1
        targets_length = corrupted_lengths(length, noise_density, mean_noise_span_length)[1]
    return length, targets_length


def example_rng(seed: int, epoch: int, row: int) -> np.random.Generator:
    """The generator of the row at index ``row`` of epoch ``epoch``'s order, from ``SeedSequence((seed, epoch, row))``
    (all three non-negative)."""
    return np.random.default_rng(np.random.SeedSequence((seed, epoch, row)))


def _segment_draws(rng: np.random.Generator, num_noise_tokens: int, num_nonnoise_tokens: int) -> np.ndarray:
    """``float64 [num_noise_tokens - 1 + num_nonnoise_tokens - 1]``: one draw per gap between two tokens of the same
    kind, noise gaps first."""
    return rng.random(num_noise_tokens - 1 + num_nonnoise_tokens - 1)


def _segment_lengths(gap_draws: np.ndarray, num_items: int, num_segments: int) -> np.ndarray:
    """``int [rows, num_segments]``: a uniformly random composition of ``num_items`` into ``num_segments`` positive
    parts per row, from ``gap_draws [rows, num_items - 1]``.

    A segment boundary goes into each of the ``num_segments - 1`` gaps with the smallest draws: a uniformly random
    subset of the gaps, which is a uniformly random composition.
    """
    rows = gap_draws.shape[0]
    num_cuts = num_segments - 1
    starts = np.zeros((rows, num_items), bool)
    starts[:, 0] = True
    if num_cuts > 0:
        cut_gaps = np.argpartition(gap_draws, num_cuts - 1, axis=1)[:, :num_cuts]
        np.put_along_axis(starts, cut_gaps + 1, True, axis=1)  # gap g lies before item g + 1
    start_positions = np.nonzero(starts)[1].reshape(rows, num_segments)
    ends = np.concatenate([start_positions[:, 1:], np.full((rows, 1), num_items)], axis=1)
    return ends - start_positions


def _span_numbers(draws: np.ndarray, length: int, num_noise_tokens: int, num_noise_spans: int) -> np.ndarray:
    """``int [rows, length]``: each token's span number, from the per-row ``draws`` of :func:`_segment_draws`.

    Spans alternate non-noise, noise, non-noise, ...: span ``2k`` is non-noise span ``k``, span ``2k + 1`` noise span
    ``k``.
    """
    rows = draws.shape[0]
    num_nonnoise_tokens = length - num_noise_tokens
    noise_lengths = _segment_lengths(draws[:, :num_noise_tokens - 1], num_noise_tokens, num_noise_spans)
    nonnoise_lengths = _segment_lengths(draws[:, num_noise_tokens - 1:], num_nonnoise_tokens, num_noise_spans)
    interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=2).reshape(rows, 2 * num_noise_spans)
    span_starts = np.cumsum(interleaved, axis=1)[:, :-1]  # every span's start but the first's (0)
    start_marks = np.zeros((rows, length), np.int32)
    np.put_along_axis(start_marks, span_starts, 1, axis=1)
    return np.cumsum(start_marks, axis=1)


def random_spans_noise_mask(length: int, noise_density: float, mean_noise_span_length: float,
                            rng: np.random.Generator) -> np.ndarray:
    """``bool [length]``: True at the noise tokens of one row, drawn from ``rng``.

    Row ``i`` of :func:`noise_masks` equals this function's mask for ``rng=example_rng(seed, epoch, row_offset + i)``.
    """
    num_noise_tokens, num_noise_spans = span_counts(length, noise_density, mean_noise_span_length)
    draws = _segment_draws(rng, num_noise_tokens, length - num_noise_tokens)[None, :]
    return _span_numbers(draws, length, num_noise_tokens, num_noise_spans)[0] % 2 == 1


def _row_draws(num_rows: int, length: int, num_noise_tokens: int, seed: int, epoch: int,
               row_offset: int) -> np.ndarray:
    """``float64 [num_rows, length - 2]``: each row's segment draws from its own :func:`example_rng`."""
    draws = np.empty((num_rows, length - 2))
    for i in range(num_rows):
        draws[i] = _segment_draws(example_rng(seed, epoch, row_offset + i), num_noise_tokens, length - num_noise_tokens)
    return draws


def _span_numbers_of_rows(num_rows: int, length: int, noise_density: float, mean_noise_span_length: float, seed: int,
                          epoch: int, row_offset: int) -> np.ndarray:
    num_noise_tokens, num_noise_spans = span_counts(length, noise_density, mean_noise_span_length)
    draws = _row_draws(num_rows, length, num_noise_tokens, seed, epoch, row_offset)
    return _span_numbers(draws, length, num_noise_tokens, num_noise_spans)


def noise_masks(num_rows: int, length: int, *, noise_density: float = 0.15, mean_noise_span_length: float = 3.0,
                seed: int = 0, epoch: int = 0, row_offset: int = 0) -> np.ndarray:
    """``bool [num_rows, length]``: the noise masks :func:`corrupt_spans` uses for rows ``row_offset ...
    row_offset + num_rows - 1`` of epoch ``epoch``."""
    return _span_numbers_of_rows(num_rows, length, noise_density, mean_noise_span_length, seed, epoch,
                                 row_offset) % 2 == 1


def _replace_spans(rows: np.ndarray, replaced: np.ndarray, span_starts: np.ndarray, sentinels: np.ndarray,
                   eos_id: int) -> np.ndarray:
    """``[rows, width + 1]``: each row with every ``replaced`` span shrunk to its sentinel, then EOS.

    ``sentinels [rows, length]`` is the sentinel of the span each token is in. Every row keeps the same number of
    tokens, so the kept tokens reshape to a rectangle.
    """
    values = np.where(replaced & span_starts, sentinels, rows)
    kept = values[~replaced | span_starts].reshape(rows.shape[0], -1)
    return np.concatenate([kept, np.full((rows.shape[0], 1), eos_id, rows.dtype)], axis=1)


def corrupt_spans(rows: np.ndarray, *, sentinel_ids: Sequence[int], eos_id: int, noise_density: float = 0.15,
                  mean_noise_span_length: float = 3.0, seed: int = 0, epoch: int = 0,
                  row_offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Span-corrupt ``rows [num_rows, length]`` (integer ids, no EOS yet; see the module docstring).

    Row ``i`` is the example at index ``row_offset + i`` of epoch ``epoch``'s order; its corruption depends on
    ``(seed, epoch, row_offset + i)`` only. ``sentinel_ids``: distinct ids, ``sentinel_ids[k]`` for noise span ``k``
    (e.g. :func:`tokenizer_sentinel_ids` or :func:`t5_sentinel_ids`), at least as many as the row has noise spans.

    Returns ``(inputs [num_rows, inputs_length], targets [num_rows, targets_length])`` in ``rows``' dtype, the widths
    of :func:`corrupted_lengths` ``(length, ...)``; the targets have no final sentinel after the last span.
    """
    rows = np.asarray(rows)
    if rows.ndim != 2:
        raise ValueError(f"rows of shape {rows.shape}: expected 2-D [rows, length]")
    if not np.issubdtype(rows.dtype, np.integer):
        raise ValueError(f"rows of dtype {rows.dtype}: expected integer token ids")
    num_rows, length = rows.shape
    _, num_noise_spans = span_counts(length, noise_density, mean_noise_span_length)
    sentinels = np.asarray(sentinel_ids, rows.dtype).reshape(-1)
    if len(sentinels) < num_noise_spans:
        raise ValueError(f"{len(sentinels)} sentinel_ids: rows of {length} tokens have {num_noise_spans} noise spans "
                         f"(noise_density={noise_density}, mean_noise_span_length={mean_noise_span_length}); "
                         f"expected at least {num_noise_spans} sentinel ids")
    if len(np.unique(sentinels[:num_noise_spans])) < num_noise_spans:
        raise ValueError(f"sentinel_ids={list(sentinel_ids)[:num_noise_spans]}: expected distinct ids")

    span_numbers = _span_numbers_of_rows(num_rows, length, noise_density, mean_noise_span_length, seed, epoch,
                                         row_offset)
    noise = span_numbers % 2 == 1
    span_starts = np.ones((num_rows, length), bool)
    span_starts[:, 1:] = span_numbers[:, 1:] != span_numbers[:, :-1]
    # Non-noise span k precedes noise span k: both have span number // 2 == k, so one lookup serves both outputs.
    span_sentinels = sentinels[span_numbers // 2]
    inputs = _replace_spans(rows, noise, span_starts, span_sentinels, eos_id)
    targets = _replace_spans(rows, ~noise, span_starts, span_sentinels, eos_id)
    return inputs, targets


def t5_sentinel_ids(vocab_size: int, count: int) -> list[int]:
    """T5's sentinel convention, ``[vocab_size - 1 - i for i in range(count)]``: ``<extra_id_i>`` counts down from the
    last id.

    ``vocab_size`` is the tokenizer's (32100 for T5's, whose ``<extra_id_0>`` is 32099), not the model's embedding
    size (32128). For a tokenizer without sentinels, ``vocab_size = its vocabulary + count`` gives ``count`` new ids
    past its own (the model's embedding table must cover them).
    """
    if count < 1 or count > vocab_size:
        raise ValueError(f"count={count}: expected between 1 and vocab_size={vocab_size} sentinels")
    return [vocab_size - 1 - i for i in range(count)]


def tokenizer_sentinel_ids(tokenizer, count: int) -> list[int]:
    """The ids of ``<extra_id_0>`` ... ``<extra_id_{count - 1}>`` in ``tokenizer`` (a ``tokenizers.Tokenizer``).

    Raises ValueError naming the missing tokens, e.g. for GPT-2's tokenizer, which has none; then
    ``t5_sentinel_ids(tokenizer vocabulary + count, count)`` gives ids past the tokenizer's own, T5's way.
    """
    if count < 1:
        raise ValueError(f"count={count}: expected at least 1 sentinel")
    tokens = [f"<extra_id_{i}>" for i in range(count)]
    ids = [tokenizer.token_to_id(token) for token in tokens]
    missing = [token for token, token_id in zip(tokens, ids) if token_id is None]
    if len(missing) == count:
        raise ValueError(f"the tokenizer has no sentinel tokens (no {tokens[0]}): expected {count} tokens "
                         f"<extra_id_0> ... <extra_id_{count - 1}>; t5_sentinel_ids(vocab_size, count) gives T5's ids")
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ValueError(f"the tokenizer lacks {len(missing)} of the {count} sentinel tokens asked for: {shown}")
    return ids
