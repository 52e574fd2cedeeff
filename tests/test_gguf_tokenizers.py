"""GGUF tokenizers against transformers' GGUF loader: SentencePiece vocabularies (``tokenizer.ggml.model = "llama"``:
Llama 2 / Mistral, Phi-3, Gemma flavours) and Qwen2's byte-level BPE pre-tokenizer.

Each GGUF is written here with the ``gguf`` package and holds only tokenizer metadata and one tiny tensor. The
SentencePiece vocabularies come from a small BPE trained in this file (pieces spelled with ``▁``, scores minus the
merge step, the 256 byte tokens, control and user-defined tokens), some with scores that do not follow the merge
order (unigram-like log-probabilities, ties) and Gemma's layout (pieces of spaces stored with real spaces, merge
order = file order). ``AutoTokenizer.from_pretrained(folder, gguf_file=...)`` reads the same file; both must give
the same ids and the same decoded text for a varied set of texts.
"""

from __future__ import annotations

import collections
import itertools
import pathlib
import random
from typing import Any

import gguf
import numpy as np
import pytest

from flaxzoo.models.io import tokenizer as tokenizer_module
from flaxzoo.models.io.gguf_tokenizers import SPACE, merges_from_vocabulary, sentencepiece_flavour
from flaxzoo.models.io.tokenizer import GGUF_TOKENIZERS, gguf_tokenizer_kinds, load_tokenizer, tokenizer_from_gguf

transformers = pytest.importorskip("transformers")

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6  # llama.cpp token types

CORPUS = """The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away into the forest.
Hello world, hello there! Tokenizers split text into pieces, and pieces into ids: the model reads the ids.
Numbers like 12345, 2024 and 3.14159 appear in text too, as do dates such as 05/06/2023.
Un café crème, s'il vous plaît. La naïve résumé de l'été à Genève. Über Größe und Straße.
東京は日本の首都です。中文也很常见。
"""

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "the theme of these thermal threads",
    " leading space",
    "   three leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "multiple   inner    spaces",
    "line one\nline two\n\nline four\n",
    "tabs\tand\r\nwindows line ends",
    "digits 12345 67890 and 3.14159, 1,000,000",
    "café crème, naïve résumé, Größe, Ærøskøbing",
    "東京は日本の首都です。",
    "中文字符和日本語のテキスト",
    "emoji 🙂🚀 and ✓ ★ 𝔘𝔫𝔦",
    "",
    " ",
    "\n",
    "<s>special</s> inside text",
    "[INST] do the thing [/INST] done</s>",
    "<|user|>hi there<|end|>",
    "a<unk>b <unk>",
    "<pad><mask><bos><eos> names",
    "literal <0x41> byte name",
    "spaces  before<|user|>  and after  ",
]


# ------------------------------------------------------------------------------------------------- vocabularies
def train_bpe(corpus: str, steps: int) -> tuple[list[str], list[str]]:
    """A SentencePiece-style BPE on ``corpus``: ``(merged pieces in merge order, single characters)``.

    Words are ``▁`` + word; the most frequent adjacent pair merges at each step (ties: the smaller pair)."""
    words = collections.Counter(tuple(SPACE + w) for w in corpus.split())
    chars = sorted({c for w in words for c in w})
    pieces: list[str] = []
    for _ in range(steps):
        pairs: collections.Counter = collections.Counter()
        for word, count in words.items():
            for a, b in itertools.pairwise(word):
                pairs[a, b] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        pieces.append(best[0] + best[1])
        merged = collections.Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return pieces, chars


PIECES, CHARS = train_bpe(CORPUS, 160)
BYTES = [f"<0x{b:02X}>" for b in range(256)]
# Characters left out of the vocabulary, so that they go through byte fallback.
DROPPED = set("首都ø") | {c for c in CHARS if ord(c) > 0x1F000}


