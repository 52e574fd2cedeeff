"""``config.json`` fields every family reads or writes the same way: activations, special-token ids, labels, and the
refusal of values flaxzoo cannot represent."""

from __future__ import annotations

import warnings
from typing import Any, Mapping, Sequence

from flaxzoo.models.config import TransformerConfig

ACTIVATIONS_FROM_HF = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                       "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}
ACTIVATIONS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}
SPECIAL_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")


def activation(hf: Mapping[str, Any], field: str, default: str) -> str:
    """flaxzoo's name for the activation ``config.json`` sets in ``field``; ValueError for one it lacks."""
    name = hf.get(field, default)
    if name not in ACTIVATIONS_FROM_HF:
        raise ValueError(f"config.json: {field}={name!r} is not supported; expected one of "
                         f"{sorted(ACTIVATIONS_FROM_HF)}")
    return ACTIVATIONS_FROM_HF[name]


def refuse(hf: Mapping[str, Any], field: str, allowed: Sequence[Any], default: Any) -> None:
    """ValueError naming ``field`` when config.json sets it to a value flaxzoo cannot represent."""
    value = hf.get(field, default)
    if value not in allowed:
        raise ValueError(f"config.json: {field}={value!r} is not supported by flaxzoo (supported: {list(allowed)})")


def num_labels(hf: Mapping[str, Any]) -> int:
    """The number of labels: ``id2label``'s length, else ``num_labels`` (default 2)."""
    if hf.get("id2label"):
        return len(hf["id2label"])
    return int(hf.get("num_labels", 2))


def label_names(hf: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The class names of ``id2label`` ordered by id, or None when they are all Hugging Face's defaults
    (``LABEL_i``) or there is no ``id2label``.

    Names flaxzoo cannot keep (ids other than ``0 .. n-1``, repeated or empty names) only matter to reading the
    predictions, and transformers loads such a checkpoint: they are dropped with a warning naming the value.
    """
    id2label = hf.get("id2label")
    if not id2label:
        return None
    try:
        by_id = {int(i): name for i, name in id2label.items()}
    except (TypeError, ValueError, AttributeError):
        by_id = {}
    names = tuple(by_id.get(i) for i in range(len(id2label)))
    if names == tuple(f"LABEL_{i}" for i in range(len(names))):
        return None
    usable = all(isinstance(n, str) and n.strip() for n in names) and len(set(names)) == len(names)
    if not usable:
        warnings.warn(f"config.json: id2label={id2label!r}: expected ids 0..{len(id2label) - 1} with distinct "
                      "non-empty names; the label names are dropped (predictions are label ids)", stacklevel=4)
        return None
    return names


def labels_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """``id2label`` / ``label2id`` for ``config.json``: ``config.label_names``, else Hugging Face's ``LABEL_i``."""
    names = config.label_names or tuple(f"LABEL_{i}" for i in range(config.num_labels))
    return {"id2label": {str(i): name for i, name in enumerate(names)},
            "label2id": {name: i for i, name in enumerate(names)}}


def special_ids(hf: Mapping[str, Any], vocab_size: int) -> dict[str, Any]:
    """``pad_token_id`` / ``bos_token_id`` / ``eos_token_id`` (a list of EOS ids kept as a tuple).

    An id outside ``[0, vocab_size)`` (``GPT2Config(vocab_size=1000)`` keeps the default 50256) only matters to
    generation, and transformers loads such a checkpoint: it is dropped with a warning naming the field and the id.
    ValueError for a value that is no id at all.
    """
    out: dict[str, Any] = {}
    for field in SPECIAL_IDS:
        value = hf.get(field)
        several = field == "eos_token_id" and isinstance(value, (list, tuple))
        ids = list(value) if several else [] if value is None else [value]
        if any(not isinstance(i, int) or isinstance(i, bool) for i in ids) or (
                not several and isinstance(value, (list, tuple))):
            expected = "a token id, a list of ids or null" if field == "eos_token_id" else "a token id or null"
            raise ValueError(f"config.json: {field}={value!r}: expected {expected}")
        kept = [i for i in ids if 0 <= i < vocab_size]
        dropped = [i for i in ids if i not in kept]
        if dropped:
            warnings.warn(f"config.json: {field}={value!r}: id(s) {dropped} outside the vocabulary [0, {vocab_size}) "
                          f"dropped (only generation uses them); keeping {field}="
                          f"{_one_or_several(kept)!r}", stacklevel=4)
        out[field] = tuple(kept) if several and len(kept) > 1 else (kept[0] if kept else None)
    return out


def _one_or_several(ids: Sequence[int]) -> int | list[int] | None:
    return None if not ids else ids[0] if len(ids) == 1 else list(ids)


def common_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The ``TransformerConfig`` fields every family reads alike: labels, initialiser range, special ids."""
    return dict(num_labels=num_labels(hf), label_names=label_names(hf),
                initializer_range=hf.get("initializer_range", 0.02),
                **special_ids(hf, hf["vocab_size"]))


def common_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The ``config.json`` fields every family writes alike (an int for one EOS id, a list for several)."""
    return {"initializer_range": config.initializer_range, "tie_word_embeddings": config.tie_word_embeddings,
            "pad_token_id": config.pad_token_id, "bos_token_id": config.bos_token_id,
            "eos_token_id": _one_or_several(config.eos_token_ids)}


def full_width_heads(config: TransformerConfig, model_type: str) -> list[str]:
    """What a Hugging Face class with ``num_heads`` heads of ``hidden_size / num_heads`` features cannot express."""
    problems = []
    if config.num_kv_heads != config.num_heads:
        problems.append(f"num_kv_heads={config.num_kv_heads} (Hugging Face {model_type} needs num_kv_heads == "
                        f"num_heads = {config.num_heads})")
    if config.head_dim * config.num_heads != config.hidden_size:
        problems.append(f"head_dim={config.head_dim} (Hugging Face {model_type} needs hidden_size / num_heads = "
                        f"{config.hidden_size / config.num_heads:g})")
    return problems
