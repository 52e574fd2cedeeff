"""Text in, text (or vectors) out: sentence embeddings for encoders, text continuation for causal LMs, labels (and
probabilities) from a sequence classifier.

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

import dataclasses
import os
from functools import partial
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tokenizers
from flax import nnx
from tokenizers import normalizers

from flaxzoo.models.architectures.decoder import GPTForCausalLM
from flaxzoo.models.architectures.encoder import BertForSequenceClassification
from flaxzoo.models.chat import ChatTemplate, load_chat_template
from flaxzoo.models.generate import eval_split, generate
from flaxzoo.models.layers.stack import TransformerStack
from flaxzoo.models.sentence import SentenceConfig, pool, read_sentence_config

__all__ = ["Classifier", "PAD_MULTIPLE", "SentenceEncoder", "TRUNCATION_STRATEGIES", "chat_prompts", "classify",
           "embed", "encode_for_classification", "encode_texts", "generate_text", "lowercasing_tokenizer", "pad_batch",
           "plain_tokenizer", "resolve_max_length", "truncate_ids", "truncating_tokenizer"]

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
def _stack(model: nnx.Module) -> nnx.Module:
    """The ``TransformerStack`` of a flaxzoo model."""
    if isinstance(getattr(model, "backbone", None), TransformerStack):  # every flaxzoo class keeps it there
        return model.backbone
    raise ValueError(f"embed needs a flaxzoo encoder or decoder; got {type(model).__name__}")


@partial(jax.jit, static_argnames=("graphdef", "modes"))
def _pooled(graphdef: nnx.GraphDef, state: nnx.State, ids: jax.Array, mask: jax.Array,
            modes: tuple[str, ...]) -> jax.Array:
    """The stack's hidden states pooled over real tokens (:func:`flaxzoo.models.sentence.pool`): ``[batch, seq]`` →
    ``[batch, len(modes) * hidden]`` float32."""
    return pool(_stack(nnx.merge(graphdef, state))(ids, mask).hidden, mask, modes)


def lowercasing_tokenizer(tokenizer: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    """A copy of ``tokenizer`` that lower-cases text before its own normalisation (what sentence-transformers'
    ``do_lower_case`` does to a fast tokenizer); the caller's tokenizer is unchanged."""
    copy = tokenizers.Tokenizer.from_str(tokenizer.to_str())
    own = copy.normalizer
    copy.normalizer = normalizers.Sequence([normalizers.Lowercase()] + ([] if own is None else [own]))
    return copy


