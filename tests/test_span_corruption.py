"""T5 span corruption (train/data/span_corruption.py): exact noise and span counts, the span-length law of a uniformly
random composition, reconstruction, sentinel order, determinism per example, T5's lengths, errors, speed."""

import math

import numpy as np
import pytest
import tokenizers
from tokenizers import models as tokenizer_models, pre_tokenizers

from flaxzoo.train.data.span_corruption import (
    corrupt_spans,
    corrupted_lengths,
    example_rng,
    input_and_target_lengths,
    noise_masks,
    random_spans_noise_mask,
    span_counts,
    t5_sentinel_ids,
    tokenizer_sentinel_ids,
)

ROWS = 4096
EOS = 1
FIRST_POSITION_ID = 1000  # position p of a row is token FIRST_POSITION_ID + p: below every sentinel, never EOS
SENTINELS = t5_sentinel_ids(32100, 100)
# (length, noise_density, mean_noise_span_length, num_noise_tokens, num_noise_spans): T5's default on a 568-token row
# (512 encoder tokens) and a denser, shorter-span setting.
SETTINGS = [(568, 0.15, 3.0, 85, 28), (100, 0.3, 2.0, 30, 15)]


def masks_from_outputs(inputs: np.ndarray, targets: np.ndarray, length: int) -> np.ndarray:
    """The noise mask of rows whose token at position p was FIRST_POSITION_ID + p, read back from the targets; checks
    that the inputs keep exactly the other positions."""
    rows = inputs.shape[0]
    noise = np.zeros((rows, length), bool)
    row_of_target, _ = np.nonzero((targets >= FIRST_POSITION_ID) & (targets < FIRST_POSITION_ID + length))
    noise[row_of_target, targets[(targets >= FIRST_POSITION_ID) & (targets < FIRST_POSITION_ID + length)]
          - FIRST_POSITION_ID] = True
    kept = np.zeros((rows, length), bool)
    is_position = (inputs >= FIRST_POSITION_ID) & (inputs < FIRST_POSITION_ID + length)
    row_of_input, _ = np.nonzero(is_position)
    kept[row_of_input, inputs[is_position] - FIRST_POSITION_ID] = True
    np.testing.assert_array_equal(kept, ~noise)
    return noise


@pytest.fixture(scope="module", params=SETTINGS, ids=["568_t5_default", "100_density0.3_span2"])
def corrupted(request):
    length, density, mean_span, num_noise, num_spans = request.param
    positions = np.broadcast_to(np.arange(length, dtype=np.int32) + FIRST_POSITION_ID, (ROWS, length))
    inputs, targets = corrupt_spans(positions, sentinel_ids=SENTINELS, eos_id=EOS, noise_density=density,
                                    mean_noise_span_length=mean_span, seed=3, epoch=1)
    mask = masks_from_outputs(inputs, targets, length)
    return dict(length=length, density=density, mean_span=mean_span, num_noise=num_noise, num_spans=num_spans,
                inputs=inputs, targets=targets, mask=mask)


def run_lengths(mask: np.ndarray, value: bool) -> tuple[np.ndarray, np.ndarray]:
    """(runs per row [rows], every run's length, row by row) of the maximal runs of ``value`` in ``mask [rows, L]``."""
    is_value = np.pad(mask == value, ((0, 0), (1, 1))).astype(np.int8)
    edges = np.diff(is_value, axis=1)
    start_rows, starts = np.nonzero(edges == 1)
    _, ends = np.nonzero(edges == -1)
    return np.bincount(start_rows, minlength=mask.shape[0]), ends - starts


def composition_part_law(num_items: int, num_parts: int) -> np.ndarray:
    """``[num_items + 1]``: P(L = l) of one part of a uniformly random composition of num_items into num_parts
    positive parts, C(n - l - 1, s - 2) / C(n - 1, s - 1)."""
    law = np.zeros(num_items + 1)
    for part in range(1, num_items - num_parts + 2):
        law[part] = math.comb(num_items - part - 1, num_parts - 2) / math.comb(num_items - 1, num_parts - 1)
    return law


def total_variation(lengths: np.ndarray, law: np.ndarray) -> float:
    empirical = np.bincount(lengths, minlength=len(law)) / len(lengths)
    return 0.5 * float(np.abs(empirical - law).sum())


