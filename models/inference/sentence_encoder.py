"""Sentence embeddings from an encoder, as sentence-transformers computes them: ``embed`` and ``SentenceEncoder`` (the
model, tokenizer and sentence-transformers' settings set up once). Tokenizing, truncation and padding are
:mod:`flaxzoo.models.inference.text`'s (the same for ``classify``); the pooling and the settings' files are
:mod:`flaxzoo.models.inference.sentence`'s.
"""

from __future__ import annotations

import dataclasses
import os
from functools import partial
from typing import Sequence

import jax
import numpy as np
import tokenizers
from flax import nnx

from flaxzoo.models.inference.generate import eval_split
from flaxzoo.models.layers.stack import TransformerStack
from flaxzoo.models.inference.sentence import SentenceConfig, pool, read_sentence_config
from flaxzoo.models.inference.text import encode_texts, lowercasing_tokenizer, pad_batch, resolve_max_length, truncating_tokenizer

__all__ = ["SentenceEncoder", "embed"]


def _stack(model: nnx.Module) -> nnx.Module:
    """The ``TransformerStack`` of a flaxzoo model."""
    if isinstance(getattr(model, "backbone", None), TransformerStack):  # every flaxzoo class keeps it there
        return model.backbone
    raise ValueError(f"embed needs a flaxzoo encoder or decoder; got {type(model).__name__}")


@partial(jax.jit, static_argnames=("graphdef", "modes"))
def _pooled(graphdef: nnx.GraphDef, state: nnx.State, ids: jax.Array, mask: jax.Array,
            modes: tuple[str, ...]) -> jax.Array:
    """The stack's hidden states pooled over real tokens (:func:`flaxzoo.models.inference.sentence.pool`): ``[batch, seq]`` →
    ``[batch, len(modes) * hidden]`` float32."""
    return pool(_stack(nnx.merge(graphdef, state))(ids, mask).hidden, mask, modes)


class SentenceEncoder:
    """An encoder, its tokenizer and sentence-transformers' settings (:class:`flaxzoo.models.inference.sentence.SentenceConfig`:
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
        sentence-transformers settings (:func:`flaxzoo.models.inference.sentence.read_sentence_config`; a folder without
        ``modules.json``: the defaults) of ``path``: a local directory, a packaged name or a Hub id."""
        from flaxzoo.models.io import from_pretrained, resolve_pretrained
        from flaxzoo.models.io.tokenizer import load_tokenizer

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
    (:mod:`flaxzoo.models.inference.sentence`): ``model`` a path, packaged name or Hub id (the model, its tokenizer when
    ``tokenizer`` is None, and its sentence-transformers files are read: :meth:`SentenceEncoder.from_pretrained`),
    a :class:`SentenceEncoder`, or ``sentence_config`` a :class:`~flaxzoo.models.inference.sentence.SentenceConfig` or the
    folder / Hub id to read one from (a folder without ``modules.json`` gives the defaults above).

    ``pooling`` (a mode or a list, see ``flaxzoo.models.inference.sentence.POOLING_MODES``), ``normalize`` and
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
            from flaxzoo.models.io import resolve_pretrained

            _stack(model)  # a flaxzoo model: checked before any file is read
            config = read_sentence_config(resolve_pretrained(config), hidden_size=model.config.hidden_size)
    if tokenizer is None:
        raise ValueError("embed needs a tokenizer (models.load_tokenizer) for a model object")
    config = SentenceConfig() if config is None else config
    if pooling is not None:
        config = dataclasses.replace(config, pooling=pooling)
    return SentenceEncoder(model, tokenizer, config, max_length=max_length)(texts, batch_size=batch_size,
                                                                            normalize=normalize)
