"""Tokenizers from the Hugging Face ``tokenizers`` library: train, load, save, grow.

Two trainable kinds, each with a fixed set of special tokens at the lowest ids:

- ``"bpe"``: byte-level BPE as in GPT-2: ``<|endoftext|>`` = 0 (end of document, also used as BOS / padding),
  256 byte symbols, then merges. Any text round-trips exactly (``decode(encode(text)) == text``).
- ``"wordpiece"``: BERT's WordPiece: ``[PAD]`` = 0, ``[UNK]`` = 1, ``[CLS]`` = 2, ``[SEP]`` = 3, ``[MASK]`` = 4, then
  characters and ``##`` continuation pieces; BERT normalisation (lower-casing by default) and pre-tokenisation.

Loading accepts a ``tokenizer.json``, a BERT ``vocab.txt``, a GPT-2 ``vocab.json`` + ``merges.txt`` pair, or a
directory holding one of those (a Hugging Face model folder). :class:`TextTokenizer` wraps the result and knows the
role of each special token (``eos``, ``pad``, ``cls``, ``sep``, ``mask``, ``unk``, ``bos``), found by name.

Text is always encoded with ``add_special_tokens=False`` and with special-token strings inside the text treated as
plain text (``encode_special_tokens``), so a document that happens to contain ``"[MASK]"`` or ``"<|endoftext|>"``
never produces a special id: the data pipeline places special tokens itself.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Iterable, Sequence

import tokenizers
from tokenizers import models, pre_tokenizers, trainers

# Loading a tokenizer is the model zoo's job (pretrained checkpoints need it too): one copy, in models/.
from flaxzoo.models.io.tokenizer import BPE_SPECIALS, WORDPIECE_SPECIALS
from flaxzoo.models.io.tokenizer import ROLE_NAMES as _ROLE_NAMES
from flaxzoo.models.io.tokenizer import bert_parts as _bert_parts
from flaxzoo.models.io.tokenizer import bert_post_processor as _bert_post_processor
from flaxzoo.models.io.tokenizer import byte_level_parts as _byte_level_parts
from flaxzoo.models.io.tokenizer import load_tokenizer as _load_tokenizer
from flaxzoo.models.io.tokenizer import wordpiece_from_vocab_txt

KINDS = ("bpe", "wordpiece")
BYTE_ALPHABET_SIZE = 256


def min_vocab_size(kind: str) -> int:
    """The smallest ``vocab_size`` a trained tokenizer of ``kind`` can have (special tokens + base alphabet)."""
    if kind == "bpe":
        return len(BPE_SPECIALS) + BYTE_ALPHABET_SIZE
    if kind == "wordpiece":
        return len(WORDPIECE_SPECIALS) + 1
    raise ValueError(f"tokenizer kind={kind!r}: expected one of {KINDS}")


class TextTokenizer:
    """A ``tokenizers.Tokenizer`` plus the roles of its special tokens.

    ``vocab_size`` counts added tokens too: it is the size the model's embedding table needs.
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer):
        tokenizer.no_padding()
        tokenizer.no_truncation()
        tokenizer.encode_special_tokens = True
        self.tokenizer = tokenizer

    # ----------------------------------------------------------------------------------------------- properties
    @property
    def kind(self) -> str:
        """``"bpe"``, ``"wordpiece"``, ``"unigram"``, ... (the model type, lower case)."""
        return json.loads(self.tokenizer.to_str())["model"]["type"].lower()

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def special_tokens(self) -> dict[str, int]:
        """Every special token (string -> id): added tokens flagged special."""
        return {t.content: i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special}

    @property
    def special_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self.special_tokens.values()))

    def role_id(self, role: str) -> int | None:
        """The id of the special token playing ``role`` (``eos``, ``bos``, ``pad``, ``cls``, ``sep``, ``mask``,
        ``unk``), or ``None`` if the vocabulary has none."""
        if role not in _ROLE_NAMES:
            raise ValueError(f"role={role!r}: expected one of {sorted(_ROLE_NAMES)}")
        for name in _ROLE_NAMES[role]:
            idx = self.tokenizer.token_to_id(name)
            if idx is not None:
                return idx
        return None

    def require(self, *roles: str) -> dict[str, int]:
        """``{role: id}`` for ``roles``; ValueError naming the missing ones."""
        found = {r: self.role_id(r) for r in roles}
        missing = [r for r, i in found.items() if i is None]
        if missing:
            raise ValueError(
                f"the tokenizer has no special token for {missing}; expected one of "
                f"{[_ROLE_NAMES[r] for r in missing]} in its vocabulary"
            )
        return found  # type: ignore[return-value]

    @property
    def eos_id(self) -> int | None:
        return self.role_id("eos")

    @property
    def pad_id(self) -> int | None:
        return self.role_id("pad")

    @property
    def mask_id(self) -> int | None:
        return self.role_id("mask")

    # ------------------------------------------------------------------------------------------------- encoding
    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def tokens(self, text: str) -> list[str]:
        return self.tokenizer.encode(text, add_special_tokens=False).tokens

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------------------------------- growing, saving
    def add_tokens(self, tokens: Sequence[str], *, special: bool = False) -> int:
        """Add ``tokens`` at the end of the vocabulary; returns how many were new. The model's embedding table must
        grow to :attr:`vocab_size` (new rows for the new ids); existing ids never change."""
        before = self.vocab_size
        if special:
            self.tokenizer.add_special_tokens(list(tokens))
        else:
            self.tokenizer.add_tokens(list(tokens))
        self.tokenizer.encode_special_tokens = True
        return self.vocab_size - before

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Write ``tokenizer.json`` (``path`` is a directory or a ``.json`` file name), atomically; an object-store
        URI (``gs://...``) is written through ``etils.epath`` in one piece."""
        if "://" in os.fspath(path):
            from etils import epath

            target = epath.Path(os.fspath(path))
            target = target if target.suffix == ".json" else target / "tokenizer.json"
            target.write_text(self.tokenizer.to_str())
            return target
        path = pathlib.Path(path)
        if path.suffix != ".json":
            path = path / "tokenizer.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tokenizer-", suffix=".json")
        os.close(fd)
        self.tokenizer.save(tmp)
        os.replace(tmp, path)
        return path

    def fingerprint(self) -> str:
        """A hash of the full tokenizer definition (vocabulary, merges, normalisation, added tokens)."""
        import hashlib

        return hashlib.sha256(self.tokenizer.to_str().encode("utf-8")).hexdigest()

    def __repr__(self) -> str:
        return f"TextTokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, specials={self.special_tokens})"