class SentenceEncoder:
    """An encoder, its tokenizer and sentence-transformers' settings (:class:`flaxzoo.models.sentence.SentenceConfig`:
    pooling, Dense layers, normalisation, ``max_seq_length``, ``do_lower_case``), ready to embed texts: an eval-mode
    split of the model and the tokenizer set up once. ``SentenceEncoder.from_pretrained(path)`` reads all of them from a
    sentence-transformers folder (a local directory, a packaged name or a Hub id); calling it is :func:`embed`.

    Args:
      model: a flaxzoo encoder or decoder (its ``TransformerStack``'s hidden states are pooled).
      tokenizer: a ``tokenizers.Tokenizer`` (``models.load_tokenizer``).
      config: the settings; None: mean pooling, L2-normalised, the default length rule (``embed``'s behaviour
        without sentence-transformers files).
      max_length: tokens kept per text (special tokens included); None: ``config.max_seq_length`` (at most the
        model's positions) when set, else :func:`resolve_max_length`'s rule.
    """

    def __init__(self, model: nnx.Module, tokenizer: tokenizers.Tokenizer, config: SentenceConfig | None = None, *,
                 max_length: int | None = None):
        stack = _stack(model)
        self.config = SentenceConfig() if config is None else config
        if not isinstance(self.config, SentenceConfig):
            raise ValueError(f"config={config!r}: expected a SentenceConfig or None")
        model_config = model.config
        if max_length is None and self.config.max_seq_length is not None:
            max_length = self.config.max_seq_length
            if model_config.position in ("learned", "sinusoidal"):  # sentence-transformers caps it the same way
                max_length = min(max_length, model_config.max_position_embeddings - model_config.position_offset)
        self.max_length = resolve_max_length(model_config, tokenizer, max_length)
        tokenizer = truncating_tokenizer(tokenizer, self.max_length)
        self.tokenizer = lowercasing_tokenizer(tokenizer) if self.config.do_lower_case else tokenizer
        self.model_config, self.check_inputs = model_config, stack.check_inputs
        self.graphdef, self.state = eval_split(model)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, revision: str | None = None,
                        max_length: int | None = None, **model_options) -> "SentenceEncoder":
        """The model (``models.from_pretrained(path, **model_options)``), tokenizer (``models.load_tokenizer``) and
        sentence-transformers settings (:func:`flaxzoo.models.sentence.read_sentence_config`; a folder without
        ``modules.json``: the defaults) of ``path``: a local directory, a packaged name or a Hub id."""
        from flaxzoo.models.hub import from_pretrained, resolve_pretrained
        from flaxzoo.models.tokenizer import load_tokenizer

        local = resolve_pretrained(path, revision=revision)
        model = from_pretrained(local, **model_options)
        config = read_sentence_config(local, hidden_size=model.config.hidden_size) if local.is_dir() else None
        return cls(model, load_tokenizer(local), config, max_length=max_length)

    @property
    def dimension(self) -> int:
        """The length of a sentence vector: ``len(pooling) * hidden_size``, or the last Dense layer's outputs."""
        if self.config.dense:
            return self.config.dense[-1].weight.shape[0]
        return len(self.config.pooling) * self.model_config.hidden_size

    def __call__(self, texts: str | Sequence[str], *, batch_size: int = 32, normalize: bool | None = None
                 ) -> np.ndarray:
        """``[len(texts), dimension]`` float32 sentence vectors (one row for a single string); ``normalize``:
        None: the config's."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: expected a positive integer")
        if not texts:
            return np.zeros((0, self.dimension), np.float32)
        out = []
        for start in range(0, len(texts), batch_size):
            rows = encode_texts(self.tokenizer, texts[start:start + batch_size])
            if min(len(r) for r in rows) == 0:
                raise ValueError("a text encodes to no tokens at all; embed needs at least one token per text")
            ids, mask = pad_batch(rows, pad_id=self.model_config.pad_token_id or 0, left=False, limit=self.max_length)
            self.check_inputs(ids, mask)  # ids in range, length within the positions: before compiling
            # numpy arguments: jnp.asarray would compile a small program per new shape
            out.append(np.asarray(_pooled(self.graphdef, self.state, ids, mask, self.config.pooling)))
        vectors = np.concatenate(out)
        for layer in self.config.dense:
            vectors = layer(vectors)
        if self.config.normalize if normalize is None else normalize:
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
        return vectors


def embed(model: nnx.Module | SentenceEncoder | str | os.PathLike, tokenizer: tokenizers.Tokenizer | None,
          texts: str | Sequence[str], *, batch_size: int = 32, normalize: bool | None = None,
          max_length: int | None = None, pooling: str | Sequence[str] | None = None,
          sentence_config: SentenceConfig | str | os.PathLike | None = None) -> np.ndarray:
    """Sentence embeddings, as sentence-transformers computes them.

    Without sentence-transformers settings (``model`` a flaxzoo model and ``sentence_config=None``): hidden states
    mean-pooled over each text's real tokens, L2-normalised, cut to ``max_length`` tokens (default: see
    :func:`resolve_max_length`, the same rule as :func:`classify`; ``load_tokenizer`` of a folder whose
    ``sentence_bert_config.json`` sets ``max_seq_length`` truncates there). This is what sentence-transformers
    computes for all-MiniLM-L6-v2 (mean pooling, ``Normalize``, 256 tokens).

    With them, their pooling, Dense layers, normalisation, ``max_seq_length`` and ``do_lower_case`` are applied
    (:mod:`flaxzoo.models.sentence`): ``model`` a path, packaged name or Hub id (the model, its tokenizer when
    ``tokenizer`` is None, and its sentence-transformers files are read: :meth:`SentenceEncoder.from_pretrained`),
    a :class:`SentenceEncoder`, or ``sentence_config`` a :class:`~flaxzoo.models.sentence.SentenceConfig` or the
    folder / Hub id to read one from (a folder without ``modules.json`` gives the defaults above).

    ``pooling`` (a mode or a list, see ``flaxzoo.models.sentence.POOLING_MODES``), ``normalize`` and
    ``max_length`` override the settings when given. Texts are encoded with the tokenizer's special tokens
    (``[CLS] … [SEP]``), batched by ``batch_size``; the model runs in eval mode. To embed many small batches, build
    a :class:`SentenceEncoder` once. Returns ``[len(texts), len(pooling) * hidden]`` float32 (one row for a single
    string; the last Dense layer's width instead when there are Dense layers).
    """
    if isinstance(model, (str, os.PathLike)):
        if sentence_config is not None:
            raise ValueError("sentence_config= is for a model object; a path's own sentence-transformers files are "
                             "read")
        model = SentenceEncoder.from_pretrained(model, max_length=max_length)
    if isinstance(model, SentenceEncoder):
        if sentence_config is not None:
            raise ValueError("sentence_config= is for a model object; a SentenceEncoder has its own config")
        if tokenizer is None and pooling is None and (max_length is None or max_length == model.max_length):
            return model(texts, batch_size=batch_size, normalize=normalize)
        model, tokenizer, config = nnx.merge(model.graphdef, model.state), tokenizer or model.tokenizer, model.config
    else:
        config = sentence_config
        if isinstance(config, (str, os.PathLike)):
            from flaxzoo.models.hub import resolve_pretrained

            _stack(model)  # a flaxzoo model: checked before any file is read
            config = read_sentence_config(resolve_pretrained(config), hidden_size=model.config.hidden_size)
    if tokenizer is None:
        raise ValueError("embed needs a tokenizer (models.load_tokenizer) for a model object")
    config = SentenceConfig() if config is None else config
    if pooling is not None:
        config = dataclasses.replace(config, pooling=pooling)
    return SentenceEncoder(model, tokenizer, config, max_length=max_length)(texts, batch_size=batch_size,
                                                                            normalize=normalize)


# ------------------------------------------------------------------------------------------------ generate_text
def generate_text(model: nnx.Module, tokenizer: tokenizers.Tokenizer,
                  prompt: str | Sequence[str] | None = None, *, max_new_tokens: int = 32,
                  temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                  eos_token_id: int | Sequence[int] | None = None,
                  stop_at_eos: bool = True, add_bos: bool | None = None, rng: jax.Array | None = None,
                  seed: int | None = None, skip_special_tokens: bool = True,
                  messages: Sequence[Mapping] | Sequence[Sequence[Mapping]] | None = None,
                  chat_template: ChatTemplate | str | os.PathLike | None = None) -> str | list[str]:
    """Continue ``prompt`` (one string or a list, batched with left padding) and return only the new text.

    Or, instead of a prompt, answer ``messages``: one conversation (a list of ``{"role", "content"}`` mappings;
    returns a string) or a list of them (returns a list), each rendered with ``chat_template`` and the header of
    the assistant's reply (``flaxzoo.models.chat.apply_chat_template(chat_template, conversation,
    add_generation_prompt=True)``), then continued like a prompt.

    Args:
      max_new_tokens, temperature, top_k, top_p, rng, seed: as ``flaxzoo.models.generate`` (temperature 0 = greedy; sampling
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

    Returns a string for a string prompt or one conversation, else a list of strings.
    """
    if not isinstance(model, GPTForCausalLM):
        raise ValueError(f"generate_text needs a causal LM (GPTForCausalLM); got {type(model).__name__}")
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
    ids, mask = pad_batch(rows, pad_id=config.pad_token_id or 0, left=True)
    tokens = np.asarray(generate(model, ids, max_new_tokens, attention_mask=mask, temperature=temperature,
                                 top_k=top_k, top_p=top_p, eos_token_id=eos, rng=rng, seed=seed))
    texts = []
    for row in tokens[:, ids.shape[1]:].tolist():
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
def _check_truncation(max_length: int, strategy: str, head_tokens: int) -> None:
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
    _check_truncation(max_length, strategy, head_tokens)
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


def encode_for_classification(tokenizer: tokenizers.Tokenizer, texts: Sequence[str], *, max_length: int,
                              truncation: str = "head", head_tokens: int = 0) -> list[list[int]]:
    """Token ids of each text with the tokenizer's special tokens, cut by :func:`truncate_ids`.

    The tokenizer's own truncation and padding are ignored (a copy is used; ``tokenizer`` is unchanged): its
    truncation would cut the tail that ``"head_tail"`` keeps. ValueError naming the index of an empty or
    whitespace-only text.
    """
    texts = list(texts)
    blank = [i for i, text in enumerate(texts) if not isinstance(text, str) or not text.strip()]
    if blank:
        raise ValueError(f"text(s) at index {blank} are empty, whitespace-only or not strings: expected text to "
                         "classify")
    _check_truncation(max_length, truncation, head_tokens)
    plain = plain_tokenizer(tokenizer)
    return [truncate_ids(e.ids, max_length, strategy=truncation, head_tokens=head_tokens)
            for e in plain.encode_batch(texts, add_special_tokens=True)]


@partial(jax.jit, static_argnames=("graphdef",))
def _class_probabilities(graphdef: nnx.GraphDef, state: nnx.State, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """Softmax over a classifier's logits: ``[batch, seq]`` → ``[batch, num_labels]`` float32."""
    return jax.nn.softmax(nnx.merge(graphdef, state)(ids, mask).astype(jnp.float32), axis=-1)


class Classifier:
    """A ``BertForSequenceClassification`` ready to serve: an eval-mode split of the model and a copy of the
    tokenizer without its own truncation or padding, made once; calling it is :func:`classify` (``classify`` builds
    one per call: keep one of these to classify many small batches)."""

    def __init__(self, model: nnx.Module, tokenizer: tokenizers.Tokenizer, *, batch_size: int = 64,
                 max_length: int | None = None, truncation: str = "head", head_tokens: int = 0):
        if not isinstance(model, BertForSequenceClassification):
            raise ValueError(f"classify needs a sequence classifier (BertForSequenceClassification); got "
                             f"{type(model).__name__}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: expected a positive integer")
        config = model.config
        max_length = resolve_max_length(config, tokenizer, max_length, minimum=3)
        _check_truncation(max_length, truncation, head_tokens)
        self.config, self.batch_size, self.max_length = config, batch_size, max_length
        self.truncation, self.head_tokens = truncation, head_tokens
        self.tokenizer = plain_tokenizer(tokenizer)
        self.check_inputs = model.backbone.check_inputs
        self.graphdef, self.state = eval_split(model)

    def __call__(self, texts: str | Sequence[str]) -> tuple[list, np.ndarray]:
        config = self.config
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            return [], np.zeros((0, config.num_labels), np.float32)
        rows = encode_for_classification(self.tokenizer, texts, max_length=self.max_length,
                                         truncation=self.truncation, head_tokens=self.head_tokens)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))  # similar lengths share a batch: less padding
        probs = np.zeros((len(rows), config.num_labels), np.float32)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            # rows padded to a power of two (at most batch_size): a short last batch compiles no new program
            ids, mask = pad_batch([rows[i] for i in chunk], pad_id=config.pad_token_id or 0, limit=self.max_length,
                                  num_rows=min(self.batch_size, 1 << (len(chunk) - 1).bit_length()))
            self.check_inputs(ids, mask)  # ids in range: before compiling
            probs[chunk] = np.asarray(_class_probabilities(self.graphdef, self.state, ids, mask))[:len(chunk)]
        best = probs.argmax(axis=-1).tolist()
        labels = [config.label_names[i] for i in best] if config.label_names is not None else best
        return labels, probs