# ------------------------------------------------------------------------------------------------ counts and law
def test_span_counts_follow_the_definition():
    for length, density, mean_span, num_noise, num_spans in SETTINGS:
        assert span_counts(length, density, mean_span) == (num_noise, num_spans)
    assert span_counts(10, 0.01, 3.0) == (1, 1)  # at least one noise token, one span
    assert span_counts(10, 0.99, 9.0) == (9, 1)  # at least one non-noise token
    assert span_counts(10, 0.25, 1.0) == (2, 2)  # 2.5 rounds half to even, as T5's round


def test_noise_fraction_is_exact_per_row(corrupted):
    length, density = corrupted["length"], corrupted["density"]
    noise_per_row = corrupted["mask"].sum(axis=1)
    assert (noise_per_row == corrupted["num_noise"]).all()
    assert (noise_per_row / length == round(length * density) / length).all()


def test_span_count_per_row_is_exact(corrupted):
    # Spans are maximal runs: an empty span would merge its neighbours and leave fewer runs than spans.
    noise_runs, _ = run_lengths(corrupted["mask"], True)
    nonnoise_runs, _ = run_lengths(corrupted["mask"], False)
    assert (noise_runs == corrupted["num_spans"]).all()
    assert (nonnoise_runs == corrupted["num_spans"]).all()


def test_rows_start_with_non_noise_and_end_with_noise(corrupted):
    assert not corrupted["mask"][:, 0].any()
    assert corrupted["mask"][:, -1].all()


def test_mean_span_length(corrupted):
    _, noise_lengths = run_lengths(corrupted["mask"], True)
    expected = corrupted["num_noise"] / corrupted["num_spans"]
    assert noise_lengths.min() >= 1
    assert abs(noise_lengths.mean() - expected) < 0.02 * expected


def test_span_lengths_follow_the_composition_law(corrupted):
    num_noise, num_spans, length = corrupted["num_noise"], corrupted["num_spans"], corrupted["length"]
    _, noise_lengths = run_lengths(corrupted["mask"], True)
    _, nonnoise_lengths = run_lengths(corrupted["mask"], False)
    noise_law = composition_part_law(num_noise, num_spans)
    nonnoise_law = composition_part_law(length - num_noise, num_spans)
    assert abs(noise_law.sum() - 1) < 1e-12 and abs(nonnoise_law.sum() - 1) < 1e-12
    assert total_variation(noise_lengths, noise_law) < 0.02
    assert total_variation(nonnoise_lengths, nonnoise_law) < 0.02
    # The same check rejects spans of one fixed length (the mean, rounded).
    fixed = np.full(len(noise_lengths), round(num_noise / num_spans))
    assert total_variation(fixed, noise_law) > 0.5


def test_single_row_mask_equals_the_batch_row():
    length, density, mean_span, _, _ = SETTINGS[1]
    batch = noise_masks(8, length, noise_density=density, mean_noise_span_length=mean_span, seed=5, epoch=2,
                        row_offset=40)
    for i in range(8):
        single = random_spans_noise_mask(length, density, mean_span, example_rng(5, 2, 40 + i))
        np.testing.assert_array_equal(single, batch[i])


def test_outputs_follow_noise_masks(corrupted):
    expected = noise_masks(ROWS, corrupted["length"], noise_density=corrupted["density"],
                           mean_noise_span_length=corrupted["mean_span"], seed=3, epoch=1)
    np.testing.assert_array_equal(corrupted["mask"], expected)


# ------------------------------------------------------------------------------------ outputs: layout and widths
def reconstruct(inputs_row: np.ndarray, targets_row: np.ndarray, sentinels: np.ndarray) -> np.ndarray:
    """The row the outputs came from: each sentinel in the inputs replaced by the target span it opens."""
    target_starts = np.flatnonzero(np.isin(targets_row[:-1], sentinels))
    span_of = {int(span[0]): span[1:] for span in np.split(targets_row[:-1], target_starts[1:])}
    pieces = np.split(inputs_row[:-1], np.flatnonzero(np.isin(inputs_row[:-1], sentinels)))
    return np.concatenate([pieces[0]] + [np.concatenate([span_of[int(p[0])], p[1:]]) for p in pieces[1:]])


