"""Tokenizers of pretrained models: ``load_tokenizer(path)`` → a ``tokenizers.Tokenizer``.

Sources, tried in this order for a directory:

* ``tokenizer.json``: read by the ``tokenizers`` library as it is;
* ``vocab.txt``: BERT's WordPiece (BERT normalisation, lower-cased unless ``tokenizer_config.json`` beside it says
  ``do_lower_case: false``, ``[CLS] … [SEP]`` added around each text), as Hugging Face's ``BertTokenizerFast`` builds
  it;
* ``vocab.json`` + ``merges.txt``: GPT-2's byte-level BPE;
* a ``.gguf`` file (or a directory holding one): the tokenizer llama.cpp stores in the metadata. Byte-level BPE
  (``tokenizer.ggml.model = "gpt2"``) is rebuilt from the vocabulary and merges, with the pre-tokenizer llama.cpp
  uses for ``tokenizer.ggml.pre`` (SmolLM's ``"smollm"`` splits every digit off before GPT-2's regex) and BOS added
  only when ``tokenizer.ggml.add_bos_token`` says so (SmolLM2's file says no, as Hugging Face's SmolLM2 tokenizer
  does). A SentencePiece vocabulary (``"llama"``: Llama 2, Mistral, Phi-3, Gemma) is rebuilt as byte-fallback BPE
  the way transformers' GGUF loader rebuilds it (``models/io/gguf_tokenizers.py``), BOS added unless the file says no;
* a Hugging Face Hub id (resolved as ``from_pretrained`` does).

Padding is the caller's: ``padding=False`` (the default) returns each text at its own length even when the file
asks for fixed-length padding (all-MiniLM-L6-v2's ``tokenizer.json`` pads to 128); ``True`` pads a batch to its
longest text; an integer pads to that length; ``None`` keeps what the file says.

``train/tokenizer.py`` (the data pipeline) wraps the same loaders.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Callable, Mapping

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

from flaxzoo.models.io.gguf_tokenizers import sentencepiece_from_gguf

__all__ = ["GGUF_TOKENIZERS", "SENTENCE_CONFIG", "byte_level_bpe_from_gguf", "gguf_tokenizer_kinds", "load_tokenizer",
           "pad_token", "sentence_max_length", "set_padding", "tokenizer_from_gguf", "wordpiece_from_vocab_txt"]

# Candidate names of special tokens, first present wins (BERT, RoBERTa, GPT-2, Llama / SmolLM vocabularies).
ROLE_NAMES: dict[str, tuple[str, ...]] = {
    "pad": ("[PAD]", "<pad>", "<|pad|>", "<|padding|>"),
    "unk": ("[UNK]", "<unk>", "<|unk|>"),
    "cls": ("[CLS]", "<s>", "<cls>"),
    "sep": ("[SEP]", "</s>", "<sep>"),
    "mask": ("[MASK]", "<mask>"),
    "eos": ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[SEP]"),
    "bos": ("<|endoftext|>", "<s>", "<|begin_of_text|>", "<bos>", "[CLS]"),
}
WORDPIECE_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BPE_SPECIALS = ("<|endoftext|>",)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json")
SENTENCE_CONFIG = "sentence_bert_config.json"  # sentence-transformers' settings of its Transformer module


# ---------------------------------------------------------------------------------------------- building blocks
def bert_parts(tok: tokenizers.Tokenizer, lowercase: bool) -> None:
    """BERT normalisation (clean text, CJK spacing, optional lower-casing), pre-tokenisation and ``##`` decoding."""
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")


def bert_post_processor(tok: tokenizers.Tokenizer) -> None:
    """``[CLS] A [SEP]`` and ``[CLS] A [SEP] B [SEP]`` (token types 0 / 1)."""
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )


def byte_level_parts(tok: tokenizers.Tokenizer) -> None:
    """GPT-2's byte-level pre-tokeniser (its regex, no prefix space), decoder and post-processor."""
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)


