"""Sentence embeddings as sentence-transformers computes them: flaxzoo's vectors against
``SentenceTransformer(path).encode`` on the packaged all-MiniLM-L6-v2 and on a tiny random BERT saved by
sentence-transformers with other poolings (CLS, max, the rest, several at once), normalisation off, a shorter
``max_seq_length`` and ``do_lower_case``; ``similarity`` / ``search`` against ``sentence_transformers.util``."""

import json
import pathlib
import shutil

import numpy as np
import pytest
import torch
import transformers
from sentence_transformers import SentenceTransformer, util
from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

from flax import nnx

from flaxzoo import models
from flaxzoo.models.inference.sentence import SentenceConfig, read_sentence_config

transformers.logging.set_verbosity_error()

TOL = 1e-5
LONG = " ".join(f"token{i} and more words" for i in range(120))  # ~700 MiniLM tokens: past 256
MINILM_TEXTS = ["Hi", "A man is playing a guitar.", "Someone is strumming a guitar on a small stage, rather loudly.",
                "The quick brown fox jumps over the lazy dog " * 5, LONG]

WORDS = ["the", "cat", "dog", "sat", "on", "mat", "a", "big", "red", "ran", "far", "and", "then", "slept", "home"]
TINY_TEXTS = ["The cat sat", "a big red dog ran far and then slept on the mat at home",
              "Dog", " ".join(WORDS * 3), "THE CAT and the Dog"]  # the 4th: 45 words, past max_seq_length 16


# ------------------------------------------------------------------------------------------------- MiniLM
@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return models.SentenceEncoder.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def minilm_st(minilm_dir):
    return SentenceTransformer(str(minilm_dir), device="cpu")


def test_minilm_settings_are_read(minilm, minilm_dir):
    assert minilm.config.pooling == ("mean",) and minilm.config.normalize and minilm.max_length == 256
    assert read_sentence_config(minilm_dir) == minilm.config


def test_minilm_matches_sentence_transformers(minilm, minilm_st, minilm_dir):
    assert len(minilm.tokenizer.encode(LONG, add_special_tokens=True).ids) == 256  # truncated
    assert len(models.load_tokenizer(minilm_dir).encode(LONG).ids) == 256
    expected = minilm_st.encode(MINILM_TEXTS, convert_to_numpy=True)
    got = minilm(MINILM_TEXTS, batch_size=2)
    delta = np.abs(got - expected).max()
    print(f"MiniLM max |delta| vs sentence-transformers: {delta:.2e}")
    assert delta < TOL
    # the same through embed: the plain call (no sentence-transformers settings: its defaults fit MiniLM), the
    # encoder itself
    plain = models.embed(nnx.merge(minilm.graphdef, minilm.state), models.load_tokenizer(minilm_dir), MINILM_TEXTS)
    np.testing.assert_allclose(plain, got, atol=TOL)
    np.testing.assert_allclose(models.embed(minilm, None, MINILM_TEXTS), got, atol=TOL)


def test_similarity_and_search_match_sentence_transformers_util(minilm):
    queries = minilm(["A man plays the guitar.", "A cat sleeps."])
    corpus = minilm(MINILM_TEXTS + ["A kitten is asleep on the sofa.", "Music on a stage."])
    sims = models.similarity(queries, corpus)
    assert sims.shape == (2, 7)
    np.testing.assert_allclose(sims, util.cos_sim(torch.tensor(queries), torch.tensor(corpus)).numpy(), atol=1e-6)
    raw = np.random.default_rng(0).normal(size=(3, 5))  # not unit vectors: similarity normalises
    np.testing.assert_allclose(models.similarity(raw, raw[:2] * 3.0),
                               (raw / np.linalg.norm(raw, axis=1, keepdims=True)) @
                               (raw[:2] / np.linalg.norm(raw[:2], axis=1, keepdims=True)).T, atol=1e-6)
    indices, scores = models.search(queries, corpus, top_k=3)
    hits = util.semantic_search(torch.tensor(queries), torch.tensor(corpus), top_k=3)
    assert indices.shape == scores.shape == (2, 3)
    for row, expected in enumerate(hits):
        assert indices[row].tolist() == [h["corpus_id"] for h in expected]
        np.testing.assert_allclose(scores[row], [h["score"] for h in expected], atol=1e-6)
    assert (np.diff(scores, axis=1) <= 0).all()
    assert indices[1, 0] == 5  # the kitten answers the cat
    assert models.search(queries, corpus, top_k=50)[0].shape == (2, 7)
    with pytest.raises(ValueError, match="top_k=0"):
        models.search(queries, corpus, top_k=0)
    with pytest.raises(ValueError, match="384-dimensional"):
        models.similarity(queries, corpus[:, :10])


