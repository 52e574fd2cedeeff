"""SentencePiece vocabularies of GGUF files (``tokenizer.ggml.model = "llama"``) as ``tokenizers.Tokenizer`` objects.

llama.cpp's converter writes a SentencePiece model (Llama 2, Mistral v0.1-v0.3, Phi-3, Gemma 1/2/3 ...) as three
parallel arrays: ``tokenizer.ggml.tokens`` (the pieces, spaces spelled ``▁``), ``tokenizer.ggml.scores`` and
``tokenizer.ggml.token_type`` (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte ``<0x00>`` ...
``<0xFF>``). No merges are stored, so :func:`sentencepiece_from_gguf` rebuilds the tokenizer the way transformers'
GGUF loader (``AutoTokenizer.from_pretrained(folder, gguf_file=...)``) does, so that both give the same ids:

* a BPE model with byte fallback whose merges are every split of a piece into two pieces of the vocabulary
  (:func:`merges_from_vocabulary`), the piece with the higher score merging first: SentencePiece's own rule;
* three flavours, picked by ``general.architecture`` as transformers picks them (nothing in the file says which):

  - ``"llama"`` (Llama 2, Mistral and every other architecture): no normaliser; ``Metaspace`` spells spaces ``▁``
    and adds one in front of the first piece of text (not again after a special token, nor when the text already
    starts with a space); the decoder drops that first space again.
  - ``"phi3"``: a normaliser spells spaces ``▁`` and adds one in front of every piece of text between special
    tokens, so ``"  hi"`` becomes ``▁▁▁hi`` (``Metaspace`` gives ``▁▁hi``); no pre-tokeniser.
  - ``"gemma"`` (``gemma``, ``gemma2``, ``gemma3``): spaces spelled ``▁``, no space added in front (the files say
    ``add_space_prefix = false``), and the decoder strips nothing. Gemma's files store pieces made only of spaces
    with real spaces; they are spelled ``▁`` here, as their merges need. Gemma's scores do not follow its merge
    order, the order of the pieces in the file does: merges are ranked by position.

The caller (``flaxzoo.models.io.tokenizer.tokenizer_from_gguf``) adds the control and user-defined tokens and the BOS /
EOS template.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers

__all__ = ["SPACE", "merges_from_vocabulary", "sentencepiece_flavour", "sentencepiece_from_gguf"]

SPACE = "\u2581"  # SentencePiece's spelling of a space, "▁"

# general.architecture → flavour, as transformers chooses its builder; every other architecture is "llama".
FLAVOURS: dict[str, str] = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "phi3": "phi3"}

# Names transformers' tokenizer classes (LlamaTokenizer, GemmaTokenizer) mark special whenever the vocabulary holds
# them, whatever their token type says.
DEFAULT_SPECIALS: dict[str, tuple[str, ...]] = {
    "llama": ("<unk>", "<s>", "</s>"),
    "phi3": ("<unk>", "<s>", "</s>"),
    "gemma": ("<unk>", "<bos>", "<eos>", "<pad>", "<mask>"),
}


def sentencepiece_flavour(architecture: str) -> str:
    """``"gemma"``, ``"phi3"`` or ``"llama"``: how a SentencePiece GGUF of ``architecture`` is rebuilt."""
    return FLAVOURS.get(architecture, "llama")


def merges_from_vocabulary(tokens: Sequence[str], priority: Mapping[str, float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary, first merged first.

    Every way of cutting a piece into two pieces of the vocabulary is a merge, ranked by ``priority`` of the piece it
    makes (higher first: the SentencePiece score, or minus the position for Gemma), then by the longer left half,
    then the longer right half. Cuts that still tie (of different pieces: two cuts of one piece differ in their left
    half) keep the order of their pieces in ``priority``: the order transformers' GGUF loader gives, so both
    tokenise alike.
    """
    known = set(tokens)
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, score in priority.items():
        ranked.extend((-score, -i, i - len(piece), piece[:i], piece[i:]) for i in range(1, len(piece))
                      if piece[:i] in known and piece[i:] in known)
    ranked.sort(key=lambda merge: merge[:3])  # stable: equal keys stay in the order built above
    return [(left, right) for *_, left, right in ranked]


def gemma_spelling(token: str) -> str:
    """A Gemma piece as its merges spell it: a piece of spaces (stored with real spaces) becomes ``▁`` × length."""
    return SPACE * len(token) if " " in token and not token.strip() else token


def sentencepiece_from_gguf(meta: Mapping[str, Any], where: Any, *, architecture: str = "") -> tokenizers.Tokenizer:
    """A GGUF's ``tokenizer.ggml.model = "llama"`` vocabulary as a byte-fallback BPE tokenizer (see the module).

    Args:
      meta: the file's ``tokenizer.ggml.*`` entries, keys without the prefix (``tokens``, ``scores``, ``merges`` if
        the file has them, ``unknown_token_id`` ...).
      where: the file, for error messages.
      architecture: ``general.architecture``; picks the flavour (:func:`sentencepiece_flavour`).
    """
    flavour = sentencepiece_flavour(architecture)
    tokens: list[str] = list(meta["tokens"])
    if flavour == "gemma":
        tokens = [gemma_spelling(t) for t in tokens]
    if meta.get("merges"):  # a file converted with its merges keeps them
        merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
    elif flavour == "gemma":
        merges = merges_from_vocabulary(tokens, {t: -float(i) for i, t in enumerate(tokens)})
    else:
        scores = meta.get("scores")
        if scores is None or len(scores) != len(tokens):
            got = "none" if scores is None else f"{len(scores)}"
            raise ValueError(f"{where}: a SentencePiece GGUF vocabulary needs tokenizer.ggml.scores, one per token "
                             f"({len(tokens)}); the file has {got}")
        merges = merges_from_vocabulary(tokens, dict(zip(tokens, map(float, scores))))
    vocab = {t: i for i, t in enumerate(tokens)}
    unk_id = meta.get("unknown_token_id")
    unk = tokens[int(unk_id)] if unk_id is not None and 0 <= int(unk_id) < len(tokens) else None
    if unk is None and "<unk>" in vocab:
        unk = "<unk>"
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True,
                                          byte_fallback=True))
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if flavour == "gemma":
        tok.normalizer = normalizers.Replace(" ", SPACE)
    elif flavour == "phi3":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=False)
    if flavour != "gemma":
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(steps)
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False)
                            for name in DEFAULT_SPECIALS[flavour] if name in vocab])
    return tok