# ------------------------------------------------------------------------------------------------------ padding
def pad_token(tok: tokenizers.Tokenizer, default: tuple[int, str] | None = None) -> tuple[int, str]:
    """``(id, token)`` used for padding: the file's padding setting, a vocabulary entry named like a pad token,
    ``default``, an end-of-text token, or id 0."""
    if tok.padding is not None:
        return tok.padding["pad_id"], tok.padding["pad_token"]
    for name in ROLE_NAMES["pad"]:
        if tok.token_to_id(name) is not None:
            return tok.token_to_id(name), name
    if default is not None:
        return default
    for name in ROLE_NAMES["eos"]:
        if tok.token_to_id(name) is not None:
            return tok.token_to_id(name), name
    return 0, tok.id_to_token(0) or ""


def set_padding(tok: tokenizers.Tokenizer, padding: bool | int | None,
                default_pad: tuple[int, str] | None = None) -> tokenizers.Tokenizer:
    """Apply ``padding`` (False: none; True: to the longest text of a batch; an int: to that length; None: leave the
    tokenizer's own setting) on the right. Returns ``tok``."""
    if padding is None:
        return tok
    if isinstance(padding, bool):
        length = None
    elif isinstance(padding, int) and padding > 0:
        length = padding
    else:
        raise ValueError(f"padding={padding!r}: expected False, True, a positive length, or None (keep the file's)")
    pad_id, pad = pad_token(tok, default_pad)
    if padding is False:
        tok.no_padding()
    else:
        tok.enable_padding(direction="right", pad_id=pad_id, pad_token=pad, length=length)
    return tok


# ------------------------------------------------------------------------------------------------------ loaders
def read_lowercase_flag(folder: pathlib.Path, default: bool) -> bool:
    """``do_lower_case`` from a ``tokenizer_config.json`` in ``folder``, else ``default``."""
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        try:
            return bool(json.loads(cfg.read_text(encoding="utf-8")).get("do_lower_case", default))
        except (json.JSONDecodeError, OSError):
            return default
    return default


def wordpiece_from_vocab_txt(path: str | os.PathLike, *, lowercase: bool = True) -> tokenizers.Tokenizer:
    """A BERT WordPiece tokenizer from a ``vocab.txt`` (one token per line, id = line number)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"vocab file {str(path)!r} does not exist")
    vocab = models.WordPiece.read_file(str(path))
    if not vocab:
        raise ValueError(f"vocab file {str(path)!r} is empty")
    unk = next((n for n in ROLE_NAMES["unk"] if n in vocab), None)
    if unk is None:
        raise ValueError(f"vocab file {str(path)!r} has no unknown token; expected one of {ROLE_NAMES['unk']}")
    tok = tokenizers.Tokenizer(models.WordPiece(vocab=vocab, unk_token=unk, max_input_chars_per_word=100))
    bert_parts(tok, lowercase)
    tok.add_special_tokens([t for t in (*WORDPIECE_SPECIALS, "<s>", "</s>", "<pad>", "<mask>", "<unk>") if t in vocab])
    if tok.token_to_id("[CLS]") is not None and tok.token_to_id("[SEP]") is not None:
        bert_post_processor(tok)
    return tok


def byte_level_bpe_from_files(vocab_json: pathlib.Path) -> tokenizers.Tokenizer:
    """GPT-2's byte-level BPE from ``vocab.json`` and the ``merges.txt`` beside it."""
    merges = vocab_json.parent / "merges.txt"
    if not merges.is_file():
        raise FileNotFoundError(f"{str(vocab_json)!r} needs {str(merges)!r} beside it (byte-level BPE merges)")
    tok = tokenizers.Tokenizer(models.BPE.from_file(str(vocab_json), str(merges)))
    byte_level_parts(tok)
    tok.add_special_tokens([t for t in BPE_SPECIALS if tok.token_to_id(t) is not None])
    return tok