# --------------------------------------------------------------------------------------------- tiny BERT
@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> pathlib.Path:
    """A random tiny BERT (perturbed: biases and norms away from their init) with a case-sensitive WordPiece
    vocabulary of lower- and capitalised words."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64)
    model = transformers.BertModel(config, add_pooling_layer=False).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    directory = tmp_path_factory.mktemp("tiny_bert")
    model.save_pretrained(directory)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + [w.capitalize() for w in WORDS] + [
        w.upper() for w in WORDS]
    (directory / "vocab.txt").write_text("\n".join(vocab + [f"w{i}" for i in range(64 - len(vocab))]) + "\n")
    transformers.BertTokenizerFast(str(directory / "vocab.txt"), do_lower_case=False).save_pretrained(directory)
    return directory


def save_st(hf_dir: pathlib.Path, out: pathlib.Path, pooling, normalize: bool, dense=()) -> pathlib.Path:
    """sentence-transformers' own save of Transformer (max_seq_length 16) + Pooling + ``dense`` [+ Normalize]."""
    modules = [Transformer(str(hf_dir), max_seq_length=16), Pooling(32, pooling_mode=pooling), *dense]
    modules += [Normalize()] if normalize else []
    SentenceTransformer(modules=modules, device="cpu").save(str(out))
    return out


def compare(directory: pathlib.Path, texts=TINY_TEXTS) -> tuple[float, np.ndarray]:
    """max |flaxzoo - sentence-transformers| over ``texts``, and flaxzoo's vectors."""
    expected = SentenceTransformer(str(directory), device="cpu").encode(texts, convert_to_numpy=True)
    got = models.SentenceEncoder.from_pretrained(directory)(texts, batch_size=3)
    assert got.shape == expected.shape
    return float(np.abs(got - expected).max()), got


CASES = {"cls+normalize": ("cls", True), "max": ("max", False), "mean": ("mean", False),
         "mean_sqrt_len+weightedmean+lasttoken": (("mean_sqrt_len_tokens", "weightedmean", "lasttoken"), False),
         "cls+max+normalize": (("cls", "max"), True)}


@pytest.mark.slow_variants
@pytest.mark.parametrize("case", list(CASES))
def test_tiny_poolings_match_sentence_transformers(case, tiny_hf, tmp_path):
    pooling, normalize = CASES[case]
    directory = save_st(tiny_hf, tmp_path / "st", pooling, normalize)
    config = read_sentence_config(directory)
    assert config.pooling == ((pooling,) if isinstance(pooling, str) else pooling)
    assert config.normalize == normalize and config.max_seq_length == 16
    delta, got = compare(directory)
    print(f"tiny BERT {case}: max |delta| vs sentence-transformers {delta:.2e}")
    assert delta < TOL
    norms = np.linalg.norm(got, axis=1)
    assert np.allclose(norms, 1, atol=1e-5) == normalize


def test_dense_layers_match_sentence_transformers(tiny_hf, tmp_path):
    torch.manual_seed(1)
    dense = [Dense(64, 24), Dense(24, 16, bias=False, activation_function=torch.nn.GELU()),
             Dense(16, 16, activation_function=torch.nn.Identity(), use_residual=True)]
    directory = save_st(tiny_hf, tmp_path / "st", ("mean", "max"), True, dense)
    config = read_sentence_config(directory, hidden_size=32)
    assert [layer.weight.shape for layer in config.dense] == [(24, 64), (16, 24), (16, 16)]
    assert config.dense[1].bias is None and config.dense[2].residual == "identity"
    delta, got = compare(directory)
    print(f"tiny BERT mean+max, 3 Dense layers, Normalize: max |delta| vs sentence-transformers {delta:.2e}")
    assert delta < TOL and got.shape == (len(TINY_TEXTS), 16)
    (directory / "2_Dense" / "config.json").write_text(json.dumps({"in_features": 64, "out_features": 24,
                                                                   "activation_function": "torch.nn.Softsign"}))
    with pytest.raises(ValueError, match="Softsign"):
        read_sentence_config(directory)


