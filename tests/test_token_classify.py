"""Token classification building blocks (flaxzoo.train.finetune.tokens, losses.token_classification_loss): CoNLL
reading, word-piece label alignment against transformers' BertTokenizerFast, batches, entity scores against seqeval
and a hand computation, and the loss against numpy."""

from __future__ import annotations

import random
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tokenizers
from flax import nnx

from flaxzoo.models import BertForTokenClassification, get_preset
from flaxzoo.models.io.packaged import minilm_dir
from flaxzoo.train import losses
from flaxzoo.train import step as steplib
from flaxzoo.train.finetune import tokens
from flaxzoo.train.finetune.batching import epoch_batches

CONLL_2003 = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER


-DOCSTART- -X- -X- O

BRUSSELS NNP B-NP B-LOC
"""


# ========================================================================================================== reading
def test_read_conll_takes_the_first_and_last_columns_and_skips_docstart(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(CONLL_2003)
    read = tokens.read_conll(path)
    assert read.words == [["EU", "rejects", "German", "call", "."], ["Peter", "Blackburn"], ["BRUSSELS"]]
    assert read.tags == [["B-ORG", "O", "B-MISC", "O", "O"], ["B-PER", "I-PER"], ["B-LOC"]]


def test_load_tagged_numbers_tags_o_first_then_sorted(tmp_path):
    (tmp_path / "train.txt").write_text(CONLL_2003)
    (tmp_path / "test.txt").write_text("Paris\tB-LOC\nis\tO\n\nBlackburn\tB-PER\n")  # 2 columns, tabs
    split = tokens.load_tagged(tmp_path / "train.txt", tmp_path / "test.txt")
    assert split.label_names == ("O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-PER")
    assert [s.tolist() for s in split.labels["train"]] == [[3, 0, 2, 0, 0], [4, 5], [1]]
    assert [s.tolist() for s in split.labels["test"]] == [[1, 0], [4]]
    assert split.words["test"] == [["Paris", "is"], ["Blackburn"]]
    assert "validation" not in split.words
    assert tokens.tag_order([["I-X", "B-X"]]) == ("B-X", "I-X")  # no "O": just sorted


@pytest.mark.parametrize("text, message", [
    ("EU B-ORG\nrejects\n", r"bad\.txt:2: one column 'rejects'; expected a token and its tag"),
    ("", r"bad\.txt: no tokens; expected lines of a token and its tag"),
    ("-DOCSTART- -X- O\n\n\n", r"bad\.txt: no tokens"),
])
def test_read_conll_refuses_bad_files_naming_file_and_line(tmp_path, text, message):
    (tmp_path / "bad.txt").write_text(text)
    with pytest.raises(ValueError, match=message):
        tokens.read_conll(tmp_path / "bad.txt")


def test_a_test_tag_the_training_file_lacks_is_refused_with_its_line(tmp_path):
    (tmp_path / "train.txt").write_text(CONLL_2003)
    (tmp_path / "test.txt").write_text("Paris B-LOC\n\nACME B-COMPANY\n")
    with pytest.raises(ValueError, match=r"test\.txt:3: tag 'B-COMPANY' is not one of the training file's tags"):
        tokens.load_tagged(tmp_path / "train.txt", tmp_path / "test.txt")


# ========================================================================================================= encoding
NAMES = ("O", "B-LOC", "B-PER", "I-LOC", "I-PER")


def test_align_labels_by_hand():
    word_ids = [None, 0, 1, 1, 1, 2, None]  # [CLS] w0 w1 w1 w1 w2 [SEP]
    word_labels = [2, 1, 0]  # B-PER B-LOC O
    b_to_i = tokens.b_to_i_labels(NAMES)
    assert b_to_i.tolist() == [0, 3, 4, 3, 4]
    assert tokens.b_to_i_labels(("O", "B-X")).tolist() == [0, 1]  # no I-X: B-X stays
    assert tokens.align_labels(word_ids, word_labels).tolist() == [-100, 2, 1, -100, -100, 0, -100]
    assert tokens.align_labels(word_ids, word_labels, True, b_to_i).tolist() == [-100, 2, 1, 3, 3, 0, -100]
    assert tokens.align_labels(word_ids, word_labels, True).tolist() == [-100, 2, 1, 1, 1, 0, -100]
    with pytest.raises(ValueError, match=r"word_ids\[2\] = 3: expected a word index below 3"):
        tokens.align_labels([None, 0, 3], word_labels)


def hf_recipe_labels(word_ids, word_labels, label_all_tokens, b_to_i):
    """run_ner.py's tokenize_and_align_labels loop, on transformers' word_ids."""
    out, previous = [], None
    for word in word_ids:
        if word is None:
            out.append(-100)
        elif word != previous:
            out.append(word_labels[word])
        else:
            out.append(b_to_i[word_labels[word]] if label_all_tokens else -100)
        previous = word
    return out


SENTENCES = [["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
             ["Müller", "Johanson", "unbelievably", "straightforward", "naïve", "café", "2024-05-01", "U.S.",
              "xyzzyplugh", "São", "Paulo"],
             ["Peter"],
             ["The", "Commission", "said", "on", "Thursday", "it", "disagreed", "with", "German", "advice", "to",
              "consumers", "to", "shun", "British", "lamb", "until", "scientists", "determine", "whether", "mad",
              "cow", "disease", "can", "be", "transmitted", "to", "sheep", "."]]


@pytest.mark.parametrize("max_len", [12, 128])
@pytest.mark.parametrize("label_all_tokens", [False, True])
def test_encoding_matches_bert_tokenizer_fast_and_run_ner(max_len, label_all_tokens):
    from transformers import BertTokenizerFast
    folder = minilm_dir()
    reference = BertTokenizerFast.from_pretrained(folder)
    tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))  # pads to 128 and truncates itself
    rng = np.random.default_rng(0)
    labels = [rng.integers(0, len(NAMES), len(s)) for s in SENTENCES]
    b_to_i = tokens.b_to_i_labels(NAMES)
    ours = tokens.encode_tagged(tokenizer, SENTENCES, labels, max_len=max_len, label_all_tokens=label_all_tokens,
                                b_to_i=b_to_i)
    theirs = reference(SENTENCES, is_split_into_words=True, truncation=True, max_length=max_len)
    dropped = 0
    for i, sentence in enumerate(SENTENCES):
        word_ids = theirs.word_ids(i)
        assert ours.ids[i].tolist() == theirs["input_ids"][i]
        assert ours.labels[i].tolist() == hf_recipe_labels(word_ids, labels[i], label_all_tokens, b_to_i)
        assert ours.ids[i].dtype == ours.labels[i].dtype == np.int32
        dropped += len(sentence) - len({w for w in word_ids if w is not None})
    assert ours.dropped_words == dropped
    assert (dropped > 0) == (max_len == 12)
    assert tokenizer.padding is not None  # the caller's tokenizer is unchanged


def test_encoding_refuses_mismatched_labels_and_a_max_len_without_room():
    tokenizer = tokenizers.Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    with pytest.raises(ValueError, match=r"sentence 1: 1 words but 2 labels; expected one per word"):
        tokens.encode_tagged(tokenizer, [["a"], ["b"]], [[0], [0, 0]], max_len=8)
    with pytest.raises(ValueError, match=r"max_len=2: expected an integer above the tokenizer's 2 special tokens"):
        tokens.encode_tagged(tokenizer, [["a"]], [[0]], max_len=2)


# ========================================================================================================= batching
def test_tagged_batch_pads_to_a_multiple_of_8_and_completes_rows_with_ignored_labels():
    rows = [[101, 5, 6, 102], [101] + list(range(7, 16)) + [102]]
    labels = [[-100, 1, 0, -100], [-100] + [2] * 9 + [-100]]
    batch = tokens.tagged_batch(rows, labels, 4, max_len=128, pad_id=0)
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {k: ((4, 16), np.int32)
                                                              for k in ("input_ids", "attention_mask", "labels")}
    assert batch["labels"][0].tolist() == [-100, 1, 0, -100] + [-100] * 12
    assert batch["input_ids"][1, :11].tolist() == rows[1] and (batch["input_ids"][1, 11:] == 0).all()
    assert batch["attention_mask"].sum(axis=1).tolist() == [4, 11, 0, 0]
    assert (batch["labels"][2:] == -100).all() and (batch["input_ids"][2:] == 0).all()
    with pytest.raises(ValueError, match=r"row 1: 11 token ids but 3 labels"):
        tokens.tagged_batch(rows, [labels[0], [1, 2, 3]], 2, max_len=128, pad_id=0)


@pytest.mark.parametrize("group_by_length", [False, True])
def test_epochs_are_shuffled_as_the_classifier_batches_are(group_by_length):
    rng = np.random.default_rng(1)
    n, batch_size = 70, 4
    rows = [[i + 1] * int(rng.integers(2, 30)) for i in range(n)]  # row i is told by its first id, i + 1
    labels = [[i % 5] * len(r) for i, r in enumerate(rows)]
    kwargs = {"seed": 3, "group_by_length": group_by_length, "max_len": 32, "pad_id": 0}
    for epoch in (0, 1):
        ours = list(tokens.tagged_epoch_batches(rows, labels, batch_size, epoch=epoch, **kwargs))
        classifier = list(epoch_batches(rows, np.arange(n), np.ones(n, np.float32), batch_size, epoch=epoch,
                                        **kwargs))
        assert len(ours) == len(classifier) == 18
        for mine, theirs in zip(ours, classifier):
            real = mine["attention_mask"][:, 0] == 1
            assert (mine["input_ids"][real, 0] - 1).tolist() == theirs["labels"][theirs["example_weights"] > 0].tolist()
            assert mine["input_ids"].shape[0] == batch_size and mine["input_ids"].shape[1] % 8 == 0
            assert (mine["labels"][~real] == -100).all()
            for r in np.flatnonzero(real):
                i = mine["input_ids"][r, 0] - 1
                assert mine["labels"][r, :len(rows[i])].tolist() == labels[i]
    first = [b["input_ids"][:, 0].tolist() for b in tokens.tagged_epoch_batches(rows, labels, 4, epoch=0, **kwargs)]
    second = [b["input_ids"][:, 0].tolist() for b in tokens.tagged_epoch_batches(rows, labels, 4, epoch=1, **kwargs)]
    again = [b["input_ids"][:, 0].tolist() for b in tokens.tagged_epoch_batches(rows, labels, 4, epoch=0, **kwargs)]
    assert first == again and first != second


def test_batches_in_order_keep_the_order():
    rows = [[i + 1, i + 1] for i in range(5)]
    batches = list(tokens.tagged_batches_in_order(rows, [[0, 1]] * 5, 2, max_len=16, pad_id=0))
    assert [b["input_ids"][:, 0].tolist() for b in batches] == [[1, 2], [3, 4], [5, 0]]
    assert (batches[-1]["labels"][1] == -100).all()


# ========================================================================================================== scoring
HAND_TRUE = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG", "O", "I-PER"], ["B-MISC", "I-LOC"]]
HAND_PRED = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "I-ORG", "O", "O", "B-PER"], ["B-MISC", "I-LOC"]]


def test_entity_scores_by_hand():
    true, pred = HAND_TRUE, HAND_PRED
    # True entities (sentence, first, last): PER(0,0,1) LOC(0,3,3) ORG(1,0,2) PER(1,4,4) [I-PER after O starts one]
    #   MISC(2,0,0) LOC(2,1,1) [I-LOC after MISC: the type changes, a new entity]                       -> 6
    # Predicted: PER(0,0,1) ORG(0,3,3) ORG(1,0,1) PER(1,4,4) MISC(2,0,0) LOC(2,1,1)                     -> 6
    # Right: PER(0,0,1) PER(1,4,4) MISC(2,0,0) LOC(2,1,1) -> 4: precision = recall = F1 = 4/6 = 2/3.
    # LOC: 2 true, 1 predicted, 1 right: P = 1, R = 1/2, F1 = 2 * 1/2 / (3/2) = 2/3.  MISC: 1, 1, 1: F1 = 1.
    # ORG: 1 true (1,0,2), 2 predicted, 0 right: F1 = 0.  PER: 2, 2, 2: F1 = 1.  Macro F1 = (2/3 + 1 + 0 + 1)/4 = 2/3.
    # Tokens: 3 of 4 + 3 of 5 + 2 of 2 agree: accuracy = 8/11.
    assert tokens.entity_chunks(true[2]) == [("MISC", 0, 0), ("LOC", 1, 1)]
    assert tokens.entity_chunks(true[1]) == [("ORG", 0, 2), ("PER", 4, 4)]
    scores = tokens.entity_scores(true, pred)
    assert (scores.true_entities, scores.predicted_entities, scores.correct_entities) == (6, 6, 4)
    assert scores.precision == pytest.approx(2 / 3) and scores.recall == pytest.approx(2 / 3)
    assert scores.f1 == pytest.approx(2 / 3) and scores.macro_f1 == pytest.approx(2 / 3)
    assert scores.accuracy == pytest.approx(8 / 11)
    assert scores.per_type["LOC"] == pytest.approx({"precision": 1.0, "recall": 0.5, "f1": 2 / 3, "support": 2})
    assert scores.per_type["ORG"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert sorted(scores.per_type) == ["LOC", "MISC", "ORG", "PER"]


def assert_like_seqeval(true, pred):
    seqeval_metrics = pytest.importorskip("seqeval.metrics")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval warns on 0/0 (and scores it 0, as we do)
        ours = tokens.entity_scores(true, pred)
        assert ours.f1 == pytest.approx(seqeval_metrics.f1_score(true, pred), abs=1e-12)
        assert ours.precision == pytest.approx(seqeval_metrics.precision_score(true, pred), abs=1e-12)
        assert ours.recall == pytest.approx(seqeval_metrics.recall_score(true, pred), abs=1e-12)
        assert ours.accuracy == pytest.approx(seqeval_metrics.accuracy_score(true, pred), abs=1e-12)
        if ours.true_entities + ours.predicted_entities == 0:
            return
        report = seqeval_metrics.classification_report(true, pred, output_dict=True)
    types = {k: v for k, v in report.items() if not k.endswith(" avg")}
    assert sorted(types) == sorted(ours.per_type)
    for kind, row in types.items():
        mine = ours.per_type[kind]
        assert (mine["precision"], mine["recall"], mine["f1"], mine["support"]) == pytest.approx(
            (row["precision"], row["recall"], row["f1-score"], row["support"]), abs=1e-12), kind
    assert ours.macro_f1 == pytest.approx(report["macro avg"]["f1-score"], abs=1e-12)


BIO = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
IOBES = ["O", "O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC", "B", "I", "E", "S"]


@pytest.mark.parametrize("alphabet", [BIO, IOBES], ids=["BIO", "IOBES"])
def test_entity_scores_equal_seqeval_on_random_ill_formed_tags(alphabet):
    assert_like_seqeval(HAND_TRUE, HAND_PRED)
    rng = random.Random(7)
    for _ in range(150):
        true = [[rng.choice(alphabet) for _ in range(rng.randint(0, 12))] for _ in range(rng.randint(1, 5))]
        if not any(true):
            true[0].append("O")
        pred = [[t if rng.random() < 0.7 else rng.choice(alphabet) for t in sentence] for sentence in true]
        assert_like_seqeval(true, pred)


def test_entity_scores_refuse_other_tags_and_length_mismatches():
    with pytest.raises(ValueError, match=r"tag 'NN': expected 'O' or one of B/I/E/S followed by '-'"):
        tokens.entity_scores([["NN"]], [["NN"]])
    with pytest.raises(ValueError, match=r"sentence 0: 2 true tags but 1 predicted"):
        tokens.entity_scores([["O", "O"]], [["O"]])


def test_tagging_scores_keep_the_first_piece_of_each_word_only():
    # [CLS] Peter Black ##burn lives in Paris [SEP] pad ; a padding row. Label ids name NAMES.
    labels = np.array([[-100, 2, 4, -100, 0, 0, 1, -100, -100], [-100] * 9])
    predictions = np.array([[3, 2, 4, 0, 0, 0, 3, 1, 1], [1] * 9])  # ##burn and specials are ignored
    true, predicted = tokens.word_sequences(predictions, labels)
    assert [t.tolist() for t in true] == [[2, 4, 0, 0, 1]] and [p.tolist() for p in predicted] == [[2, 4, 0, 0, 3]]
    scores = tokens.tagging_scores(predictions, labels, NAMES)
    # true: PER(0,1) LOC(4,4); predicted: PER(0,1) LOC(4,4) too (I-LOC after O starts one) -> all right
    assert (scores.precision, scores.recall, scores.f1, scores.accuracy) == (1.0, 1.0, 1.0, 0.8)
    with pytest.raises(ValueError, match=r"label id 7: expected ids in \[0, 5\)"):
        tokens.tagging_scores(np.where(labels == 1, 7, predictions), labels, NAMES)


# ============================================================================================================= loss
@pytest.fixture(scope="module")
def tagger():
    return BertForTokenClassification(get_preset("bert-tiny", num_labels=5), rngs=nnx.Rngs(0))


def toy_batch() -> dict[str, jnp.ndarray]:
    rng = np.random.default_rng(0)
    lengths = [16, 9, 5, 0]  # the last row pads the batch: no tokens, no labels
    mask = (np.arange(16)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
    ids = np.where(mask == 1, rng.integers(5, 1000, (4, 16)), 0)
    labels = np.where((mask == 1) & (rng.random((4, 16)) < 0.7), rng.integers(0, 5, (4, 16)), -100)
    return {"input_ids": jnp.asarray(ids, jnp.int32), "attention_mask": jnp.asarray(mask, jnp.int32),
            "labels": jnp.asarray(labels, jnp.int32)}


def test_token_classification_loss_equals_numpy(tagger):
    batch = toy_batch()
    loss_sum, count, correct = losses.token_classification_loss(tagger, batch, loss_chunk=64)
    logits = np.asarray(tagger(batch["input_ids"], batch["attention_mask"]), np.float64)
    labels = np.asarray(batch["labels"])
    scored = labels != -100
    shifted = logits - logits.max(-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    expected = -np.take_along_axis(log_p, np.where(scored, labels, 0)[..., None], -1)[..., 0][scored].sum()
    assert loss_sum.dtype == count.dtype == correct.dtype == jnp.float32
    np.testing.assert_allclose(float(loss_sum), expected, rtol=1e-5)
    assert float(count) == scored.sum() > 0
    assert float(correct) == (logits.argmax(-1) == labels)[scored].sum()
    assert float(losses.token_classification_loss(tagger, batch, with_accuracy=False)[2]) == 0.0


def test_one_sgd_step_through_make_train_step_lowers_the_loss(tagger):
    graphdef, params, rest = nnx.split(tagger, nnx.Param, ...)
    params = nnx.to_pure_dict(params)
    tx = optax.sgd(0.5)
    state = steplib.new_train_state(params, tx, seed=0)
    train_step = jax.jit(steplib.make_train_step(graphdef, tx, optax.constant_schedule(0.5),
                                                 objective="token_classify"))
    batch = toy_batch()
    state, first = train_step(state, rest, batch)
    _, second = train_step(state, rest, batch)
    assert np.isfinite(float(first["loss"])) and float(first["tokens"]) == float((batch["labels"] != -100).sum())
    assert float(second["loss"]) < float(first["loss"])