def classify(model: nnx.Module, tokenizer: tokenizers.Tokenizer, texts: str | Sequence[str], *, batch_size: int = 64,
             max_length: int | None = None, truncation: str = "head", head_tokens: int = 0
             ) -> tuple[list, np.ndarray]:
    """Labels and class probabilities of each text from a ``BertForSequenceClassification`` (eval mode: no dropout).

    Texts are encoded by :func:`encode_for_classification` (``max_length`` default: :func:`resolve_max_length`, the
    same rule as :func:`embed`: the tokenizer's truncation length, at most the model's positions, else the
    positions; the tokenizer's own truncation mechanism is not used, so ``truncation="head_tail"`` can keep the
    tail; ``truncation`` / ``head_tokens`` as :func:`truncate_ids`), batched by ``batch_size`` in order of length,
    each batch padded on the right to its longest row rounded up to a multiple of 8 and to a power-of-two number of
    rows (one compiled program per such shape). To classify many small batches, build a :class:`Classifier` once
    and call it.

    Returns ``(labels, probabilities [len(texts), num_labels] float32)``: a label is ``config.label_names[i]`` of the
    most probable class ``i`` when the config has names, else ``i``. A single string gives one-element results.
    """
    return Classifier(model, tokenizer, batch_size=batch_size, max_length=max_length, truncation=truncation,
                      head_tokens=head_tokens)(texts)
