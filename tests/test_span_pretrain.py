"""Span-corruption pre-training (``task="seq2seq"``, ``data.source="span_corruption"``,
``flaxzoo.train.finetune.span_pretrain``): its rows, batches and baseline against numpy, the settings it refuses, a
resumed epoch's batches equal to the uninterrupted epoch's, and (slow) the command line: a T5 trained on Python's
documentation beats the unigram baseline on held-out rows and its export loads in transformers."""

from __future__ import annotations

import json
import pathlib
import sys
import types

import numpy as np
import pytest

from flaxzoo.train.batches import IGNORE_INDEX
from flaxzoo.train.config import ConfigError
from flaxzoo.train.data.corpus import embedded_documents
from flaxzoo.train.data.span_corruption import corrupt_spans
from flaxzoo.train.finetune.config import FinetuneConfig
from flaxzoo.train.finetune.span_pretrain import SpanCorruptionTrainer, corrupted_batch, text_rows, unigram_loss

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from test_finetune_engine import run  # noqa: E402
from test_seq2seq_task import resolved  # noqa: E402

CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "configs"


def span_config(**values) -> FinetuneConfig:
    import importlib.util

    spec = importlib.util.spec_from_file_location("span_corruption_config", CONFIGS / "span_corruption.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return resolved(module.get_config(), values)


def test_text_rows_concatenate_documents_behind_their_eos_and_drop_the_remainder():
    rows = text_rows([[5, 6, 7], [8], [9, 10, 11, 12]], eos_id=2, length=4)
    np.testing.assert_array_equal(rows, [[5, 6, 7, 2], [8, 2, 9, 10]])  # 11 12 2 left over
    assert rows.dtype == np.int32 and text_rows([[5]], eos_id=2, length=3).shape == (0, 3)


def test_corrupted_batch_feeds_the_decoder_its_targets_behind_the_start_id():
    inputs, targets = np.array([[5, 99, 7, 2]]), np.array([[99, 6, 2]])
    batch = corrupted_batch(inputs, targets, start_id=0)
    np.testing.assert_array_equal(batch["decoder_input_ids"], [[0, 99, 6]])
    np.testing.assert_array_equal(batch["labels"], targets)
    assert batch["attention_mask"].all() and batch["decoder_attention_mask"].all()


def test_the_unigram_baseline_is_add_one_smoothed_frequencies():
    """Training tokens 3, 3, 1 over a vocabulary of 4: p = (counts + 1) / 7 = [1, 2, 1, 3] / 7."""
    got = unigram_loss(np.array([[3, 3, 1]]), np.array([[3, 0]]), vocab_size=4)
    assert got == pytest.approx(-(np.log(3 / 7) + np.log(1 / 7)) / 2)


def test_the_target_width_follows_from_the_source_length():
    assert span_config().data.target_width == 14  # 70 raw pieces: 11 hidden in 3 spans -> 11 + 3 + EOS
    assert span_config(**{"data.max_len": 512}).data.target_width == 114  # T5's 568 raw tokens -> 512 / 114


@pytest.mark.parametrize("values, key", [
    ({"data.target_max_len": 20}, "data.target_max_len"),
    ({"data.test_path": "held.txt"}, "data.test_path"),
    ({"num_beams": 4}, "num_beams"),
    ({"data.max_len": 3, "data.noise_density": 0.9}, "data.max_len"),
])
def test_settings_span_corruption_does_not_take_are_refused_by_name(values, key):
    with pytest.raises(ConfigError, match=rf"{key}"):
        span_config(**values)


def test_the_noise_settings_belong_to_span_corruption():
    with pytest.raises(ConfigError, match=r"data.noise_density: 0.3 applies to data.source='span_corruption'"):
        span_config(**{"data.source": "reverse_words", "data.noise_density": 0.3})


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """A trainer on 30 documents of the embedded corpus, its batches cut for one process (``run`` sets the
    placement when it builds the step)."""
    root = tmp_path_factory.mktemp("span")
    docs = embedded_documents()[:30]
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    cfg = span_config(**{"data.train_path": str(root / "docs.jsonl"), "batch_size": 8, "seed": 3,
                         "model.hidden_size": 32, "model.head_dim": 8, "model.intermediate_size": 64})
    trainer = SpanCorruptionTrainer(cfg, root / "work")
    trainer.placement = types.SimpleNamespace(rows=slice(None))  # one process: every row of a batch is its own
    return trainer


@pytest.mark.slow
def test_a_resumed_epoch_gets_the_uninterrupted_epochs_batches_and_each_restores_its_rows(trainer):
    """Skipping k batches of an epoch (a resume) gives the same later batches; every row's corruption puts back
    exactly its raw row (sentinels replaced by their spans); a new epoch corrupts afresh."""
    whole = list(trainer.epoch_batches(epoch=1, skip=0))
    resumed = list(trainer.epoch_batches(epoch=1, skip=3))
    assert len(resumed) == len(whole) - 3
    for a, b in zip(resumed, whole[3:]):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    sentinels, eos = trainer.sentinels, trainer.config.eos_token_ids[0]
    order = np.random.default_rng((3, 1)).permutation(len(trainer.encoded["train"]))
    batch = whole[1]
    for i, row in enumerate(trainer.encoded["train"][order[8:16]]):
        spans, current = {}, None
        for token in batch["labels"][i][:-1]:  # the targets without their EOS: sentinel, span, sentinel, span...
            if token in sentinels:
                current = spans[token] = []
            else:
                current.append(token)
        restored = [t for token in batch["input_ids"][i][:-1]
                    for t in (spans[token] if token in sentinels else [token])]
        np.testing.assert_array_equal(restored, row)
        assert batch["labels"][i][-1] == eos and batch["input_ids"][i][-1] == eos
    inputs, _ = corrupt_spans(trainer.encoded["train"][order[8:16]], sentinel_ids=sentinels, eos_id=eos, seed=3,
                              epoch=1, row_offset=8)
    np.testing.assert_array_equal(batch["input_ids"], inputs)
    assert not np.array_equal(list(trainer.epoch_batches(epoch=2, skip=0))[0]["input_ids"], whole[0]["input_ids"])


@pytest.mark.slow
def test_the_sentinels_take_ids_past_a_vocabulary_without_them(trainer):
    """MiniLM's WordPiece has no <extra_id_k>: the k-th sentinel is 30522 + 3 - 1 - k; a table without room for
    them is refused naming model.vocab_size."""
    assert trainer.sentinels == [30524, 30523, 30522]
    span_labels = trainer.span_labels(np.array([[30524, 17, 30523, 102]]))
    np.testing.assert_array_equal(span_labels, [[IGNORE_INDEX, 17, IGNORE_INDEX, IGNORE_INDEX]])
    trainer.config = trainer.config.replace(vocab_size=30522)
    try:
        with pytest.raises(ConfigError, match=r"model.vocab_size: 30522: .* expected at least 30525"):
            trainer._sentinels()
    finally:
        trainer.config = trainer.config.replace(vocab_size=30528)


@pytest.mark.slow
def test_a_tokenizer_trained_here_leaves_the_last_rows_to_the_sentinels(tmp_path):
    """``tokenizer="wordpiece"``: trained on the training documents with at most ``model.vocab_size`` minus a row's
    sentinels pieces; the sentinels take the ids right past it, inside the table; the same pieces on a second run;
    an EOS id that is none of its special tokens is refused by name."""
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in embedded_documents()[:30]))
    values = {"data.train_path": str(tmp_path / "docs.jsonl"), "tokenizer": "wordpiece", "model.vocab_size": 300,
              "data.data_dir": str(tmp_path / "data"), "model.hidden_size": 32, "model.head_dim": 8,
              "model.intermediate_size": 64, "model.eos_token_id": 3}
    with pytest.raises(ConfigError, match=r"model.eos_token_id: 102: the wordpiece tokenizer trained on the data "
                                          r"has the special tokens \{'\[PAD\]': 0, .*expected one of their ids"):
        SpanCorruptionTrainer(span_config(**{**values, "model.eos_token_id": 102}), tmp_path / "c")
    first, second = (SpanCorruptionTrainer(span_config(**values), tmp_path / name) for name in ("a", "b"))
    size = first.tokenizer.get_vocab_size()
    assert size <= 300 - first.num_spans and first.sentinels == list(range(size + first.num_spans - 1, size - 1, -1))
    assert second.tokenizer.to_str() == first.tokenizer.to_str() and first.tokenizer.token_to_id("[SEP]") == 3


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_pretraining_beats_the_unigram_baseline_on_held_out_documents(tmp_path):
    """``python -m flaxzoo.train --config span_corruption`` on a share of the embedded corpus: the held-out rows'
    target loss and the spans' loss fall below the unigram baseline's; the export loads in transformers."""
    import torch
    import transformers

    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in embedded_documents()[:100]))
    args = ["--config", "span_corruption", "--workdir", str(tmp_path / "run"), "--config.epochs=2",
            f"--config.data.train_path={tmp_path / 'docs.jsonl'}", "--config.log_every=10",
            # 64 wide, not the config's 128: 31 s instead of 53 s alone, the spans' loss as far below the baseline
            # (seeds 0 / 1 / 2: 6.47 / 6.04 / 6.74 against the unigram's 6.86 / 6.71 / 7.13; 128 wide, seed 0: 6.49)
            "--config.model.hidden_size=64", "--config.model.head_dim=16", "--config.model.intermediate_size=128"]
    done = run(args, timeout=600, XLA_FLAGS="")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text())
    print(f"\n  span corruption: {metrics['steps']} steps; held-out loss {metrics['loss']:.3f} (unigram "
          f"{metrics['unigram_loss']:.3f}), spans {metrics['span_loss']:.3f} (unigram "
          f"{metrics['unigram_span_loss']:.3f})")
    assert metrics["loss"] < metrics["unigram_loss"] - 0.2
    assert metrics["span_loss"] < metrics["unigram_span_loss"]
    shown = [json.loads(line) for line in (tmp_path / "run" / "eval" / "predictions.jsonl").read_text().splitlines()]
    assert len(shown) == 8 and all(row["target"].startswith("<extra_id_0>") for row in shown)
    from flaxzoo import models

    model = models.from_pretrained(str(tmp_path / "run"))
    models.save_pretrained(model, tmp_path / "hf")
    hf = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    source, target = np.array([[2054, 30524, 2003, 102]]), np.array([[0, 30524, 1037]])
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(source), decoder_input_ids=torch.tensor(target)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(source, None, target)), theirs, atol=1e-4)
