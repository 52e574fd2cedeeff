"""The input pipeline (train/data/, train/tokenizer.py): corpus, tokenizers, packing (segment ids, isolation in
real models), masking (counts, 80/10/10, determinism per example), Grain loading, resume by step."""

import collections
import hashlib
import json
import logging
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

from flaxzoo import models

from flaxzoo.train import batches as batchlib, data, tokenizer as toklib
from flaxzoo.train.data import IGNORE_INDEX, DataConfig
from flaxzoo.train.data import builders, packing, tokenizers

REPO = pathlib.Path(__file__).resolve().parent.parent
HELPER = REPO / "tests" / "data_helper.py"


# ------------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("flaxzoo_data"))


@pytest.fixture(scope="session")
def causal_cfg(data_dir):
    return DataConfig(data_dir=data_dir, tokenizer="bpe", vocab_size=1000, tokenizer_max_docs=1500, seq_len=64,
                      batch_size=8, objective="causal", seed=0)


@pytest.fixture(scope="session")
def mlm_cfg(data_dir):
    return DataConfig(data_dir=data_dir, tokenizer="wordpiece", vocab_size=1000, tokenizer_max_docs=1500, seq_len=64,
                      batch_size=8, objective="mlm", seed=0)


@pytest.fixture(scope="session")
def causal_setup(causal_cfg):
    tok = data.build_tokenizer(causal_cfg)
    return tok, data.prepare(causal_cfg, tok)


@pytest.fixture(scope="session")
def mlm_setup(mlm_cfg):
    tok = data.build_tokenizer(mlm_cfg)
    return tok, data.prepare(mlm_cfg, tok)


def run_helper(*args, timeout=240):
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, str(HELPER), *map(str, args)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"helper {args[0]} failed:\n{proc.stdout}\n{proc.stderr}"


def load_batches(path):
    with np.load(path) as z:
        out = {}
        for key in z.files:
            i, name = key.split("/")
            out.setdefault(int(i), {})[name] = z[key]
    return [out[i] for i in sorted(out)]


def assert_batches_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# ------------------------------------------------------------------------------------------------------- corpus
@pytest.mark.slow
def test_embedded_corpus_is_sizeable_and_identical_across_processes(causal_cfg):
    docs = data.embedded_documents()
    chars = sum(map(len, docs))
    assert len(docs) > 3000 and 1_200_000 < chars < 3_000_000, (len(docs), chars)
    assert len(set(docs)) == len(docs)
    digest = hashlib.sha256("\0".join(docs).encode()).hexdigest()
    code = ("import hashlib, sys; from flaxzoo.train.data import embedded_documents; "
            "print(hashlib.sha256('\\0'.join(embedded_documents()).encode()).hexdigest())")
    other = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip().splitlines()[-1] == digest
    corpus = data.raw_sources(causal_cfg)
    train, val = list(corpus.texts("train")), list(corpus.texts("validation"))
    assert len(train) + len(val) == len(docs) and not set(train) & set(val)
    assert 0.02 < len(val) / len(docs) < 0.08


# --------------------------------------------------------------------------------------------------- tokenizers
def test_bpe_trained_on_embedded_corpus_round_trips_exactly(causal_setup, causal_cfg):
    tok, _ = causal_setup
    assert tok.kind == "bpe" and tok.vocab_size == 1000 and tok.eos_id == 0
    texts = list(data.raw_sources(causal_cfg).texts("validation"))[:300]
    texts += ["  leading and trailing spaces  ", "tabs\tand\r\nCRLF\n\n\nblank lines", "émoji 🤖 日本語 ÄÖÜß",
              "literal <|endoftext|> stays text", "\x00\x01 control bytes \ufffd", ""]
    for text in texts:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    assert 0 not in tok.encode("literal <|endoftext|> stays text")  # special strings in text are plain text


