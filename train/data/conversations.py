"""Conversations as training rows for supervised fine-tuning: rendered with the model's chat template, tokenised
once, and each token marked when it is the assistant's (the tokens the loss is taken on).

Where the assistant's text is, found one of two ways (``EncodedConversation.spans_from`` says which):

* ``"generation markers"``: the template's ``{% generation %}`` blocks, where it has them, found as transformers'
  ``apply_chat_template(..., return_assistant_tokens_mask=True)`` and TRL's ``SFTTrainer(assistant_only_loss=True)``
  find them (:meth:`flaxzoo.models.io.chat.ChatTemplate.render_with_generation_spans`);
* ``"rendered turns"``: for a template without them (most checkpoints' own, SmolLM2's among them), assistant message
  ``i``'s text is what rendering ``messages[:i + 1]`` adds to rendering ``messages[:i]`` with the generation prompt:
  TRL's prompt-completion split (the completion is what follows the prompt rendered for generation), applied to
  every assistant turn. Its end-of-turn marker is in it (the model learns to stop); the header that opens the turn
  is not. Each such prefix must render as the start of the whole conversation, or the spans would not be the
  assistant's; a template that renders earlier turns differently once later ones follow (one that drops the
  reasoning of earlier replies, say) is refused, naming the turn.

A token is the assistant's when its characters overlap an assistant span (transformers' rule: a token that straddles
a span's edge counts). A training example predicts each next token and scores the prediction when the predicted
token is the assistant's (TRL's labels, which the model shifts); several examples share a row with segment ids
(:func:`pack_examples`), attending only within their own conversation, positions restarting.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Sequence

import numpy as np

from flaxzoo.models.io.chat import ChatTemplate, ChatTemplateError
from flaxzoo.train.batches import IGNORE_INDEX
from flaxzoo.train.data.rows import next_fit

GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")
SPANS_FROM = ("generation markers", "rendered turns")
TOO_LONG = ("truncate", "drop")  # what becomes of a conversation longer than a row


@dataclasses.dataclass(frozen=True)
class EncodedConversation:
    """One conversation as a training row.

    ``ids``: ``int32 [tokens]``, the rendered text's tokens (no special tokens added beyond the template's own);
    ``assistant_mask``: ``bool [tokens]``, True on the assistant's tokens; ``text``: the rendered conversation;
    ``spans``: the assistant's ``[start, end)`` character spans in it; ``spans_from``: one of :data:`SPANS_FROM`.
    """

    ids: np.ndarray
    assistant_mask: np.ndarray
    text: str
    spans: tuple[tuple[int, int], ...]
    spans_from: str


def has_generation_markers(template: ChatTemplate, template_name: str | None = None, *,
                           tools: Sequence[Mapping[str, Any]] | None = None) -> bool:
    """True when the template :meth:`ChatTemplate.select` picks holds a ``{% generation %}`` block."""
    return GENERATION_MARKER.search(template.select(template_name, tools=tools)) is not None


def assistant_spans(template: ChatTemplate, messages: Sequence[Mapping[str, Any]], *,
                    tools: Sequence[Mapping[str, Any]] | None = None, template_name: str | None = None,
                    **extra: Any) -> tuple[str, list[tuple[int, int]], str]:
    """``(text, spans, spans_from)``: the conversation rendered as training text, the assistant's character spans in
    it and how they were found (see the module docstring).

    Raises ChatTemplateError for a conversation without an assistant message, one that starts with the assistant
    (no prompt to split it from, without generation markers), or a template whose renderings of the turns before an
    assistant message are not the start of the whole conversation's.
    """
    options = dict(tools=tools, template_name=template_name, **extra)
    text, spans = template.render_with_generation_spans(messages, **options)
    if has_generation_markers(template, template_name, tools=tools):
        if not spans:
            raise ChatTemplateError(f"the chat template ({template.origin}) marked no assistant text in a conversation "
                                    f"of roles {[m.get('role') for m in messages]}: it needs an assistant message")
        return text, spans, SPANS_FROM[0]
    turns = [i for i, message in enumerate(messages) if message.get("role") == "assistant"]
    if not turns:
        raise ChatTemplateError(f"a conversation of roles {[m.get('role') for m in messages]} has no assistant "
                                "message: nothing to train on")
    if turns[0] == 0:
        raise ChatTemplateError("message 0 is the assistant's: without {% generation %} markers in the chat template "
                                "an assistant turn is found as what follows the turns before it, and there are none")
    found = []
    for i in turns:
        prompt = template.render(messages[:i], add_generation_prompt=True, **options)
        through = template.render(messages[:i + 1], add_generation_prompt=False, **options)
        if not (through.startswith(prompt) and text.startswith(through)):
            raise ChatTemplateError(
                f"the chat template ({template.origin}) renders the conversation before assistant message {i} "
                "differently once later turns follow, so that turn's text cannot be found: use a template with "
                "{% generation %} markers around the assistant's text")
        found.append((len(prompt), len(through)))
    return text, found, SPANS_FROM[1]


def tokens_in_spans(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """``bool [tokens]``: True where a token's ``[start, end)`` characters overlap one of ``spans``."""
    if not len(offsets) or not len(spans):
        return np.zeros(len(offsets), bool)
    token = np.asarray(offsets, np.int64).reshape(-1, 2)
    span = np.asarray(spans, np.int64).reshape(-1, 2)
    return ((token[:, None, 0] < span[None, :, 1]) & (token[:, None, 1] > span[None, :, 0])).any(axis=1)