def llama_vocab(scores: str = "merge-order", *, pad: bool = False) -> dict[str, Any]:
    """Llama 2 / Mistral layout: <unk> <s> </s>, the byte tokens, control [INST] [/INST], user-defined <|user|>
    <|end|> and a piece of two spaces (stored with real spaces, as llama.cpp stores user-defined pieces), the merged
    pieces, then the single characters.

    ``scores``: ``"merge-order"`` (SentencePiece BPE: minus the merge step, characters last); ``"unigram"``
    (log-probability-like values in no merge order, with ties). ``pad``: a normal token ``<pad>`` the file names as
    its padding token.
    """
    tokens = ["<unk>", "<s>", "</s>", *BYTES, "[INST]", "[/INST]", "<|user|>", "<|end|>", "  ", "<pad>"]
    types = [UNKNOWN, CONTROL, CONTROL, *[BYTE] * 256, CONTROL, CONTROL, USER_DEFINED, USER_DEFINED, USER_DEFINED,
             NORMAL]
    fixed = len(tokens)
    chars = [c for c in CHARS if c not in DROPPED]
    tokens += PIECES + chars
    types += [NORMAL] * (len(PIECES) + len(chars))
    if scores == "merge-order":
        values = [0.0] * fixed + [-float(i) for i in range(len(PIECES) + len(chars))]
    else:
        rng = random.Random(0)
        values = [0.0] * fixed + [float(round(rng.uniform(-12.0, -2.0))) for _ in range(len(PIECES) + len(chars))]
    return {"tokens": tokens, "types": types, "scores": values, "bos": 1, "eos": 2, "unk": 0,
            **({"pad": tokens.index("<pad>")} if pad else {})}