# llama.cpp's pre-tokenisers (tokenizer.ggml.pre → the regular expressions it splits text with before byte-level
# BPE, from llama-vocab.cpp). Each entry: (regexes applied first, whether GPT-2's own regex follows).
_GPT2 = ((), True)
_DIGITS_THEN_GPT2 = ((r"\p{N}",), True)
_LLAMA3 = ((r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+",), False)
# Qwen2 / Qwen2.5 / Qwen3 (and DeepSeek-R1's Qwen distillations): Llama 3's regex with digits split one by one.
_QWEN2 = ((r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+",), False)
GGUF_PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool]] = {
    "default": _GPT2, "gpt2": _GPT2, "gpt-2": _GPT2, "mpt": _GPT2, "olmo": _GPT2, "jais": _GPT2,
    "smollm": _DIGITS_THEN_GPT2, "starcoder": _DIGITS_THEN_GPT2, "refact": _DIGITS_THEN_GPT2,
    "command-r": _DIGITS_THEN_GPT2, "codeshell": _DIGITS_THEN_GPT2, "exaone": _DIGITS_THEN_GPT2,
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "smaug-bpe": _LLAMA3, "dbrx": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2, "kormo": _QWEN2, "f2llmv2": _QWEN2, "megrez": _QWEN2,
    "stablelm2": _QWEN2,
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def _gguf_pre_tokenizer(pre: str | None, where: Any) -> pre_tokenizers.PreTokenizer:
    key = pre or "default"  # files without the key: llama.cpp's "default", in practice GPT-2's regex
    if key not in GGUF_PRE_TOKENIZERS:
        raise ValueError(f"{where}: GGUF pre-tokenizer tokenizer.ggml.pre={pre!r} is not supported; flaxzoo knows "
                         f"{sorted(GGUF_PRE_TOKENIZERS)}")
    splits, gpt2_regex = GGUF_PRE_TOKENIZERS[key]
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=gpt2_regex))
    return steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)