def encode_conversation(template: ChatTemplate, tokenizer: Any, messages: Sequence[Mapping[str, Any]], *,
                        tools: Sequence[Mapping[str, Any]] | None = None, template_name: str | None = None,
                        **extra: Any) -> EncodedConversation:
    """``messages`` rendered by ``template`` as training text, tokenised by ``tokenizer`` (a ``tokenizers.Tokenizer``;
    the template writes the special tokens, none are added) and its assistant tokens marked (module docstring)."""
    text, spans, spans_from = assistant_spans(template, messages, tools=tools, template_name=template_name, **extra)
    encoding = tokenizer.encode(text, add_special_tokens=False)
    return EncodedConversation(ids=np.asarray(encoding.ids, np.int32),
                               assistant_mask=tokens_in_spans(encoding.offsets, spans), text=text,
                               spans=tuple(spans), spans_from=spans_from)


@dataclasses.dataclass(frozen=True)
class Example:
    """One conversation's next-token pairs: ``inputs`` ``int32 [n]`` (its tokens but the last) and ``targets``
    ``int32 [n]`` (the next token where it is the assistant's, else ``IGNORE_INDEX``)."""

    inputs: np.ndarray
    targets: np.ndarray


def training_example(encoded: EncodedConversation) -> Example:
    """:class:`Example` of an encoded conversation."""
    targets = np.where(encoded.assistant_mask[1:], encoded.ids[1:], IGNORE_INDEX).astype(np.int32)
    return Example(inputs=encoded.ids[:-1].astype(np.int32), targets=targets)


def fit_examples(examples: Sequence[Example], seq_len: int, too_long: str) -> tuple[list[Example], dict[str, int]]:
    """``(kept, counts)``: examples longer than ``seq_len`` cut to their first ``seq_len`` tokens (``"truncate"``)
    or left out (``"drop"``); an example left with no scored target (its replies all past the cut) is left out too.
    ``counts``: ``{"truncated", "dropped", "kept"}``, for the caller to report."""
    if too_long not in TOO_LONG:
        raise ValueError(f"too_long={too_long!r}: expected one of {TOO_LONG}")
    if seq_len < 2:
        raise ValueError(f"seq_len={seq_len}: a row needs at least 2 tokens")
    kept, counts = [], {"truncated": 0, "dropped": 0, "kept": 0}
    for example in examples:
        if len(example.inputs) > seq_len:
            if too_long == "drop":
                counts["dropped"] += 1
                continue
            example = Example(example.inputs[:seq_len], example.targets[:seq_len])
            counts["truncated"] += 1
        if not (example.targets != IGNORE_INDEX).any():
            counts["dropped"] += 1
            continue
        kept.append(example)
    counts["kept"] = len(kept)
    return kept, counts


def pack_examples(examples: Sequence[Example], seq_len: int) -> list[list[Example]]:
    """Examples (each at most ``seq_len`` long: :func:`fit_examples`) into rows in their order (next-fit)."""
    too_long = [i for i, example in enumerate(examples) if len(example.inputs) > seq_len]
    if too_long:
        raise ValueError(f"examples {too_long[:5]} are longer than seq_len={seq_len}: fit_examples cuts or drops them")
    return [[examples[i] for i in row] for row in next_fit([(len(e.inputs),) for e in examples], (seq_len,))]


def packed_batch(rows: Sequence[Sequence[Example]], seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """Rows of examples as a causal LM batch (``flaxzoo.train.batches.CAUSAL_KEYS``): ``input_ids``, ``targets``
    and ``segment_ids`` ``int32 [rows, seq_len]``, the examples of a row numbered from 1 (0: padding, never
    scored)."""
    count = len(rows)
    batch = {"input_ids": np.full((count, seq_len), pad_id, np.int32),
             "targets": np.full((count, seq_len), IGNORE_INDEX, np.int32),
             "segment_ids": np.zeros((count, seq_len), np.int32)}
    for r, row in enumerate(rows):
        at = 0
        for number, example in enumerate(row, 1):
            end = at + len(example.inputs)
            if end > seq_len:
                raise ValueError(f"row {r} holds {end} tokens, more than seq_len={seq_len}")
            batch["input_ids"][r, at:end] = example.inputs
            batch["targets"][r, at:end] = example.targets
            batch["segment_ids"][r, at:end] = number
            at = end
    return batch
