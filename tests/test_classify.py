"""Sequence classification end to end: label names through the Hugging Face boundary, ``models.classify`` against
transformers' ``BertForSequenceClassification`` (random tiny weights, the real MiniLM tokenizer), and the
truncation of long texts."""

import json
import pathlib
import warnings

import jax
import numpy as np
import pytest
import tokenizers
import torch
import transformers
from flax import nnx

from flaxzoo import models
from flaxzoo.models.inference.classifier import encode_for_classification
from flaxzoo.models.config import FieldError
from flaxzoo.models.families import get_preset
from flaxzoo.models.inference.text import truncate_ids

transformers.logging.set_verbosity_error()

LABELS = {0: "sport", 1: "tech", 2: "politics"}
TEXTS = ["The match ended in a draw.",
         "A new phone was released today with a faster chip and a larger battery than last year's model.",
         "Parliament votes.",
         "Shares of the chip maker rose after the election, " * 6]



@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return models.load_tokenizer(minilm_dir)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> pathlib.Path:
    """A random tiny Hugging Face BERT classifier with named labels (MiniLM's vocabulary size)."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64, id2label=LABELS)
    directory = tmp_path_factory.mktemp("hf_cls")
    transformers.BertForSequenceClassification(config).eval().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def model(hf_dir):
    return models.from_pretrained(hf_dir)


def hf_logits(directory: pathlib.Path, tokenizer, texts: list[str]) -> np.ndarray:
    """transformers' logits ``[n, num_labels]``, one text at a time (no padding at all)."""
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(directory).eval()
    rows = [tokenizer.encode(t).ids for t in texts]  # the tokenizer's own [CLS] ... [SEP]
    assert max(map(len, rows)) <= hf.config.max_position_embeddings  # no truncation on either side
    with torch.no_grad():
        return np.concatenate([hf(input_ids=torch.tensor([r])).logits.numpy() for r in rows])