def gemma_vocab() -> dict[str, Any]:
    """Gemma's layout: <pad> <eos> <bos> <unk> <mask>, control turn tokens, user-defined pieces of spaces stored with
    real spaces, newline pieces, the byte tokens, then the pieces. Scores do not follow the merge order (all pieces
    share one value but a few); the file's order does."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>", "  ", "   ", "\n",
              "\n\n", *BYTES]
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN, USER_DEFINED, CONTROL, CONTROL, USER_DEFINED, USER_DEFINED,
             USER_DEFINED, USER_DEFINED, *[BYTE] * 256]
    fixed = len(tokens)
    chars = [c for c in CHARS if c not in DROPPED]
    tokens += PIECES + chars
    types += [NORMAL] * (len(PIECES) + len(chars))
    values = [0.0] * fixed + [-1000.0 if i % 7 == 0 else 0.0 for i in range(len(PIECES) + len(chars))]
    return {"tokens": tokens, "types": types, "scores": values, "bos": 2, "eos": 1, "unk": 3, "pad": 0}


def write_gguf(path: pathlib.Path, arch: str, vocab: dict[str, Any], *, model: str = "llama",
               extra: dict[str, Any] | None = None) -> pathlib.Path:
    """A GGUF holding the tokenizer metadata of ``vocab`` and one tiny tensor."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tokenizer_model(model)
    if "pre" in vocab:
        writer.add_tokenizer_pre(vocab["pre"])
    writer.add_token_list(vocab["tokens"])
    if "scores" in vocab:
        writer.add_token_scores(vocab["scores"])
    writer.add_token_types(vocab["types"])
    if "merges" in vocab:
        writer.add_token_merges(vocab["merges"])
    writer.add_bos_token_id(vocab["bos"])
    writer.add_eos_token_id(vocab["eos"])
    if "unk" in vocab:
        writer.add_unk_token_id(vocab["unk"])
    if "pad" in vocab:
        writer.add_pad_token_id(vocab["pad"])
    for key, value in (extra or {}).items():
        (writer.add_bool if isinstance(value, bool) else writer.add_string)(key, value)
    writer.add_tensor("token_embd.weight", np.zeros((len(vocab["tokens"]), 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(autouse=True)
def every_kind(monkeypatch):
    """Every buildable kind for every architecture: these files' architectures stand for families that may or may
    not carry a kind yet; what is tested here is the rebuild."""
    monkeypatch.setattr(tokenizer_module, "gguf_tokenizer_kinds", lambda architecture: tuple(GGUF_TOKENIZERS))


def reference(path: pathlib.Path):
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def assert_same(path: pathlib.Path, texts: list[str] = TEXTS) -> None:
    """flaxzoo's and transformers' tokenizers of ``path``: the same ids, tokens and decoded text for every text, a
    pair of texts, and the same vocabulary size."""
    ours, _ = tokenizer_from_gguf(path)
    hf = reference(path)
    assert ours.get_vocab_size(with_added_tokens=True) == len(hf)
    for text in texts:
        expected = hf(text)["input_ids"]
        got = ours.encode(text)
        assert got.ids == expected, (text, got.tokens, hf.convert_ids_to_tokens(expected))
        for skip in (False, True):
            assert ours.decode(got.ids, skip_special_tokens=skip) == hf.decode(expected, skip_special_tokens=skip), \
                (text, skip)
    pair = ("first  text", " second\ntext")
    assert ours.encode(*pair).ids == hf(*pair)["input_ids"]


# ----------------------------------------------------------------------------------------------- SentencePiece
def test_the_vocabulary_exercises_merges_bytes_and_specials():
    vocab = llama_vocab()
    assert len(PIECES) == 160 and "▁the" in PIECES and len(set(vocab["tokens"])) == len(vocab["tokens"])
    assert {"東", "é", "ß"} <= set(vocab["tokens"]) and not {"首", "🙂", "ø"} & set(vocab["tokens"])


@pytest.mark.parametrize("scores", ["merge-order", "unigram"])
def test_merges_are_transformers_merges(scores):
    """The merge list (ranks, ties, halves) is the one transformers derives from the same vocabulary and scores."""
    from transformers.tokenization_utils_base import generate_merges

    vocab = llama_vocab(scores)
    tokens = vocab["tokens"]
    priority = dict(zip(tokens, vocab["scores"]))
    expected = generate_merges({t: i for i, t in enumerate(tokens)}, priority)
    assert merges_from_vocabulary(tokens, priority) == expected and len(expected) > len(PIECES)


@pytest.mark.parametrize("scores", ["merge-order", "unigram"])
def test_llama_sentencepiece_matches_transformers(tmp_path, scores):
    """Llama 2 / Mistral: Metaspace with a first-piece prefix, byte fallback, BOS added by default (no flag)."""
    path = write_gguf(tmp_path / "spm.gguf", "llama", llama_vocab(scores))
    assert_same(path)
    tok, pad = tokenizer_from_gguf(path)
    assert pad is None
    assert tok.encode("Hello").ids[0] == 1  # BOS without tokenizer.ggml.add_bos_token
    assert tok.encode("🙂").tokens[-4:] == ["<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]
    text = "two  spaces, 東京 🙂"
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=True) == text


def test_bos_eos_flags_and_mistral_architecture(tmp_path):
    """add_bos_token false / add_eos_token true are followed; a "mistral" file is rebuilt like a "llama" one; the
    file's padding token is special (matched whole) though its type is normal."""
    path = write_gguf(tmp_path / "flags.gguf", "mistral", llama_vocab(pad=True),
                      extra={"tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": True})
    assert_same(path)
    tok, pad = tokenizer_from_gguf(path)
    assert tok.encode("Hello").ids[-1] == 2 and pad == (264, "<pad>")
    assert tok.encode("a<pad>").tokens[-2:] == ["<pad>", "</s>"]
    assert load_tokenizer(path).encode("Hello").ids == tokenizer_from_gguf(path)[0].encode("Hello").ids


def test_phi3_sentencepiece_matches_transformers(tmp_path):
    """Phi-3: the prefix ``▁`` comes from a normaliser, once per piece of text between special tokens."""
    path = write_gguf(tmp_path / "phi3.gguf", "phi3", llama_vocab())
    assert_same(path)
    assert sentencepiece_flavour("phi3") == "phi3"
    assert "".join(tokenizer_from_gguf(path)[0].encode(" hi").tokens[1:]) == SPACE * 2 + "hi"  # Metaspace: ▁hi


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_gemma_sentencepiece_matches_transformers(tmp_path, arch):
    """Gemma: spaces spelled ▁ with none added in front, pieces of spaces respelled, merges in file order, the
    class's special names (<mask> stays plain: the file marks it user-defined), pad from the file."""
    path = write_gguf(tmp_path / f"{arch}.gguf", arch, gemma_vocab(),
                      extra={"tokenizer.ggml.add_space_prefix": False, "tokenizer.ggml.add_bos_token": True})
    assert_same(path, TEXTS + ["<start_of_turn>user\nHi<end_of_turn>\n", "a\n\nb  c   d"])
    tok, pad = tokenizer_from_gguf(path)
    assert pad == (0, "<pad>") and sentencepiece_flavour(arch) == "gemma"
    assert tok.encode("hello world").tokens[1] == "hello"  # no prefix space
    assert tok.token_to_id(SPACE * 2) == 7 and tok.get_vocab_size() == len(gemma_vocab()["tokens"])


def test_sentencepiece_needs_scores(tmp_path):
    vocab = {k: v for k, v in llama_vocab().items() if k != "scores"}
    path = write_gguf(tmp_path / "noscores.gguf", "llama", vocab)
    with pytest.raises(ValueError, match=r"noscores\.gguf: a SentencePiece GGUF vocabulary needs "
                                         r"tokenizer\.ggml\.scores"):
        tokenizer_from_gguf(path)


# ---------------------------------------------------------------------------------------------- Qwen2 BPE
def qwen2_vocab() -> dict[str, Any]:
    """A byte-level BPE whose merges would join digits and a punctuation mark to a word: Qwen2's regex keeps every
    digit alone and lets one non-letter lead a word (GPT-2's splits it off)."""
    from tokenizers import pre_tokenizers

    merges = ["Ġ t", "h e", "Ġt he", "1 2", "12 3", "l l", "ll o", "he llo", "$ hello", "Ġ hello",
              "w o", "wo r", "wor l", "worl d", "Ġ world", "' s", "Ċ Ċ", "Ġ Ġ"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *sorted(pre_tokenizers.ByteLevel.alphabet())]
    tokens += [m.replace(" ", "") for m in merges]
    types = [CONTROL] * 3 + [NORMAL] * (len(tokens) - 3)
    return {"tokens": tokens, "types": types, "merges": merges, "bos": 0, "eos": 2, "pre": "qwen2"}


def test_qwen2_pre_tokenizer_matches_transformers(tmp_path):
    path = write_gguf(tmp_path / "qwen2.gguf", "qwen2", qwen2_vocab(), model="gpt2",
                      extra={"tokenizer.ggml.add_bos_token": False})
    texts = ["hello world 12345", "$hello the'S 123", "the  world\n\n\nhello", " 12 $he", "<|im_start|>hi<|im_end|>",
             "Größe 東京 🙂", "  leading", "trailing  "]
    assert_same(path, texts)
    tok, _ = tokenizer_from_gguf(path)
    assert tok.encode("123").tokens == ["1", "2", "3"]  # the "1 2" merge never applies: digits are split singly
    assert tok.encode("$hello").tokens == ["$hello"]


# --------------------------------------------------------------------------------------------------- errors
def test_gguf_tokenizer_kinds_offer_sentencepiece(monkeypatch):
    monkeypatch.undo()
    assert set(gguf_tokenizer_kinds("no-family-has-this")) == {"gpt2", "llama"}


def test_an_unknown_tokenizer_model_is_named(tmp_path):
    path = write_gguf(tmp_path / "t5.gguf", "t5", llama_vocab(), model="t5")
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.model='t5' is not supported for "
                                         r"general\.architecture='t5'; expected one of \['gpt2', 'llama'\]"):
        tokenizer_from_gguf(path)