def test_legacy_files_and_do_lower_case(tiny_hf, tmp_path):
    """Files as sentence-transformers < 5 wrote them: pooling_mode_* flags, max_seq_length and do_lower_case in
    sentence_bert_config.json (the tokenizer itself is case-sensitive)."""
    directory = save_st(tiny_hf, tmp_path / "st", "mean", True)
    shutil.copy(tiny_hf / "tokenizer.json", directory / "tokenizer.json")  # without the saved Lowercase
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 12, "do_lower_case": True}))
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": True, "pooling_mode_mean_sqrt_len_tokens": False}))
    config = read_sentence_config(directory)
    assert config.pooling == ("cls", "max") and config.max_seq_length == 12 and config.do_lower_case
    delta, got = compare(directory)
    print(f"tiny BERT legacy cls+max, do_lower_case, 12 tokens: max |delta| {delta:.2e}")
    assert delta < TOL
    cased = models.SentenceEncoder.from_pretrained(directory)
    assert cased.tokenizer.encode("THE CAT").ids == cased.tokenizer.encode("the cat").ids
    assert models.load_tokenizer(directory).encode("THE CAT").ids != models.load_tokenizer(directory).encode(
        "the cat").ids


def test_max_pooling_formula_in_numpy(tiny_hf, tmp_path):
    """An independent check of one pooling: transformers' hidden states, numpy's max over the real tokens."""
    directory = save_st(tiny_hf, tmp_path / "st", "max", False)
    encoder = models.SentenceEncoder.from_pretrained(directory)
    texts = TINY_TEXTS[:3]
    hf = transformers.BertModel.from_pretrained(tiny_hf).eval()
    expected = []
    for text in texts:
        ids = encoder.tokenizer.encode(text).ids
        with torch.no_grad():
            hidden = hf(input_ids=torch.tensor([ids])).last_hidden_state[0].numpy()
        expected.append(hidden.max(axis=0))
    np.testing.assert_allclose(encoder(texts), np.stack(expected), atol=TOL)
    # and through embed with a model object and an explicit pooling
    model, tok = models.from_pretrained(tiny_hf), models.load_tokenizer(tiny_hf)
    np.testing.assert_allclose(models.embed(model, tok, texts, pooling="max", normalize=False), np.stack(expected),
                               atol=TOL)
    np.testing.assert_allclose(models.embed(model, tok, texts, sentence_config=directory), np.stack(expected),
                               atol=TOL)
    np.testing.assert_allclose(models.embed(directory, None, texts), np.stack(expected), atol=TOL)  # a path


def test_a_folder_without_sentence_transformers_files_keeps_mean_and_normalize(tiny_hf):
    assert read_sentence_config(tiny_hf) is None
    model, tok = models.from_pretrained(tiny_hf), models.load_tokenizer(tiny_hf)
    got = models.SentenceEncoder.from_pretrained(tiny_hf)(TINY_TEXTS[:3])
    np.testing.assert_allclose(got, models.embed(model, tok, TINY_TEXTS[:3]), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    mean = models.embed(model, tok, TINY_TEXTS[:3], sentence_config=SentenceConfig(normalize=False))
    np.testing.assert_allclose(got, mean / np.linalg.norm(mean, axis=1, keepdims=True), atol=1e-6)


def test_unsupported_files_are_refused(tiny_hf, tmp_path):
    directory = save_st(tiny_hf, tmp_path / "st", "mean", True)
    modules = json.loads((directory / "modules.json").read_text())
    pooling_file = directory / "1_Pooling" / "config.json"
    settings = json.loads(pooling_file.read_text())
    pooling_file.write_text(json.dumps({**settings, "pooling_mode": "median"}))
    with pytest.raises(ValueError, match="median"):
        read_sentence_config(directory)
    pooling_file.write_text(json.dumps({**settings, "embedding_dimension": 48}))
    with pytest.raises(ValueError, match="embedding_dimension=48"):
        read_sentence_config(directory, hidden_size=32)
    pooling_file.write_text(json.dumps(settings))
    norm = {"idx": 2, "name": "2", "path": "2_LayerNorm", "type": "sentence_transformers.models.LayerNorm"}
    (directory / "modules.json").write_text(json.dumps(modules[:2] + [norm]))
    with pytest.raises(ValueError, match="LayerNorm"):
        read_sentence_config(directory)
    (directory / "modules.json").write_text(json.dumps(modules[1:]))
    with pytest.raises(ValueError, match="expected Transformer, Pooling"):
        read_sentence_config(directory)
    with pytest.raises(ValueError, match="pooling mode"):
        SentenceConfig(pooling=("mean", "min"))


def test_pool_refuses_a_mask_that_is_not_right_padded():
    from flaxzoo.models.inference.sentence import pool

    hidden = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    assert pool(hidden, np.array([[1, 1, 0], [1, 1, 1]]), ("lasttoken",)).shape == (2, 2)
    with pytest.raises(ValueError, match=r"mask row 1 is \[0, 1, 1\]: expected right padding"):
        pool(hidden, np.array([[1, 1, 0], [0, 1, 1]]), ("lasttoken",))