# ------------------------------------------------------------------------------------------------------ training
def train_tokenizer(texts: Iterable[str], kind: str, vocab_size: int, *, lowercase: bool = True,
                    min_frequency: int = 2) -> TextTokenizer:
    """Train a ``kind`` (``"bpe"`` | ``"wordpiece"``) tokenizer with ``vocab_size`` entries on ``texts``.

    The result can be smaller than ``vocab_size`` when the corpus has too few distinct pieces; a WordPiece vocabulary
    can be larger when the corpus has more distinct characters than ``vocab_size`` (each character is kept).
    """
    if kind not in KINDS:
        raise ValueError(f"tokenizer kind={kind!r}: expected one of {KINDS} (or a path to load)")
    if not isinstance(vocab_size, int) or vocab_size < min_vocab_size(kind):
        specials = BPE_SPECIALS if kind == "bpe" else WORDPIECE_SPECIALS
        extra = f" + {BYTE_ALPHABET_SIZE} byte symbols" if kind == "bpe" else " + at least one symbol"
        raise ValueError(
            f"vocab_size={vocab_size!r} is too small for a {kind} tokenizer: it needs its {len(specials)} special "
            f"tokens {list(specials)}{extra}; expected vocab_size >= {min_vocab_size(kind)}"
        )
    if kind == "bpe":
        tok = tokenizers.Tokenizer(models.BPE())
        _byte_level_parts(tok)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=list(BPE_SPECIALS), show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        tok = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
        _bert_parts(tok, lowercase)
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=list(WORDPIECE_SPECIALS), show_progress=False,
                                            continuing_subword_prefix="##")
    counted = _CountingIterator(texts)
    tok.train_from_iterator(counted, trainer=trainer)
    if counted.nonempty == 0:
        raise ValueError("cannot train a tokenizer on an empty corpus: no non-blank text was given")
    if kind == "wordpiece":
        return _canonical_wordpiece(tok, lowercase)
    return TextTokenizer(tok)


def _canonical_wordpiece(tok: tokenizers.Tokenizer, lowercase: bool) -> TextTokenizer:
    # The WordPiece trainer numbers tokens of equal frequency in hash-map order, which changes from run to run.
    # WordPiece only needs the vocabulary as a set (greedy longest match), so renumber it canonically: the special
    # tokens first, then whole-word pieces, then "##" pieces, each by (length, text).
    vocab = tok.get_vocab(with_added_tokens=True)
    rest = sorted((t for t in vocab if t not in WORDPIECE_SPECIALS),
                  key=lambda t: (t.startswith("##"), len(t), t))
    ordered = {t: i for i, t in enumerate([*WORDPIECE_SPECIALS, *rest])}
    new = tokenizers.Tokenizer(models.WordPiece(vocab=ordered, unk_token="[UNK]", max_input_chars_per_word=100))
    _bert_parts(new, lowercase)
    new.add_special_tokens(list(WORDPIECE_SPECIALS))
    _bert_post_processor(new)
    return TextTokenizer(new)


class _CountingIterator:
    def __init__(self, texts: Iterable[str]):
        self._it = iter(texts)
        self.nonempty = 0

    def __iter__(self):
        return self

    def __next__(self) -> str:
        text = next(self._it)
        if text.strip():
            self.nonempty += 1
        return text


# ------------------------------------------------------------------------------------------------------- loading
def from_vocab_txt(path: str | os.PathLike, *, lowercase: bool = True) -> TextTokenizer:
    """A BERT WordPiece tokenizer from a ``vocab.txt`` (one token per line, id = line number)."""
    return TextTokenizer(wordpiece_from_vocab_txt(path, lowercase=lowercase))


def load_tokenizer(path: str | os.PathLike, *, lowercase: bool = True) -> TextTokenizer:
    """Load a ``tokenizer.json``, a ``vocab.txt``, a ``vocab.json`` (with ``merges.txt`` beside it), a GGUF file or a
    directory holding one of them (tried in that order); see ``flaxzoo.models.io.tokenizer.load_tokenizer``. ``lowercase``
    applies to ``vocab.txt`` only and is overridden by a ``tokenizer_config.json`` ``do_lower_case`` beside it."""
    return TextTokenizer(_load_tokenizer(path, lowercase=lowercase))