@pytest.fixture(scope="module")
def random_rows_corrupted():
    rows = np.random.default_rng(0).integers(2, 32000, (ROWS, 568)).astype(np.int32)
    inputs, targets = corrupt_spans(rows, sentinel_ids=SENTINELS, eos_id=EOS)
    return rows, inputs, targets


def test_reconstruction_gives_back_every_row(random_rows_corrupted):
    rows, inputs, targets = random_rows_corrupted
    assert (inputs[:, -1] == EOS).all() and (targets[:, -1] == EOS).all()
    sentinels = np.asarray(SENTINELS)
    for row, inputs_row, targets_row in zip(rows, inputs, targets):
        np.testing.assert_array_equal(reconstruct(inputs_row, targets_row, sentinels), row)


def test_sentinels_appear_in_order(random_rows_corrupted):
    _, inputs, targets = random_rows_corrupted
    num_spans = 28
    in_order = np.broadcast_to(np.asarray(SENTINELS[:num_spans], inputs.dtype), (ROWS, num_spans))
    sentinels = np.asarray(SENTINELS)
    np.testing.assert_array_equal(inputs[np.isin(inputs, sentinels)].reshape(ROWS, -1), in_order)
    np.testing.assert_array_equal(targets[np.isin(targets, sentinels)].reshape(ROWS, -1), in_order)
    assert (targets[:, 0] == SENTINELS[0]).all()
    # No final sentinel: the last noise span runs up to EOS.
    assert not np.isin(targets[:, -2], sentinels).any()


def test_t5_lengths():
    assert input_and_target_lengths(512) == (568, 114)
    assert input_and_target_lengths(512, 0.15, 3.0) == (568, 114)
    assert corrupted_lengths(568) == (512, 114)
    # T5's density-0.5 adjustment: 767 raw tokens would give 513 targets; 766 give 512 inputs and 512 targets.
    assert input_and_target_lengths(512, 0.5, 3.0) == (766, 512)
    assert corrupted_lengths(766, 0.5, 3.0) == (512, 512)


def test_raw_length_gives_exactly_the_inputs_length():
    for density, mean_span in [(0.15, 3.0), (0.3, 2.0), (0.5, 3.0), (0.05, 10.0)]:
        for inputs_length in range(8, 600, 7):
            raw_length, targets_length = input_and_target_lengths(inputs_length, density, mean_span)
            assert corrupted_lengths(raw_length, density, mean_span) == (inputs_length, targets_length)
            if not density == 0.5:  # the longest such row
                assert corrupted_lengths(raw_length + 1, density, mean_span)[0] == inputs_length + 1


def test_output_widths_depend_on_length_only(random_rows_corrupted):
    _, inputs, targets = random_rows_corrupted
    assert inputs.shape == (ROWS, 512) and targets.shape == (ROWS, 114)
    rng = np.random.default_rng(1)
    for length in (2, 3, 17, 100, 568):
        for seed in (0, 1):
            rows = rng.integers(2, 32000, (int(rng.integers(1, 40)), length))
            inputs, targets = corrupt_spans(rows, sentinel_ids=SENTINELS, eos_id=EOS, seed=seed)
            assert (inputs.shape[1], targets.shape[1]) == corrupted_lengths(length)
            assert inputs.dtype == rows.dtype and targets.dtype == rows.dtype


# ----------------------------------------------------------------------------------------------------- randomness
def test_corruption_depends_on_seed_epoch_and_row_index_only():
    rows = np.random.default_rng(2).integers(2, 32000, (100, 100))
    kwargs = dict(sentinel_ids=SENTINELS, eos_id=EOS, noise_density=0.3, mean_noise_span_length=2.0, seed=7, epoch=3)
    whole = corrupt_spans(rows, **kwargs)
    second_half = corrupt_spans(rows[50:], row_offset=50, **kwargs)
    np.testing.assert_array_equal(second_half[0], whole[0][50:])
    np.testing.assert_array_equal(second_half[1], whole[1][50:])
    unshifted = corrupt_spans(rows[50:], **kwargs)
    assert not np.array_equal(unshifted[0], whole[0][50:])
    again = corrupt_spans(rows, **kwargs)
    np.testing.assert_array_equal(again[0], whole[0])
    for changed in (dict(kwargs, seed=8), dict(kwargs, epoch=4)):
        other = corrupt_spans(rows, **changed)
        assert (other[0] != whole[0]).any(axis=1).mean() > 0.9