def byte_level_bpe_from_gguf(meta: Mapping[str, Any], where: Any, *, architecture: str = "") -> tokenizers.Tokenizer:
    """A GGUF's ``tokenizer.ggml.model = "gpt2"`` vocabulary: byte-level BPE from its tokens and merges, split first
    as llama.cpp's ``tokenizer.ggml.pre`` says (``architecture`` plays no part)."""
    tokens: list[str] = list(meta["tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta.get("merges") or []]
    tok = tokenizers.Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = _gguf_pre_tokenizer(meta.get("pre"), where)
    tok.decoder = decoders.ByteLevel()
    return tok


# What each GGUF tokenizer kind (``tokenizer.ggml.model``) is rebuilt with: ``builder(meta, path, architecture=...)``
# (``meta``: the ``tokenizer.ggml.*`` entries without the prefix); a family's ``GGUFSpec.tokenizers`` says which kinds
# its files carry.
GGUF_TOKENIZERS: dict[str, Callable[..., tokenizers.Tokenizer]] = {
    "gpt2": byte_level_bpe_from_gguf,
    "llama": sentencepiece_from_gguf,
}
# Kinds that add BOS when the file has no tokenizer.ggml.add_bos_token (llama.cpp and transformers both do for
# SentencePiece vocabularies).
_BOS_BY_DEFAULT = ("llama",)


def gguf_tokenizer_kinds(architecture: str) -> tuple[str, ...]:
    """The tokenizer kinds flaxzoo rebuilds for GGUF files of ``general.architecture``: those its family carries
    (``GGUFSpec.tokenizers``) that :data:`GGUF_TOKENIZERS` builds; every buildable kind for an architecture no family
    registers (a tokenizer can be read from a file whose weights flaxzoo does not load)."""
    from flaxzoo.models.families import gguf_family

    try:
        carried = gguf_family(architecture).gguf.tokenizers
    except ValueError:
        carried = tuple(GGUF_TOKENIZERS)
    return tuple(kind for kind in carried if kind in GGUF_TOKENIZERS)


def tokenizer_from_gguf(path: str | os.PathLike) -> tuple[tokenizers.Tokenizer, tuple[int, str] | None]:
    """The tokenizer stored in a GGUF file, and its pad token ``(id, token)`` if the file names one.

    The kind (``tokenizer.ggml.model``) must be one the file's family carries and flaxzoo builds
    (:func:`gguf_tokenizer_kinds`; byte-level BPE ``"gpt2"``, SentencePiece ``"llama"``). Control tokens
    (``<|im_start|>`` ...) become special added tokens, user-defined ones plain added tokens, as llama.cpp matches
    both whole; the file's BOS / EOS / unknown / padding tokens are special too (transformers marks them so), as are
    the names transformers' SentencePiece classes mark (``<s>``, ``<bos>``, ``<mask>`` ...) when the vocabulary holds
    them. Only tokens of the vocabulary are added: none is appended after it. BOS / EOS are added around each text
    when ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` say so; a SentencePiece file without the BOS flag adds
    BOS, as llama.cpp and transformers do.
    """
    from flaxzoo.models.io.gguf import GGUFFile, tokenizer_metadata

    file = GGUFFile(path)
    meta: Mapping[str, Any] = tokenizer_metadata(file)
    if meta.get("tokens") is None:
        raise FileNotFoundError(f"{file.path} holds no tokenizer (no tokenizer.ggml.tokens in its metadata)")
    kind = meta.get("model")
    kinds = gguf_tokenizer_kinds(file.architecture)
    if not kinds:
        raise ValueError(f"{file.path}: flaxzoo reads the weights of general.architecture={file.architecture!r} but "
                         f"does not rebuild its tokenizer (tokenizer.ggml.model={kind!r}); expected the model's "
                         "Hugging Face tokenizer (a tokenizer.json folder, models.load_tokenizer)")
    if kind not in kinds:
        raise ValueError(f"{file.path}: GGUF tokenizer tokenizer.ggml.model={kind!r} is not supported for "
                         f"general.architecture={file.architecture!r}; expected one of {list(kinds)}")
    tokens: list[str] = list(meta["tokens"])
    tok = GGUF_TOKENIZERS[kind](meta, file.path, architecture=file.architecture)
    types = list(meta.get("token_type") or [])
    in_vocab = [(t, role) for t, role in zip(tokens, types) if tok.token_to_id(t) is not None]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, role in in_vocab if role == _CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, role in in_vocab if role == _USER_DEFINED])

    def special(key: str) -> tuple[int, str] | None:
        return None if meta.get(key) is None else (int(meta[key]), tokens[int(meta[key])])

    named = [special(key) for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")]
    added = {str(t) for t in tok.get_added_tokens_decoder().values()}
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False) for _, name in filter(None, named)
                            if name not in added and tok.token_to_id(name) is not None])
    bos, eos = special("bos_token_id"), special("eos_token_id")
    first = [bos[1]] if bos and meta.get("add_bos_token", kind in _BOS_BY_DEFAULT) else []
    last = [eos[1]] if eos and meta.get("add_eos_token") else []
    if first or last:
        single = [*first, "$A", *last]
        pair = single + [f"{piece}:1" for piece in [*first, "$B", *last]]
        ids = {name: i for i, name in (bos, eos) if name in first + last}
        tok.post_processor = processors.TemplateProcessing(single=" ".join(single), pair=" ".join(pair),
                                                           special_tokens=list(ids.items()))
    elif kind == "gpt2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok, special("padding_token_id")


def _from_file(path: pathlib.Path, lowercase: bool) -> tuple[tokenizers.Tokenizer, tuple[int, str] | None]:
    from flaxzoo.models.io.gguf import is_gguf

    if path.suffix == ".gguf" or is_gguf(path):
        return tokenizer_from_gguf(path)
    if path.name.endswith(".txt") and path.name != "merges.txt":
        return wordpiece_from_vocab_txt(path, lowercase=read_lowercase_flag(path.parent, lowercase)), None
    if path.name == "vocab.json":
        return byte_level_bpe_from_files(path), None
    try:
        return tokenizers.Tokenizer.from_file(str(path)), None
    except Exception as exc:  # tokenizers raises a bare Exception on malformed files
        raise ValueError(f"cannot read tokenizer file {str(path)!r}: {exc}") from exc


