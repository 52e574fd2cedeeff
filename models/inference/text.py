"""Text in, text out for causal LMs (``generate_text``), and what every text path shares: tokenizing, truncation and
padding. Sentence embeddings (``embed``) are :mod:`flaxzoo.models.inference.sentence_encoder`'s, labels and probabilities from
a sequence classifier (``classify``) :mod:`flaxzoo.models.inference.classifier`'s.

All take a model and a ``tokenizers.Tokenizer`` (``models.load_tokenizer``), tokenize without the tokenizer's own
padding (each batch is padded here to its longest row, rounded up to a multiple of 8 so that few shapes compile), and
run compiled programs in eval mode (no dropout), whatever mode the caller's model is in; its mode is not changed.

Truncation, the same for ``embed`` and ``classify``: a text keeps at most ``max_length`` tokens, special tokens
included (``[CLS]`` and ``[SEP]`` kept). ``max_length=None`` (the default) is the tokenizer's own truncation length
when it has one (``load_tokenizer`` of a sentence-transformers folder sets sentence-transformers' ``max_seq_length``:
256 for all-MiniLM-L6-v2), at most the model's positions; else the model's positions
(``max_position_embeddings - position_offset``). See :func:`resolve_max_length`.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import jax
import numpy as np
import tokenizers
from flax import nnx
from tokenizers import normalizers

from flaxzoo.models.architectures.decoder import GPTForCausalLM
from flaxzoo.models.architectures.encoder_decoder.model import Seq2SeqForConditionalGeneration
from flaxzoo.models.io.chat import ChatTemplate, load_chat_template
from flaxzoo.models.inference.generate import generate

__all__ = ["PAD_MULTIPLE", "TRUNCATION_STRATEGIES", "chat_prompts", "check_truncation", "encode_texts", "generate_text",
           "lowercasing_tokenizer", "pad_batch", "plain_tokenizer", "resolve_max_length", "truncate_ids",
           "truncating_tokenizer"]

PAD_MULTIPLE = 8  # batches are padded to a multiple of this many tokens
TRUNCATION_STRATEGIES = ("head", "head_tail")


def encode_texts(tokenizer: tokenizers.Tokenizer, texts: Sequence[str], *, add_special_tokens: bool = True,
                 max_length: int | None = None) -> list[list[int]]:
    """Token ids of each text, whatever padding the tokenizer is set to (pad tokens are dropped).

    ``max_length=None``: truncated as the tokenizer is set to; an int: at most that many tokens, special tokens
    included and kept (the tokenizer's own truncation replaced by this length, on a copy: ``tokenizer`` is
    unchanged)."""
    if max_length is not None:
        tokenizer = truncating_tokenizer(tokenizer, max_length)
    encodings = tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
    return [[i for i, real in zip(e.ids, e.attention_mask) if real] for e in encodings]


def truncating_tokenizer(tokenizer: tokenizers.Tokenizer, max_length: int) -> tokenizers.Tokenizer:
    """``tokenizer`` itself when it truncates at ``max_length`` (right side, no stride) already, else a copy that
    does (the caller's tokenizer is unchanged). Special tokens count against the length and are kept."""
    wanted = {"max_length": max_length, "stride": 0, "direction": "right"}
    if tokenizer.truncation is not None and all(tokenizer.truncation.get(k) == v for k, v in wanted.items()):
        return tokenizer
    copy = tokenizers.Tokenizer.from_str(tokenizer.to_str())
    copy.enable_truncation(max_length=max_length)
    return copy


def resolve_max_length(config, tokenizer: tokenizers.Tokenizer, max_length: int | None, *, minimum: int = 1) -> int:
    """The truncation length ``embed`` and ``classify`` use: ``max_length`` when given (ValueError unless an integer
    ``>= minimum`` and, for a learned / sinusoidal position table, at most the model's positions); None: the
    tokenizer's own truncation length when it has one, capped at the model's positions; else the positions
    (``max_position_embeddings - position_offset``)."""
    positions = config.max_position_embeddings - config.position_offset
    if max_length is None:
        own = None if tokenizer.truncation is None else tokenizer.truncation["max_length"]
        return positions if own is None else min(own, positions)
    if not isinstance(max_length, (int, np.integer)) or isinstance(max_length, bool) or max_length < minimum:
        raise ValueError(f"max_length={max_length!r}: expected an integer >= {minimum}"
                         + (" (two special tokens and a body)" if minimum == 3 else ""))
    if config.position in ("learned", "sinusoidal") and max_length > positions:
        raise ValueError(f"max_length={max_length}: expected at most the model's {positions} positions "
                         "(max_position_embeddings - position_offset)")
    return int(max_length)


def plain_tokenizer(tokenizer: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    """``tokenizer`` itself when it neither truncates nor pads, else a copy that does neither (the caller's
    tokenizer is unchanged)."""
    if tokenizer.truncation is None and tokenizer.padding is None:
        return tokenizer
    plain = tokenizers.Tokenizer.from_str(tokenizer.to_str())
    plain.no_truncation()
    plain.no_padding()
    return plain


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int, *, left: bool = False, limit: int | None = None,
              num_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` padded to a common length (the longest, rounded up to a multiple of 8, at most ``limit``), and with
    all-padding rows up to ``num_rows`` (default: none): ``(ids [num_rows, length] int32, mask [num_rows, length]
    int32)``. Few distinct shapes, so few compiled programs."""
    longest = max(len(r) for r in rows)
    length = -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE
    if limit is not None:
        length = max(longest, min(length, limit))
    num_rows = len(rows) if num_rows is None else num_rows
    if num_rows < len(rows):
        raise ValueError(f"num_rows={num_rows}: expected at least the {len(rows)} rows given")
    ids = np.full((num_rows, length), pad_id, np.int32)
    mask = np.zeros((num_rows, length), np.int32)
    for i, row in enumerate(rows):
        span = slice(length - len(row), length) if left else slice(0, len(row))
        ids[i, span], mask[i, span] = row, 1
    return ids, mask


# -------------------------------------------------------------------------------------------------------- embed
def lowercasing_tokenizer(tokenizer: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    """A copy of ``tokenizer`` that lower-cases text before its own normalisation (what sentence-transformers'
    ``do_lower_case`` does to a fast tokenizer); the caller's tokenizer is unchanged."""
    copy = tokenizers.Tokenizer.from_str(tokenizer.to_str())
    own = copy.normalizer
    copy.normalizer = normalizers.Sequence([normalizers.Lowercase()] + ([] if own is None else [own]))
    return copy


# ------------------------------------------------------------------------------------------------ generate_text
def generate_text(model: nnx.Module, tokenizer: tokenizers.Tokenizer,
                  prompt: str | Sequence[str] | None = None, *, max_new_tokens: int = 32,
                  temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                  eos_token_id: int | Sequence[int] | None = None,
                  stop_at_eos: bool = True, add_bos: bool | None = None, rng: jax.Array | None = None,
                  seed: int | None = None, skip_special_tokens: bool = True,
                  messages: Sequence[Mapping] | Sequence[Sequence[Mapping]] | None = None,
                  chat_template: ChatTemplate | str | os.PathLike | None = None, num_beams: int = 1,
                  length_penalty: float = 1.0, early_stopping: bool | str = False) -> str | list[str]:
    """Continue ``prompt`` (one string or a list, batched with left padding) and return only the new text; for an
    encoder-decoder (``Seq2SeqForConditionalGeneration``: T5, BART) the prompt is the source and the text is the
    decoder's (its start token left out).

    Or, instead of a prompt, answer ``messages``: one conversation (a list of ``{"role", "content"}`` mappings;
    returns a string) or a list of them (returns a list), each rendered with ``chat_template`` and the header of
    the assistant's reply (``flaxzoo.models.io.chat.apply_chat_template(chat_template, conversation,
    add_generation_prompt=True)``), then continued like a prompt.

    Args:
      max_new_tokens, temperature, top_k, top_p, rng, seed: as ``flaxzoo.models.inference.generate`` (temperature 0 = greedy; sampling
        without rng / seed draws a fresh seed each call).
      eos_token_id: stop a row at this token (or any of a list); default ``model.config.eos_token_id``.
        ``stop_at_eos=False`` never stops early. The text ends before the stop token.
      add_bos: None (default): the tokenizer's own special tokens decide (a GGUF's ``add_bos_token``; SmolLM2 adds
        none); True: make sure each prompt starts with ``config.bos_token_id``; False: encode without special
        tokens.
      skip_special_tokens: leave special tokens out of the decoded text.
      messages: a conversation (or a list of them) to answer; pass either ``prompt`` or ``messages``. A rendered
        conversation already holds the special tokens its template writes (as Hugging Face's tokenized
        ``apply_chat_template`` does), so ``add_bos=None`` encodes it without the tokenizer's own; True / False as
        for a prompt.
      chat_template: with ``messages``: where the model's chat template is (its Hugging Face directory, GGUF file
        or packaged name, as ``from_pretrained`` takes), the template text, or a ``ChatTemplate``. Required: a
        ``tokenizers.Tokenizer`` carries no template.

      num_beams, length_penalty, early_stopping: beam search, as ``flaxzoo.models.inference.generate`` (greedy
        only).

    Returns a string for a string prompt or one conversation, else a list of strings.
    """
    encoder_decoder = isinstance(model, Seq2SeqForConditionalGeneration)
    if not isinstance(model, GPTForCausalLM) and not encoder_decoder:
        raise ValueError(f"generate_text needs a causal LM (GPTForCausalLM) or an encoder-decoder "
                         f"(Seq2SeqForConditionalGeneration); got {type(model).__name__}")
    if messages is not None:
        if prompt is not None:
            raise ValueError("generate_text takes a prompt or messages, not both")
        if chat_template is None:
            raise ValueError("messages= needs chat_template=: the model's directory, GGUF file or packaged name (or "
                             "the template text); a tokenizers.Tokenizer carries no chat template")
        prompt = chat_prompts(messages, chat_template)
        add_bos = False if add_bos is None else add_bos
    elif prompt is None:
        raise ValueError("generate_text needs a prompt (a string or a list of them) or messages=")
    elif chat_template is not None:
        raise ValueError("chat_template= is for messages=; a prompt is used as it is")
    single = isinstance(prompt, str)
    prompts = [prompt] if single else list(prompt)
    if not prompts:
        return []
    config = model.config
    rows = encode_texts(tokenizer, prompts, add_special_tokens=add_bos is not False)
    if add_bos:
        if config.bos_token_id is None:
            raise ValueError("add_bos=True but the model's config has no bos_token_id")
        rows = [r if r[:1] == [config.bos_token_id] else [config.bos_token_id, *r] for r in rows]
    empty = [i for i, r in enumerate(rows) if not r]
    if empty:
        raise ValueError(f"prompt(s) {empty} encode to no tokens; pass add_bos=True to start from the BOS token")
    eos = (config.eos_token_id if eos_token_id is None else eos_token_id) if stop_at_eos else None
    stops = set() if eos is None else ({int(eos)} if isinstance(eos, (int, np.integer)) else set(map(int, eos)))
    ids, mask = pad_batch(rows, pad_id=config.pad_token_id or 0, left=not encoder_decoder)
    tokens = np.asarray(generate(model, ids, max_new_tokens, attention_mask=mask, temperature=temperature,
                                 top_k=top_k, top_p=top_p, eos_token_id=eos, rng=rng, seed=seed,
                                 num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping))
    texts = []
    for row in tokens[:, 1 if encoder_decoder else ids.shape[1]:].tolist():
        ends = [i for i, token in enumerate(row) if token in stops]
        if ends:
            row = row[:ends[0]]
        texts.append(tokenizer.decode(row, skip_special_tokens=skip_special_tokens))
    return texts[0] if single else texts


def chat_prompts(messages: Sequence[Mapping] | Sequence[Sequence[Mapping]],
                 chat_template: ChatTemplate | str | os.PathLike) -> str | list[str]:
    """One conversation rendered for generation (a string), or a list of conversations (a list of strings)."""
    template = load_chat_template(chat_template)
    if isinstance(messages, Sequence) and messages and all(
            isinstance(m, Sequence) and not isinstance(m, (str, bytes)) for m in messages):
        return [template.render(conversation, add_generation_prompt=True) for conversation in messages]
    return template.render(messages, add_generation_prompt=True)


# ----------------------------------------------------------------------------------------------------- classify
def check_truncation(max_length: int, strategy: str, head_tokens: int) -> None:
    """ValueError naming a truncation argument :func:`truncate_ids` cannot work with."""
    if strategy not in TRUNCATION_STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: expected one of {TRUNCATION_STRATEGIES}")
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 3:
        raise ValueError(f"max_length={max_length!r}: expected an integer >= 3 (two special tokens and a body)")
    if not isinstance(head_tokens, int) or isinstance(head_tokens, bool) or not 0 <= head_tokens <= max_length - 2:
        raise ValueError(f"head_tokens={head_tokens!r}: expected an integer in [0, max_length - 2 = "
                         f"{max_length - 2}] (0: a quarter of the body)")


def truncate_ids(ids: list[int], max_length: int, *, strategy: str = "head", head_tokens: int = 0) -> list[int]:
    """One encoded text cut to at most ``max_length`` tokens, its first and last token (the special tokens:
    ``[CLS] … [SEP]``, ``<s> … </s>``) kept.

    ``strategy="head"`` keeps the first ``max_length - 2`` body tokens; ``"head_tail"`` keeps the first ``k`` and the
    last ``max_length - 2 - k``, with ``k = head_tokens`` or, for ``head_tokens=0``, ``(max_length - 2) // 4``
    (Sun et al. 2019, "How to fine-tune BERT for text classification", found head + tail best for long documents:
    128 + 382 of 512; this default gives 127 + 383). A text that fits is returned as it is.
    """
    check_truncation(max_length, strategy, head_tokens)
    ids = list(ids)
    if len(ids) <= max_length:
        return ids
    first, body, last = ids[0], ids[1:-1], ids[-1]
    room = max_length - 2
    if strategy == "head":
        return [first, *body[:room], last]
    head = head_tokens or room // 4
    tail = body[len(body) - (room - head):]  # not body[-0:], which would be the whole body
    return [first, *body[:head], *tail, last]