def test_wordpiece_from_vocab_txt_follows_greedy_longest_match(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "un", "##aff", "##able", "##a", "##ff", "play",
             "##ing", "##s", "runn", "##ning", "run", "!", ",", "hello", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tok = toklib.load_tokenizer(tmp_path)  # a directory holding vocab.txt
    text = "Hello, the UNAFFABLE players plays running!"
    # lower-cased, split on white space and punctuation, then per word the longest vocabulary prefix first:
    # unaffable -> un ##aff ##able (not ##a ##ff ...); players -> play + "##ers" unmatchable -> the whole word is
    # [UNK]; plays -> play ##s; running -> runn ##ing (longest first, not run ##ning).
    expected = ["hello", ",", "the", "un", "##aff", "##able", "[UNK]", "play", "##s", "runn", "##ing", "!"]
    assert tok.tokens(text) == expected
    assert tok.encode(text) == [vocab.index(t) for t in expected]
    assert tok.require("cls", "sep", "mask", "pad") == {"cls": 2, "sep": 3, "mask": 4, "pad": 0}
    with_specials = tok.tokenizer.encode(text).tokens
    assert with_specials[0] == "[CLS]" and with_specials[-1] == "[SEP]"


def test_tokenizer_save_load_add_tokens_and_deterministic_wordpiece(tmp_path):
    docs = data.embedded_documents()[:800]
    a = toklib.train_tokenizer(docs, "wordpiece", 600)
    b = toklib.train_tokenizer(docs, "wordpiece", 600)
    assert a.fingerprint() == b.fingerprint()  # canonical numbering, despite the trainer's hash-map order
    assert a.special_tokens == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    path = a.save(tmp_path / "wp")
    assert path.name == "tokenizer.json" and toklib.load_tokenizer(path).fingerprint() == a.fingerprint()
    bpe = toklib.train_tokenizer(docs, "bpe", 400)
    before = bpe.vocab_size
    assert bpe.add_tokens(["<|user|>", "flaxzoo"], special=False) == 2
    assert bpe.vocab_size == before + 2
    assert bpe.encode("flaxzoo")[0] == before + 1
    reloaded = toklib.load_tokenizer(bpe.save(tmp_path / "grown"))
    assert reloaded.vocab_size == before + 2 and reloaded.encode("<|user|>") == [before]


# ------------------------------------------------------------------------------------------------------ packing
def test_pack_causal_keeps_every_token_once_in_order():
    rng = np.random.default_rng(0)
    docs = [list(rng.integers(1, 500, n)) for n in rng.integers(0, 150, 300)]
    seq_len, eos = 32, 0
    packed = list(data.pack_causal(docs, seq_len, eos))
    windows = [w for w, _ in packed]
    stream = np.concatenate([np.r_[d, eos] for d in docs if len(d)]).astype(np.int32)
    owner = np.concatenate([np.full(len(d) + 1, i) for i, d in enumerate(d for d in docs if len(d))])
    assert all(w.shape == s.shape == (seq_len + 1,) and w.dtype == s.dtype == np.int32 for w, s in packed)
    for k, (_, segments) in enumerate(packed):  # each window's documents numbered from 1, in stream order
        o = owner[k * seq_len:k * seq_len + seq_len + 1]
        np.testing.assert_array_equal(segments, np.unique(o, return_inverse=True)[1] + 1)
    inputs = np.concatenate([w[:-1] for w in windows])
    targets = np.concatenate([w[1:] for w in windows])
    n = len(windows) * seq_len
    assert len(stream) - seq_len <= n <= len(stream) - 1  # only the incomplete tail is dropped
    np.testing.assert_array_equal(inputs, stream[:n])
    np.testing.assert_array_equal(targets, stream[1:n + 1])


def test_prepared_causal_records_round_trip_the_corpus(causal_setup, causal_cfg):
    tok, sources = causal_setup
    records = sources["train"]
    windows = np.stack([records[i]["input_ids"] for i in range(len(records))])
    assert windows.shape == (len(records), causal_cfg.seq_len + 1)
    docs = list(data.raw_sources(causal_cfg).texts("train"))
    stream = np.concatenate([np.r_[ids, tok.eos_id] for ids in tok.encode_batch(docs)]).astype(np.int32)
    inputs = windows[:, :-1].reshape(-1)
    np.testing.assert_array_equal(inputs, stream[:len(inputs)])
    np.testing.assert_array_equal(windows[1:, 0], windows[:-1, -1])
    assert len(stream) - len(inputs) <= causal_cfg.seq_len
    # segment ids: a new document starts after each EOS (numbered from 1 in every window)
    segments = np.stack([records[i]["segment_ids"] for i in range(len(records))])
    owner = np.cumsum(np.r_[0, stream[:-1] == tok.eos_id])
    for k in (0, 1, len(records) // 2, len(records) - 1):
        o = owner[k * causal_cfg.seq_len:(k + 1) * causal_cfg.seq_len + 1]
        np.testing.assert_array_equal(segments[k], o - o[0] + 1)
    # Decoding the packed stream gives the documents back, split at EOS.
    text = tok.decode(inputs)
    pieces = text.split("<|endoftext|>")
    assert pieces[:-1] == docs[:len(pieces) - 1]


def test_pack_mlm_layout_and_round_trip():
    rng = np.random.default_rng(1)
    documents = [[list(rng.integers(10, 500, n)) for n in rng.integers(1, 40, k)] for k in rng.integers(1, 8, 120)]
    documents[5].append(list(range(10, 110)))  # longer than seq_len - 2: cut into pieces
    cls_id, sep_id, pad_id, seq_len = 2, 3, 0, 32
    records = list(data.pack_mlm(documents, seq_len, cls_id=cls_id, sep_id=sep_id, pad_id=pad_id))
    # Independent reading: each segment is [CLS] ... [SEP]; its content is a run of whole sentences of one document.
    sentences = [(d, list(map(int, s))) for d, doc in enumerate(documents) for s in doc]
    at = 0  # the next sentence (or piece of one) expected
    pieces = []
    for d, sent in sentences:
        pieces += [(d, sent[i:i + seq_len - 2]) for i in range(0, len(sent), seq_len - 2)]
    for ids, segments in records:
        assert ids.shape == segments.shape == (seq_len,) and ids.dtype == segments.dtype == np.int32
        n_real = int((segments > 0).sum())
        assert (segments[:n_real] > 0).all() and (ids[n_real:] == pad_id).all()
        assert (np.diff(segments[:n_real]) >= 0).all() and (np.diff(segments[:n_real]) <= 1).all()
        assert segments[0] == 1
        for s in range(1, segments.max() + 1):
            seg = ids[segments == s]
            assert seg[0] == cls_id and seg[-1] == sep_id and not np.isin(seg[1:-1], (cls_id, sep_id)).any()
            content, docs_seen = list(map(int, seg[1:-1])), set()
            while content:
                d, piece = pieces[at]
                assert content[:len(piece)] == piece, "a sentence split across rows or out of order"
                content = content[len(piece):]
                docs_seen.add(d)
                at += 1
            assert len(docs_seen) == 1, "two documents share a segment"
    assert at == len(pieces)
    pad_share = sum(int((s == 0).sum()) for _, s in records) / (len(records) * seq_len)
    assert pad_share < 0.35, pad_share


def _row_with_segments(batches, at_least):
    for b in batches:
        for r in range(len(b["segment_ids"])):
            if b["segment_ids"][r].max() >= at_least:
                return {k: v[r:r + 1] for k, v in b.items()}
    raise AssertionError(f"no row with {at_least} segments")


def jitted(model):
    """``model``'s forward pass as one compiled program per input shape (eager mode compiles op by op)."""
    from flax import nnx

    graphdef, state = nnx.split(model)
    return jax.jit(lambda *args, **kwargs: nnx.merge(graphdef, state)(*args, **kwargs))


def test_packed_causal_row_gives_document_2_its_own_logits(causal_setup, causal_cfg):
    """A tiny GPT on a packed row with its segment_ids: document 2's logits equal document 2 fed alone."""
    tok, sources = causal_setup
    row = _row_with_segments(data.make_iterator(causal_cfg, "train", tok, sources=sources, num_epochs=1), 3)
    model = models.create_model(models.get_preset("gpt2-tiny", vocab_size=tok.vocab_size), models.GPTForCausalLM,
                                seed=1)
    ids, segments = row["input_ids"], row["segment_ids"]
    run = jitted(model)
    packed = np.asarray(run(jnp.asarray(ids), segment_ids=jnp.asarray(segments)))
    doc2 = segments[0] == 2
    alone = np.asarray(run(jnp.asarray(ids[:, doc2])))
    np.testing.assert_allclose(packed[0, doc2], alone[0], atol=1e-5, rtol=0)
    leaky = np.asarray(run(jnp.asarray(ids)))  # the row as one document: document 2 sees document 1
    assert np.abs(leaky[0, doc2] - alone[0]).max() > 1e-3
    # document 2's last token is its EOS; its target (document 3's first token) is not scored, the others are
    targets = row["targets"][0, doc2]
    assert ids[0, doc2][-1] == tok.eos_id and targets[-1] == IGNORE_INDEX and (targets[:-1] != IGNORE_INDEX).all()


def test_packed_mlm_row_gives_segment_2_its_own_logits(mlm_setup, mlm_cfg):
    """A tiny BERT on a packed MLM row with its segment_ids: segment 2's logits equal segment 2 fed alone."""
    tok, sources = mlm_setup
    row = _row_with_segments(data.make_iterator(mlm_cfg, "train", tok, sources=sources, num_epochs=1), 2)
    model = models.create_model(models.get_preset("bert-tiny", vocab_size=tok.vocab_size), models.BertForMaskedLM,
                                seed=1)
    args = [jnp.asarray(row[k]) for k in ("input_ids", "attention_mask", "token_type_ids")]
    run = jitted(model)
    packed = np.asarray(run(*args, segment_ids=jnp.asarray(row["segment_ids"])))
    seg2 = row["segment_ids"][0] == 2
    alone_ids = row["input_ids"][:, seg2]
    assert alone_ids[0, 0] != tok.pad_id
    alone = np.asarray(run(jnp.asarray(alone_ids), jnp.ones_like(jnp.asarray(alone_ids))))
    np.testing.assert_allclose(packed[0, seg2], alone[0], atol=1e-5, rtol=0)
    leaky = np.asarray(run(*args))  # attention_mask only: segment 2 sees segment 1
    assert np.abs(leaky[0, seg2] - alone[0]).max() > 1e-3


# ------------------------------------------------------------------------------------------------------ masking
def test_mask_tokens_counts_specials_proportions_and_slots():
    rng = np.random.default_rng(0)
    special = (0, 1, 2, 3, 4)
    ids = rng.integers(0, 50, (4000, 128)).astype(np.int32)
    ids[:5, :] = 0  # rows without a candidate: nothing predicted
    ids[5:10, 3:] = 0  # rows with few candidates: at least one predicted
    keys = data.example_keys(7, 0, np.arange(len(ids)))
    out = data.mask_tokens(ids, keys, vocab_size=50, mask_id=4, special_ids=special, prob=0.15, max_predictions=17)
    inputs, labels = out["input_ids"], out["labels"]
    assert all(v.dtype == np.int32 for v in out.values()) and inputs.shape == labels.shape == ids.shape
    assert out["masked_positions"].shape == out["masked_labels"].shape == (len(ids), 17)
    is_special = np.isin(ids, special)
    assert (labels[is_special] == IGNORE_INDEX).all() and (inputs[is_special] == ids[is_special]).all()
    masked = labels != IGNORE_INDEX
    assert (labels[masked] == ids[masked]).all() and (inputs[~masked] == ids[~masked]).all()
    # exactly min(P, max(1, round(candidates * p))) per row (0 without candidates), P = 17 here
    candidates = (~is_special).sum(1)
    expected = np.array([0 if c == 0 else min(17, max(1, round(c * 0.15))) for c in candidates])
    np.testing.assert_array_equal(masked.sum(1), expected)
    assert expected[:5].sum() == 0 and (expected[5:10] >= 1).all()
    assert (expected[10:] == 17).mean() > 0.5 and (expected[10:] < 17).any()  # the cap, and rows under it
    # the slots: the masked positions ascending, then position 0 / IGNORE_INDEX
    for r in range(len(ids)):
        where = np.flatnonzero(masked[r])
        n = len(where)
        np.testing.assert_array_equal(out["masked_positions"][r, :n], where)
        np.testing.assert_array_equal(out["masked_labels"][r, :n], ids[r, where])
        assert (out["masked_positions"][r, n:] == 0).all() and (out["masked_labels"][r, n:] == IGNORE_INDEX).all()
    # 80 % [MASK], 10 % random non-special, 10 % unchanged (a random draw equal to the original counts as unchanged)
    total = masked.sum()
    as_mask = (masked & (inputs == 4)).sum() / total
    unchanged = (masked & (inputs == ids)).sum() / total
    random = masked & (inputs != 4) & (inputs != ids)
    assert abs(as_mask - 0.8) < 0.01 and abs(random.sum() / total - 0.1 * 44 / 45) < 0.01, (as_mask, random.sum())
    assert abs(unchanged - (0.1 + 0.1 / 45)) < 0.01, unchanged
    assert not np.isin(inputs[random], special).any()
    # chosen uniformly: every column of the candidates is picked about equally often
    per_column = masked[10:].sum(0) / (~is_special[10:]).sum(0)
    assert per_column.max() - per_column.min() < 0.05, per_column
    # deterministic per key: the same rows alone, in another order, give the same result
    again = data.mask_tokens(ids[[30, 10, 20]], keys[[30, 10, 20]], vocab_size=50, mask_id=4, special_ids=special,
                             prob=0.15, max_predictions=17)
    for k, v in again.items():
        np.testing.assert_array_equal(v, out[k][[30, 10, 20]])
    other = data.mask_tokens(ids, data.example_keys(8, 0, np.arange(len(ids))), vocab_size=50, mask_id=4,
                             special_ids=special, prob=0.15, max_predictions=17)
    assert (other["labels"] != labels).any()
    with pytest.raises(ValueError, match="prob"):
        data.mask_tokens(ids, keys, vocab_size=50, mask_id=4, special_ids=special, prob=0.0, max_predictions=17)


def test_max_predictions_setting():
    assert DataConfig(seq_len=128).predictions == 20 and DataConfig(seq_len=20).predictions == 3
    assert DataConfig(seq_len=128, max_predictions=7).predictions == 7
    for bad in (-1, 129, 2.5):
        with pytest.raises(ValueError, match=f"max_predictions={bad}"):
            DataConfig(seq_len=128, max_predictions=bad)


def test_mlm_batches_masking_statistics_over_200k_tokens(mlm_setup, mlm_cfg):
    tok, sources = mlm_setup
    special = list(tok.special_ids)
    it = data.make_iterator(mlm_cfg, "train", tok, sources=sources)
    shapes = data.batch_shapes(mlm_cfg, mlm_cfg.batch_size)
    eligible = masked = as_mask = as_random = unchanged = 0
    while eligible < 200_000:
        b = next(it)
        assert list(b) == list(batchlib.MLM_KEYS)
        assert {k: v.shape for k, v in b.items()} == shapes and all(v.dtype == np.int32 for v in b.values())
        sel = b["labels"] != IGNORE_INDEX
        original = np.where(sel, b["labels"], b["input_ids"])
        is_special = np.isin(original, special)
        assert not (sel & is_special).any(), "a special token was masked"
        assert ((original == tok.pad_id) == (b["attention_mask"] == 0)).all()
        assert ((b["segment_ids"] > 0) == (b["attention_mask"] == 1)).all() and (b["token_type_ids"] == 0).all()
        assert ((original == tok.require("cls")["cls"]) == (np.diff(b["segment_ids"], prepend=0, axis=1) > 0)).all()
        candidates = (~is_special).sum(1)
        np.testing.assert_array_equal(sel.sum(1), np.minimum(mlm_cfg.predictions,
                                                             np.maximum(1, np.rint(candidates * 0.15))))
        for r in range(len(sel)):
            where = np.flatnonzero(sel[r])
            np.testing.assert_array_equal(b["masked_positions"][r, :len(where)], where)
            np.testing.assert_array_equal(b["masked_labels"][r, :len(where)], b["labels"][r, where])
            assert (b["masked_labels"][r, len(where):] == IGNORE_INDEX).all()
        eligible += int((~is_special).sum())
        masked += int(sel.sum())
        as_mask += int((sel & (b["input_ids"] == tok.mask_id)).sum())
        unchanged += int((sel & (b["input_ids"] == b["labels"])).sum())
        rand = sel & (b["input_ids"] != tok.mask_id) & (b["input_ids"] != b["labels"])
        as_random += int(rand.sum())
        assert not np.isin(b["input_ids"][rand], special).any()
    assert abs(masked / eligible - 0.15) <= 0.01, masked / eligible
    assert abs(as_mask / masked - 0.8) <= 0.01, as_mask / masked
    assert abs(as_random / masked - 0.1) <= 0.01, as_random / masked
    assert abs(unchanged / masked - 0.1) <= 0.01, unchanged / masked


def test_mlm_masking_is_per_example_whatever_the_batch_size_and_rows(mlm_setup):
    """Record at position p of an epoch is masked the same in batches of 4 or 8 and in either process's rows."""
    tok, sources = mlm_setup
    masking = {"vocab_size": tok.vocab_size, "mask_id": tok.mask_id, "pad_id": tok.pad_id,
               "special_ids": tuple(tok.special_ids), "prob": 0.15, "max_predictions": 10}
    common = dict(shuffle=True, seed=5, num_epochs=None, objective="mlm", masking=masking)
    eight = data.BatchSource(sources["train"], global_batch=8, rows=range(0, 8), **common)
    four = data.BatchSource(sources["train"], global_batch=4, rows=range(0, 4), **common)
    second_half = data.BatchSource(sources["train"], global_batch=8, rows=range(4, 8), **common)
    for g in (0, 3):
        whole = eight[g]
        halves = [four[2 * g], four[2 * g + 1]]
        for k in whole:
            np.testing.assert_array_equal(np.concatenate([h[k] for h in halves]), whole[k], err_msg=k)
            np.testing.assert_array_equal(second_half[g][k], whole[k][4:], err_msg=k)
    assert not np.array_equal(eight[0]["labels"], eight[eight.batches_per_epoch]["labels"])  # new epoch, new masks


# ------------------------------------------------------------------------------------------------------ loading
def test_causal_batches_shape_targets_and_epochs(causal_setup, causal_cfg):
    tok, sources = causal_setup
    b = next(data.make_iterator(causal_cfg, "train", tok, sources=sources))
    assert list(b) == list(batchlib.CAUSAL_KEYS)
    assert {k: v.shape for k, v in b.items()} == data.batch_shapes(causal_cfg, 8)
    assert all(v.shape == (8, 64) and v.dtype == np.int32 for v in b.values())
    scored = b["targets"] != IGNORE_INDEX
    np.testing.assert_array_equal(b["input_ids"][:, 1:][scored[:, :-1]], b["targets"][:, :-1][scored[:, :-1]])
    # Not scored exactly where the input token is an EOS (its next token starts another document).
    np.testing.assert_array_equal(~scored, b["input_ids"] == tok.eos_id)
    # segment ids: from 1, one more after each EOS
    np.testing.assert_array_equal(b["segment_ids"], 1 + np.cumsum(np.pad(b["input_ids"][:, :-1] == tok.eos_id,
                                                                        ((0, 0), (1, 0))), axis=1))
    # One shuffled epoch visits each record at most once and all but the incomplete last batch.
    n = len(sources["train"])
    epoch = list(data.make_iterator(causal_cfg, "train", tok, sources=sources, num_epochs=1))
    assert len(epoch) == n // 8
    seen = collections.Counter(r.tobytes() for e in epoch for r in e["input_ids"])
    available = collections.Counter(sources["train"][i]["input_ids"][:-1].tobytes() for i in range(n))
    assert sum(seen.values()) == len(epoch) * 8 and not seen - available  # a sub-multiset: no record twice
    ordered = list(data.make_iterator(causal_cfg, "validation", tok, sources=sources, num_epochs=1, shuffle=False))
    first = sources["validation"][0]["input_ids"][:-1]
    np.testing.assert_array_equal(ordered[0]["input_ids"][0], first)


@pytest.mark.parametrize("objective", ["causal", "mlm"])
def test_evaluation_reads_the_whole_split_and_pads_the_last_batch(objective, causal_setup, mlm_setup, causal_cfg,
                                                                   mlm_cfg):
    """With pad_last every validation record is read once, in order; the rows completing the last batch score
    nothing (targets / labels -100, MLM attention mask 0). A batch larger than the whole split still gives one."""
    tok, sources = causal_setup if objective == "causal" else mlm_setup
    cfg = causal_cfg if objective == "causal" else mlm_cfg
    records = sources["validation"]
    n = len(records)
    for batch_size in (8, 2 * n + 8):  # a partial last batch; a split smaller than one batch
        batches = list(data.make_iterator(cfg.replace(batch_size=batch_size), "validation", tok, sources=sources,
                                          num_epochs=1, shuffle=False, pad_last=True))
        assert len(batches) == -(-n // batch_size)
        scored = "targets" if objective == "causal" else "labels"
        rows = np.concatenate([b[scored] for b in batches])
        assert rows.shape[0] == len(batches) * batch_size
        padding = rows[n:]
        assert (padding == data.IGNORE_INDEX).all()
        segments = np.concatenate([b["segment_ids"] for b in batches])
        assert (segments[n:] == 0).all()
        if objective == "causal":
            windows = np.stack([records[i]["input_ids"] for i in range(n)])
            boundary = windows[:, :-1] == tok.eos_id
            np.testing.assert_array_equal(rows[:n], np.where(boundary, IGNORE_INDEX, windows[:, 1:]))
        else:
            assert (np.concatenate([b["attention_mask"] for b in batches])[n:] == 0).all()
            assert (np.concatenate([b["masked_labels"] for b in batches])[n:] == IGNORE_INDEX).all()
            assert (rows[:n] != data.IGNORE_INDEX).any()
    with pytest.raises(ValueError, match="pad_last needs num_epochs"):
        data.make_iterator(cfg, "validation", tok, sources=sources, pad_last=True)


def test_process_rows_compose_the_global_batch(causal_setup):
    _, sources = causal_setup
    common = dict(global_batch=8, shuffle=True, seed=3, num_epochs=None, objective="causal")
    full = data.BatchSource(sources["train"], rows=range(0, 8), **common)
    halves = [data.BatchSource(sources["train"], rows=range(r, r + 4), **common) for r in (0, 4)]
    # Interleaved rows (a mesh whose batch axes alternate between processes): each row is the global batch's row.
    interleaved = [data.BatchSource(sources["train"], rows=[r, r + 2, r + 4, r + 6], **common) for r in (0, 1)]
    for g in (0, 7, full.batches_per_epoch + 2):
        joined = np.concatenate([h[g]["input_ids"] for h in halves])
        np.testing.assert_array_equal(joined, full[g]["input_ids"])
        for r, part in enumerate(interleaved):
            np.testing.assert_array_equal(part[g]["input_ids"], full[g]["input_ids"][r::2])
    with pytest.raises(ValueError, match=r"rows=\[3, 1\]: expected ascending distinct row indices in \[0, 8\)"):
        data.BatchSource(sources["train"], rows=[3, 1], **common)


@pytest.mark.slow
@pytest.mark.slow
def test_same_seed_same_batches_in_two_processes_different_seed_differs(causal_setup, causal_cfg, tmp_path):
    cfg = causal_cfg.to_dict()
    run_helper("batches", json.dumps(cfg), tmp_path / "a.npz", 4)
    run_helper("batches", json.dumps({**cfg, "worker_count": 2}), tmp_path / "b.npz", 4)  # workers: same batches
    run_helper("batches", json.dumps({**cfg, "seed": 1}), tmp_path / "c.npz", 4)
    a, b, c = (load_batches(tmp_path / f"{x}.npz") for x in "abc")
    assert len(a) == len(b) == len(c) == 4
    for x, y in zip(a, b):
        assert_batches_equal(x, y)
    assert not all(np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, c))
    mine = data.make_iterator(causal_cfg, "train", causal_setup[0], sources=causal_setup[1])
    assert_batches_equal(next(mine), a[0])


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["causal", "mlm"])
def test_resume_in_a_new_process_gives_batch_k_plus_1(objective, causal_setup, mlm_setup, causal_cfg, mlm_cfg,
                                                     tmp_path):
    cfg, (tok, sources) = (causal_cfg, causal_setup) if objective == "causal" else (mlm_cfg, mlm_setup)
    k = 5
    out = tmp_path / "resumed.npz"
    run_helper("save", json.dumps(cfg.to_dict()), str(out) + ".state", k)
    run_helper("resume", json.dumps(cfg.to_dict()), out, k)
    resumed = load_batches(out)[0]
    it = data.make_iterator(cfg, "train", tok, sources=sources)
    uninterrupted = [next(it) for _ in range(k + 1)]
    assert_batches_equal(resumed, uninterrupted[k])
    assert not np.array_equal(resumed["input_ids"], uninterrupted[k - 1]["input_ids"])


@pytest.mark.slow
def test_full_pipeline_run_never_imports_tensorflow(tmp_path):
    cfg = DataConfig(data_dir=str(tmp_path / "fresh"), tokenizer="bpe", vocab_size=600, tokenizer_max_docs=400,
                     seq_len=32, batch_size=4)
    out = tmp_path / "full.json"
    run_helper("full", json.dumps(cfg.to_dict()), out)
    result = json.loads(out.read_text())
    assert result["tensorflow_imported"] is False and result["tf_like_modules"] == []
    assert result["splits"]["train"] > 100 and result["shapes"][0] == {"input_ids": [4, 32], "targets": [4, 32], "segment_ids": [4, 32]}


def test_second_run_reuses_the_cache(causal_setup, causal_cfg, monkeypatch):
    _, sources = causal_setup

    def boom(*args, **kwargs):
        raise AssertionError("rebuilt instead of reusing the cache")

    monkeypatch.setattr(packing, "tokenized", boom)
    monkeypatch.setattr(packing, "pack_causal", boom)
    monkeypatch.setattr(tokenizers, "train_tokenizer", boom)
    monkeypatch.setattr(builders.corpuslib, "embedded_documents", boom)
    tok = data.build_tokenizer(causal_cfg)
    again = data.prepare(causal_cfg, tok)
    assert {k: len(v) for k, v in again.items()} == {k: len(v) for k, v in sources.items()}


def test_user_files_text_and_jsonl(tmp_path, capfd):
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    paragraphs = [" ".join(rng.choice(words, 30)) + "." for _ in range(60)]
    (tmp_path / "a.txt").write_text("\n\n".join(paragraphs[:30]), encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("\n\n".join(paragraphs[30:]), encoding="utf-8")
    rows = [{"text": p, "id": i} for i, p in enumerate(paragraphs[:20])]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    found = data.read_text_files([str(tmp_path / "**" / "*.txt"), str(tmp_path / "c.jsonl")])
    assert [f.name for f in found.files] == ["a.txt", "c.jsonl", "b.txt"]  # sorted by full path
    joined = "\n\n".join(found.train + found.validation)
    assert all(p in joined for p in paragraphs) and found.replaced == 0
    cfg = DataConfig(source="files", paths=[str(tmp_path / "*.txt"), str(tmp_path / "c.jsonl")],
                     data_dir=str(tmp_path / "dd"), tokenizer="bpe", vocab_size=300, seq_len=16, batch_size=4)
    batch = next(data.make_iterator(cfg))
    assert batch["input_ids"].shape == (4, 16)
    printed = capfd.readouterr().out
    assert "Downloading" not in printed and "downloaded" not in printed, printed  # flaxzoo's builders fetch nothing


class FlaxzooTestCatalog(tfds.core.GeneratorBasedBuilder):
    """Stands in for a TFDS catalog dataset (e.g. lm1b): registered by name, a "sentence" feature, train/test."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"sentence": tfds.features.Text(), "label": tfds.features.ClassLabel(num_classes=2)}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(400), "test": self._generate_examples(40, offset=1000)}

    def _generate_examples(self, n, offset=0):
        for i in range(offset, offset + n):
            yield i, {"sentence": f"Sentence number {i} says that {i % 7} plus {i % 5} is {i % 7 + i % 5}.",
                      "label": i % 2}


def test_tfds_catalog_source_by_name(tmp_path):
    cfg = DataConfig(source="tfds:flaxzoo_test_catalog", text_field="sentence", data_dir=str(tmp_path / "dd"),
                     tokenizer="bpe", vocab_size=300, seq_len=16, batch_size=4)
    corpus = data.raw_sources(cfg)
    assert sorted(corpus.sources) == ["train", "validation"]  # the catalog's test split stands in for validation
    assert len(list(corpus.texts("validation"))) == 40
    sources = data.prepare(cfg)
    assert len(sources["train"]) > 50
    batch = next(data.make_iterator(cfg, "validation", num_epochs=1, shuffle=False))
    assert batch["input_ids"].shape == (4, 16)
    with pytest.raises(ValueError, match="text_field='text'"):
        data.raw_sources(cfg.replace(text_field="text"))


# ---------------------------------------------------------------------------------------------------- bad input
def test_missing_file_is_named(tmp_path):
    missing = str(tmp_path / "nope.txt")
    cfg = DataConfig(source="files", paths=[missing], data_dir=str(tmp_path / "dd"))
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        data.prepare(cfg)
    with pytest.raises(FileNotFoundError, match=r"nothing\*\.jsonl"):
        data.read_text_files([str(tmp_path / "nothing*.jsonl")])


def test_empty_corpus_is_an_error(tmp_path):
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    (tmp_path / "blank.txt").write_text("  \n\n \n", encoding="utf-8")
    cfg = DataConfig(source="files", paths=[str(tmp_path / "*.txt")], data_dir=str(tmp_path / "dd"))
    with pytest.raises(ValueError, match="empty corpus"):
        data.prepare(cfg)
    with pytest.raises(ValueError, match="empty corpus"):
        toklib.train_tokenizer(["", "   "], "bpe", 300)


def test_tiny_corpus_leaves_out_a_short_validation_split_and_rejects_a_too_short_train(tmp_path):
    text = "\n\n".join(f"Paragraph {i} tells a short story about the number {i}." for i in range(80))
    (tmp_path / "small.txt").write_text(text, encoding="utf-8")
    cfg = DataConfig(source="files", paths=[str(tmp_path / "small.txt")], data_dir=str(tmp_path / "dd"),
                     tokenizer="bpe", vocab_size=300, seq_len=256, batch_size=2, val_fraction=0.02)
    sources = data.prepare(cfg)
    assert list(sources) == ["train"]
    with pytest.raises(ValueError, match=r"split='validation'.*\['train'\]"):
        data.make_iterator(cfg, "validation")
    with pytest.raises(ValueError, match="corpus too small"):
        data.prepare(cfg.replace(seq_len=100_000))


def test_vocabulary_too_small_for_the_special_tokens():
    with pytest.raises(ValueError, match="vocab_size=3"):
        DataConfig(tokenizer="wordpiece", vocab_size=3)
    with pytest.raises(ValueError, match="vocab_size=100 is too small"):
        toklib.train_tokenizer(["some text"], "bpe", 100)
    with pytest.raises(ValueError, match=r"\[MASK\]"):
        toklib.train_tokenizer(["some text"], "wordpiece", 5)


def test_short_sequence_and_other_bad_settings():
    with pytest.raises(ValueError, match="seq_len=7"):
        DataConfig(seq_len=7)
    with pytest.raises(ValueError, match="objective"):
        DataConfig(objective="seq2seq")
    with pytest.raises(ValueError, match="source"):
        DataConfig(source="s3://bucket")
    with pytest.raises(ValueError, match="paths"):
        DataConfig(source="files")


def test_mlm_with_a_bpe_tokenizer_is_a_clear_error(causal_setup, causal_cfg):
    tok, _ = causal_setup
    with pytest.raises(ValueError, match="mask"):
        data.prepare(causal_cfg.replace(objective="mlm"), tok)


def test_bad_jsonl_lines_are_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n{"body": "no text field"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: no 'text' field"):
        data.read_text_files([str(path)])
    path.write_text('{"text": "fine"}\n{not json\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        data.read_text_files([str(path)])
    path.write_text('{"text": "fine"}\n["a list"]\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a JSON object per line, got list"):
        data.read_text_files([str(path)])


def test_undecodable_bytes_are_replaced_and_counted(tmp_path, caplog):
    good = "The quick brown fox jumps over the lazy dog. " * 40
    path = tmp_path / "latin1.txt"
    path.write_bytes(good.encode() + b"caf\xe9 \xff\xfe end\n\n" + good.encode() + b"\xc3( tail\n")
    with caplog.at_level(logging.WARNING, logger="flaxzoo.train.data"):
        found = data.read_text_files([str(path)])
    assert found.replaced == 4  # \xe9, \xff, \xfe, \xc3
    text = "\n\n".join(found.train + found.validation)
    assert text.count("\ufffd") == 4 and "caf\ufffd \ufffd\ufffd end" in text
    assert any("latin1.txt" in r.getMessage() and "4 undecodable" in r.getMessage() for r in caplog.records)
    cfg = DataConfig(source="files", paths=[str(path)], data_dir=str(tmp_path / "dd"), tokenizer="bpe",
                     vocab_size=300, seq_len=8, batch_size=2)
    batch = next(data.make_iterator(cfg))  # the whole pipeline runs on the repaired text
    assert batch["input_ids"].shape == (2, 8)


def test_command_line_benchmark_runs(causal_setup, causal_cfg, capsys):
    args = ["--bench", "--batches", "5", "--data-dir", causal_cfg.data_dir, "--vocab-size", "1000",
            "--tokenizer-max-docs", "1500", "--seq-len", "64", "--batch-size", "8"]
    assert data.main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens_per_s"] > 0 and report["batch_shape"] == [8, 64]