def sentence_max_length(folder: str | os.PathLike) -> int | None:
    """sentence-transformers' ``max_seq_length`` (the tokens it keeps per text, special tokens included) from the
    ``sentence_bert_config.json`` in ``folder``; None when ``folder`` has no such file or the file sets none.
    ValueError naming the file when it is not JSON or the value is not a positive integer."""
    file = pathlib.Path(folder) / SENTENCE_CONFIG
    if not file.is_file():
        return None
    try:
        value = json.loads(file.read_text(encoding="utf-8")).get("max_seq_length")
    except (json.JSONDecodeError, OSError, AttributeError) as exc:
        raise ValueError(f"{str(file)!r}: expected a JSON object with max_seq_length ({exc})") from None
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{str(file)!r}: max_seq_length={value!r}: expected a positive integer")
    return value


def load_tokenizer(path: str | os.PathLike, *, padding: bool | int | None = False, lowercase: bool = True,
                   revision: str | None = None) -> tokenizers.Tokenizer:
    """A ``tokenizers.Tokenizer`` from a ``tokenizer.json``, a ``vocab.txt``, a ``vocab.json`` (+ ``merges.txt``), a
    GGUF file, a directory holding one of them (tried in that order), or a Hugging Face Hub id.

    Args:
      padding: False (default): no padding; True: pad a batch to its longest text; an int: pad to that length;
        None: keep the file's own setting. Padding is on the right with the file's pad token (or the vocabulary's
        ``[PAD]`` / ``<pad>``, the GGUF ``padding_token_id``, an end-of-text token, id 0).
      lowercase: for ``vocab.txt`` only; a ``tokenizer_config.json`` ``do_lower_case`` beside it wins.
      revision: the Hub branch, tag or commit for a Hub id.

    Truncation stays as the file sets it (``tok.no_truncation()`` removes it), except in a sentence-transformers
    folder: a directory with a ``sentence_bert_config.json`` truncates at its ``max_seq_length``, as
    sentence-transformers does (all-MiniLM-L6-v2: 256 tokens, where its ``tokenizer.json`` says 128; the file's
    fixed-length padding, kept by ``padding=None``, follows: 256).
    ``flaxzoo.models.embed`` and ``classify`` take this length as their default ``max_length``.
    """
    from flaxzoo.models.io import is_hub_id, resolve_pretrained

    if is_hub_id(path):
        path = resolve_pretrained(path, revision=revision)
    path = pathlib.Path(os.path.expanduser(str(path)))
    if not path.exists():
        raise FileNotFoundError(f"tokenizer path {str(path)!r} does not exist")
    if path.is_dir():
        candidates = [path / name for name in TOKENIZER_FILES if (path / name).is_file()]
        candidates += sorted(path.glob("*.gguf"))[:1]
        if not candidates:
            listing = sorted(p.name for p in path.iterdir())
            raise FileNotFoundError(
                f"tokenizer directory {str(path)!r} holds none of tokenizer.json, vocab.txt, vocab.json "
                f"(+ merges.txt), *.gguf; it holds {', '.join(listing) if listing else 'nothing'}")
        sentence_length = sentence_max_length(path)
        path = candidates[0]
    else:
        sentence_length = None
    tok, default_pad = _from_file(path, lowercase)
    if sentence_length is not None:
        tok.enable_truncation(max_length=sentence_length)
        if tok.padding is not None and tok.padding["length"] is not None:  # a fixed length: the new one
            tok.enable_padding(**{**tok.padding, "length": sentence_length})
    return set_padding(tok, padding, default_pad)