# --------------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs, message", [
    (dict(noise_density=0.0), "noise_density=0.0"),
    (dict(noise_density=1.0), "noise_density=1.0"),
    (dict(noise_density=-0.2), "noise_density=-0.2"),
    (dict(mean_noise_span_length=0.5), "mean_noise_span_length=0.5"),
    (dict(sentinel_ids=SENTINELS[:5]), "5 sentinel_ids.*28 noise spans"),
    (dict(sentinel_ids=[7] * 30), "expected distinct ids"),
    (dict(rows=np.zeros((4, 1), np.int32)), "length=1"),
    (dict(rows=np.zeros(568, np.int32)), r"shape \(568,\).*2-D"),
    (dict(rows=np.zeros((1, 2, 568), np.int32)), r"shape \(1, 2, 568\)"),
    (dict(rows=np.zeros((4, 568), np.float32)), "dtype float32"),
    (dict(rows=np.zeros((4, 100), np.int32), noise_density=0.9, mean_noise_span_length=1.0), "90 noise spans"),
])
def test_bad_arguments_are_named(kwargs, message):
    arguments = dict(rows=np.zeros((4, 568), np.int32), sentinel_ids=SENTINELS, eos_id=EOS) | kwargs
    with pytest.raises(ValueError, match=message):
        corrupt_spans(**arguments)


def test_bad_lengths_are_named():
    with pytest.raises(ValueError, match="noise_density=1.5"):
        random_spans_noise_mask(100, 1.5, 3.0, example_rng(0, 0, 0))
    with pytest.raises(ValueError, match="length=1"):
        random_spans_noise_mask(1, 0.15, 3.0, example_rng(0, 0, 0))
    with pytest.raises(ValueError, match="inputs_length=2"):
        input_and_target_lengths(2)
    with pytest.raises(ValueError, match="mean_noise_span_length=0.9"):
        input_and_target_lengths(512, 0.15, 0.9)
    with pytest.raises(ValueError, match="count=5.*vocab_size=4"):
        t5_sentinel_ids(4, 5)


# ------------------------------------------------------------------------------------------------------ sentinels
def word_level_tokenizer(words: list[str], special: list[str]) -> tokenizers.Tokenizer:
    tokenizer = tokenizers.Tokenizer(tokenizer_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(special)
    return tokenizer


def test_sentinels_found_in_a_t5_like_tokenizer():
    # Added last to first, as T5's tokenizer has them: <extra_id_0> is the last id.
    tokenizer = word_level_tokenizer(["[UNK]", "</s>", "the", "cat", "sat"],
                                     [f"<extra_id_{i}>" for i in reversed(range(10))])
    ids = tokenizer_sentinel_ids(tokenizer, 10)
    assert ids == t5_sentinel_ids(tokenizer.get_vocab_size(), 10) == list(range(14, 4, -1))
    assert tokenizer.id_to_token(ids[0]) == "<extra_id_0>"
    assert tokenizer.encode("the <extra_id_1> sat").ids == [2, ids[1], 4]
    with pytest.raises(ValueError, match="2 of the 12 .*<extra_id_10>, <extra_id_11>"):
        tokenizer_sentinel_ids(tokenizer, 12)


def test_a_tokenizer_without_sentinels_is_refused():
    gpt2_like = tokenizers.Tokenizer(tokenizer_models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    gpt2_like.pre_tokenizer = pre_tokenizers.ByteLevel()
    gpt2_like.add_special_tokens(["<|endoftext|>"])
    with pytest.raises(ValueError, match="no sentinel tokens.*<extra_id_0>"):
        tokenizer_sentinel_ids(gpt2_like, 3)
    assert gpt2_like.get_vocab_size() == 4
    assert t5_sentinel_ids(gpt2_like.get_vocab_size() + 3, 3) == [6, 5, 4]  # new ids past the tokenizer's own
    assert t5_sentinel_ids(32100, 2) == [32099, 32098]


# ---------------------------------------------------------------------------------------------------------- speed