def padded(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` padded on the right with 0 to the longest: ``(ids, mask)`` ``[n, longest]`` int32."""
    longest = max(map(len, rows))
    ids = np.array([r + [0] * (longest - len(r)) for r in rows], np.int32)
    return ids, (np.arange(longest)[None] < np.array([len(r) for r in rows])[:, None]).astype(np.int32)


def test_label_names_load_from_id2label(model):
    assert model.config.label_names == ("sport", "tech", "politics")
    assert model.config.num_labels == 3


def test_classify_matches_transformers(model, hf_dir, tokenizer):
    labels, probs = models.classify(model, tokenizer, TEXTS, batch_size=3)
    want = torch.softmax(torch.from_numpy(hf_logits(hf_dir, tokenizer, TEXTS)), dim=-1).numpy()
    assert probs.shape == (len(TEXTS), 3) and probs.dtype == np.float32
    np.testing.assert_allclose(probs, want, atol=1e-5)
    assert labels == [LABELS[i] for i in want.argmax(axis=-1)]


def test_classify_single_string(model, tokenizer):
    labels, probs = models.classify(model, tokenizer, TEXTS[0])
    want_labels, want = models.classify(model, tokenizer, TEXTS)
    assert labels == want_labels[:1] and probs.shape == (1, 3)
    np.testing.assert_allclose(probs, want[:1], atol=1e-6)


def test_classify_without_names_gives_ids_and_runs_in_eval_mode(tokenizer):
    config = get_preset("bert-tiny", vocab_size=30522, num_labels=3, dropout=0.3, attention_dropout=0.3)
    fresh = models.create_model(config, models.BertForSequenceClassification)  # train mode: dropout on
    ids, probs = models.classify(fresh, tokenizer, TEXTS[:2])
    assert all(isinstance(i, int) and 0 <= i < 3 for i in ids)
    reference = nnx.merge(*nnx.split(fresh))
    reference.eval()
    tokens, mask = padded([tokenizer.encode(t).ids for t in TEXTS[:2]])
    logits = nnx.jit(lambda m, i, k: m(i, k))(reference, tokens, mask)
    np.testing.assert_allclose(probs, np.asarray(jax.nn.softmax(logits, axis=-1)), atol=1e-6)
    assert ids == np.asarray(logits).argmax(axis=-1).tolist()
    assert not fresh.dropout.deterministic  # the caller's model keeps its mode


def test_embed_runs_in_eval_mode_whatever_mode_the_model_is_in(tokenizer):
    """A BertModel as ``create_model`` leaves it (training mode, dropout 0.3) embeds as its eval-mode copy does,
    against numpy's mean over the real tokens of the eval model's hidden states; the caller's model stays in
    training mode."""
    config = get_preset("bert-tiny", vocab_size=30522, dropout=0.3, attention_dropout=0.3)
    fresh = models.create_model(config, models.BertModel)
    reference = nnx.merge(*nnx.split(fresh))
    reference.eval()
    texts = TEXTS[:3]
    got = models.embed(fresh, tokenizer, texts, normalize=False)
    tokens, mask = padded([tokenizer.encode(t).ids for t in texts])
    hidden = np.asarray(nnx.jit(lambda m, i, k: m(i, k))(reference, tokens, mask).last_hidden_state, np.float64)
    want = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(models.embed(reference, tokenizer, texts, normalize=False), got, atol=1e-6)
    assert any(getattr(m, "deterministic", True) is False for _, m in nnx.iter_modules(fresh))


def test_embed_and_classify_truncate_alike(model, hf_dir, tokenizer):
    """One rule for both: ``max_length=None`` is the tokenizer's truncation length (here 20, at most the model's 64
    positions), an explicit ``max_length`` replaces it; a text keeps its first tokens and ``[CLS] … [SEP]``."""
    long_text = " ".join(["word"] * 200) + " finale"
    plain = tokenizers.Tokenizer.from_str(tokenizer.to_str())
    plain.no_truncation()
    at_20 = tokenizers.Tokenizer.from_str(plain.to_str())
    at_20.enable_truncation(max_length=20)
    full = plain.encode(long_text).ids
    first_20 = full[:19] + full[-1:]  # the first 18 body tokens between [CLS] and [SEP]
    assert encode_for_classification(at_20, [long_text], max_length=20) == [first_20]

    _, by_tokenizer = models.classify(model, at_20, [long_text])
    _, by_argument = models.classify(model, plain, [long_text], max_length=20)
    np.testing.assert_allclose(by_tokenizer, by_argument, atol=1e-6)
    with torch.no_grad():
        hf = transformers.AutoModelForSequenceClassification.from_pretrained(hf_dir).eval()
        want = torch.softmax(hf(input_ids=torch.tensor([first_20])).logits, -1).numpy()
    np.testing.assert_allclose(by_tokenizer, want, atol=1e-5)

    encoder = model  # embed reads any model's backbone
    vectors = [models.embed(encoder, at_20, [long_text]), models.embed(encoder, plain, [long_text], max_length=20),
               models.embed(encoder, at_20, [long_text], max_length=20)]
    hidden = np.asarray(encoder.backbone(np.array([first_20], np.int32)).hidden, np.float64).mean(1)
    for got in vectors:
        np.testing.assert_allclose(got, hidden / np.linalg.norm(hidden), atol=1e-5)
    # The default for the MiniLM folder's tokenizer (256) is capped at the model's 64 positions; more is refused.
    from flaxzoo.models.inference.text import resolve_max_length

    assert resolve_max_length(model.config, tokenizer, None) == 64
    with pytest.raises(ValueError, match=r"max_length=65: expected at most the model's 64 positions"):
        models.embed(encoder, plain, [long_text], max_length=65)
    with pytest.raises(ValueError, match=r"max_length=0: expected an integer >= 1"):
        models.embed(encoder, plain, [long_text], max_length=0)


def test_classify_truncates_long_texts(model, tokenizer):
    long_text = " ".join(["word"] * 200)  # 200 body tokens, more than the 64 positions
    _, probs = models.classify(model, tokenizer, [long_text], truncation="head_tail")
    assert np.isfinite(probs).all()
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-6)


def test_classify_rejects_other_models_and_blank_texts(model, tokenizer):
    with pytest.raises(ValueError, match="BertModel"):
        models.classify(models.abstract_model(model.config, models.BertModel), tokenizer, TEXTS)
    with pytest.raises(ValueError, match=r"\[1\]"):
        models.classify(model, tokenizer, ["fine", "   "])
    with pytest.raises(ValueError, match="max_length=100"):
        models.classify(model, tokenizer, TEXTS, max_length=100)


def test_save_pretrained_writes_names_for_transformers(model, tokenizer, tmp_path):
    models.save_pretrained(model, tmp_path)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path)
    assert hf.config.id2label == LABELS
    assert hf.config.label2id == {name: i for i, name in LABELS.items()}
    ids, mask = padded(encode_for_classification(tokenizer, TEXTS, max_length=64))
    ours = np.asarray(nnx.jit(lambda m, i, k: m(i, k))(model, ids, mask))
    np.testing.assert_allclose(ours, hf_logits(tmp_path, tokenizer, TEXTS), atol=1e-4)


def test_num_labels_override_drops_names_that_no_longer_fit(tmp_path):
    config = transformers.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32, id2label=LABELS)
    transformers.BertModel(config).save_pretrained(tmp_path)  # an encoder: the classifier is initialised
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the initialised head's warning
        same = models.from_pretrained(tmp_path, cls="BertForSequenceClassification", num_labels=3)
        other = models.from_pretrained(tmp_path, cls="BertForSequenceClassification", num_labels=5)
    assert same.config.label_names == ("sport", "tech", "politics")
    assert other.config.label_names is None and other.config.num_labels == 5


def test_default_or_unusable_label_names_stay_none(tmp_path):
    config = transformers.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32, num_labels=3)
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path)
    assert models.from_pretrained(tmp_path).config.label_names is None
    hf = json.loads((tmp_path / "config.json").read_text())
    hf["id2label"] = {"0": "spam", "1": "spam", "2": "ham"}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.warns(UserWarning, match="id2label=.*dropped"):
        assert models.from_pretrained(tmp_path).config.label_names is None


# ------------------------------------------------------------------------------------------------- truncate_ids
CLS, SEP = 101, 102
BODY = list(range(1000, 1020))  # 20 body tokens
IDS = [CLS, *BODY, SEP]


def test_truncate_head_keeps_the_first_body_tokens():
    assert truncate_ids(IDS, 10) == [CLS] + BODY[:8] + [SEP]
    assert truncate_ids(IDS, 22) == IDS and truncate_ids(IDS, 100) == IDS


def test_truncate_head_tail_keeps_the_tail_and_the_specials():
    # max_length 10: 8 body tokens; default head = 8 // 4 = 2, tail = 6
    assert truncate_ids(IDS, 10, strategy="head_tail") == [CLS] + BODY[:2] + BODY[-6:] + [SEP]
    assert truncate_ids(IDS, 10, strategy="head_tail", head_tokens=5) == [CLS] + BODY[:5] + BODY[-3:] + [SEP]
    assert truncate_ids(IDS, 10, strategy="head_tail", head_tokens=8) == [CLS] + BODY[:8] + [SEP]
    assert truncate_ids(IDS, 3, strategy="head_tail") == [CLS, BODY[-1], SEP]


@pytest.mark.parametrize("kwargs, named", [
    (dict(max_length=10, strategy="tail"), "strategy='tail'"),
    (dict(max_length=2), "max_length=2"),
    (dict(max_length=10, strategy="head_tail", head_tokens=9), "head_tokens=9"),
    (dict(max_length=10, head_tokens=-1), "head_tokens=-1"),
])
def test_truncate_rejects_bad_arguments(kwargs, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")) as info:
        truncate_ids(IDS, **kwargs)
    assert "expected" in str(info.value)


def test_encode_for_classification_ignores_the_tokenizers_truncation(tokenizer):
    long_text = " ".join(["word"] * 200) + " finale"
    (row,) = encode_for_classification(tokenizer, [long_text], max_length=300)
    assert len(row) == 203 and row[0] == tokenizer.token_to_id("[CLS]") and row[-1] == tokenizer.token_to_id("[SEP]")
    (cut,) = encode_for_classification(tokenizer, [long_text], max_length=20, truncation="head_tail")
    assert cut == truncate_ids(row, 20, strategy="head_tail") and cut[-2] == tokenizer.token_to_id("finale")
    # the caller's tokenizer is unchanged (256: sentence_bert_config.json's max_seq_length, set by load_tokenizer)
    assert tokenizer.truncation == {"max_length": 256, "stride": 0, "strategy": "longest_first", "direction": "right"}
    with pytest.raises(ValueError, match=r"index \[0, 2\]"):
        encode_for_classification(tokenizer, ["", "ok", " \n"], max_length=20)


# ------------------------------------------------------------------------------------------------ label_names
@pytest.mark.parametrize("names", [("a", "b"), ("a", "a", "b"), ("a", "", "b"), "abc"])
def test_bad_label_names_name_the_field(names):
    with pytest.raises(FieldError, match="label_names") as info:
        get_preset("bert-tiny", num_labels=3, label_names=names)
    assert info.value.field == "label_names"


def test_label_names_round_trip_through_json():
    config = get_preset("bert-tiny", num_labels=3, label_names=["x", "y", "z"])
    assert config.label_names == ("x", "y", "z")
    assert models.TransformerConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert config.replace(num_labels=4).label_names is None


def test_classify_roberta_default_length_leaves_room_for_the_position_offset(tokenizer, tmp_path):
    torch.manual_seed(0)
    config = transformers.RobertaConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=66, pad_token_id=1,
                                        id2label=LABELS)  # 66 - (pad + 1) = 64 positions for tokens
    hf = transformers.RobertaForSequenceClassification(config).eval()
    hf.save_pretrained(tmp_path)
    model = models.from_pretrained(tmp_path)
    full = tokenizer.encode(" ".join(["word"] * 100)).ids  # 102 ids, under the tokenizer's own 128
    labels, probs = models.classify(model, tokenizer, [" ".join(["word"] * 100)])
    head = full[:63] + full[-1:]  # 64: [CLS], the first 62 body tokens, [SEP]
    with torch.no_grad():
        want = torch.softmax(hf(input_ids=torch.tensor([head])).logits, dim=-1).numpy()
    np.testing.assert_allclose(probs, want, atol=1e-5)
    assert labels == [LABELS[int(want.argmax())]]
