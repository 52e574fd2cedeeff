"""Labels and class probabilities from a sequence classifier: ``classify`` and ``Classifier`` (the model and its
tokenizer set up once), and ``encode_for_classification`` (the fine-tuners' encoding too). Truncation and padding are
:mod:`flaxzoo.models.inference.text`'s.
"""

from __future__ import annotations

from functools import partial
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tokenizers
from flax import nnx

from flaxzoo.models.architectures.encoder import BertForSequenceClassification
from flaxzoo.models.inference.generate import eval_split
from flaxzoo.models.inference.text import check_truncation, pad_batch, plain_tokenizer, resolve_max_length, truncate_ids

__all__ = ["Classifier", "classify", "encode_for_classification"]


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
    check_truncation(max_length, truncation, head_tokens)
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
        check_truncation(max_length, truncation, head_tokens)
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
