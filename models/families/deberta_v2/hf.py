"""DeBERTa-v2 / v3: Hugging Face ``deberta-v2`` names and config ↔ the flaxzoo BERT classes.

DeBERTa is BERT's post-LN encoder with disentangled relative attention (``config.relative_attention``: the table
``deberta.encoder.rel_embeddings`` and its ``LayerNorm`` ↔ ``backbone.relative``; each layer's ``pos_key_proj`` /
``pos_query_proj`` ↔ ``attention.pos_key`` / ``pos_query``). v3 checkpoints have no absolute positions
(``position_biased_input=false`` ↔ ``position="none"``) and no token types (``type_vocab_size=0``). Heads:

* ``DebertaV2Model`` ↔ ``BertModel`` without a pooler (Hugging Face's base model has none);
* ``DebertaV2ForMaskedLM``'s ``cls.predictions.{transform.dense, transform.LayerNorm, bias}`` (the ``legacy`` head,
  transformers' default; the decoder is tied to the word embeddings) ↔ ``transform``, ``transform_norm``,
  ``decoder``. The ``legacy=false`` head, ``lm_predictions.lm_head.{dense, LayerNorm, bias}``, is the same
  computation: its tensors are read under the legacy names, and flaxzoo writes the legacy head;
* ``DebertaV2ForSequenceClassification``'s ``ContextPooler`` ``pooler.dense`` (``pooler_hidden_act`` on
  ``dense(h[:, 0])``: ``config.pooler_activation``) ↔ ``pooler``, ``classifier`` ↔ ``classifier``;
* ``DebertaV2ForTokenClassification``'s ``classifier``; ``DebertaV2ForQuestionAnswering``'s ``qa_outputs``.

Refused (ValueError naming the field): ``conv_kernel_size`` (v2-xlarge's ConvLayer after the first layer),
``embedding_size`` / ``pooler_hidden_size`` / ``attention_head_size`` other than the hidden size's, and
``norm_rel_ebd`` other than ``"none"`` / ``"layer_norm"``.

Not reproduced: transformers multiplies the embeddings of padding tokens by 0 and lets padding queries attend to
nothing (uniform weights). Neither reaches a real token (no real query attends to a padding key), so outputs at real
tokens are Hugging Face's; outputs at padding positions differ.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from flaxzoo.models.architectures.encoder.hf import (classifier_head, encoder_architectures, masked_lm_head,
                                                     pooler_head, qa_head, weight_map)
from flaxzoo.models.architectures.encoder.model import BertForSequenceClassification, encoder_factory
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import BACKBONE, Entry, Family, WeightMap, entry, layout, linear, norm
from flaxzoo.models.families.fields import ACTIVATIONS_TO_HF, activation, common_from_hf, full_width_heads, refuse

DEBERTA_LAYOUT = dict(causal=False, norm="layernorm", norm_placement="post", embedding_norm=True, final_norm=False,
                      mlp_gated=False, attention_bias=True, mlp_bias=True, position_offset=0)
from flaxzoo.models.families.deberta_v2.presets import PRESETS
NORM_REL_EBD = {"none": False, "layer_norm": True}


def deberta_entries(config: TransformerConfig, base: str) -> list[Entry]:
    """Embeddings, the relative table and the layers: Hugging Face ``{base}embeddings`` / ``{base}encoder`` ↔
    flaxzoo ``backbone``."""
    h, enc = config.num_heads, BACKBONE
    entries = [entry(f"{base}embeddings.word_embeddings.weight", f"{enc}.embeddings.tokens.embedding"),
               *norm(f"{base}embeddings.LayerNorm", f"{enc}.embeddings.norm")]
    if config.position == "learned":
        entries.append(entry(f"{base}embeddings.position_embeddings.weight", f"{enc}.embeddings.positions.embedding"))
    if config.type_vocab_size:
        entries.append(entry(f"{base}embeddings.token_type_embeddings.weight", f"{enc}.embeddings.token_types"))
    if config.relative_attention:
        entries.append(entry(f"{base}encoder.rel_embeddings.weight", f"{enc}.relative.embedding"))
        if config.relative_embedding_norm:
            entries += norm(f"{base}encoder.LayerNorm", f"{enc}.relative.norm")
    heads = (layout("(h k) d", "d h k", h=h), layout("(h k)", "h k", h=h))
    for i in range(config.num_layers):
        hf, fz = f"{base}encoder.layer.{i}", f"{enc}.layers.{i}"
        for name, ours in (("query_proj", "query"), ("key_proj", "key"), ("value_proj", "value")):
            entries += linear(f"{hf}.attention.self.{name}", f"{fz}.attention.{ours}", True, *heads)
        if config.relative_attention and not config.share_att_key:
            if "c2p" in config.relative_attention_types:
                entries += linear(f"{hf}.attention.self.pos_key_proj", f"{fz}.attention.pos_key", True, *heads)
            if "p2c" in config.relative_attention_types:
                entries += linear(f"{hf}.attention.self.pos_query_proj", f"{fz}.attention.pos_query", True, *heads)
        entries += [
            *linear(f"{hf}.attention.output.dense", f"{fz}.attention.out", True, layout("d (h k)", "h k d", h=h)),
            *norm(f"{hf}.attention.output.LayerNorm", f"{fz}.attention_norm"),
            *linear(f"{hf}.intermediate.dense", f"{fz}.mlp.up", True),
            *linear(f"{hf}.output.dense", f"{fz}.mlp.down", True),
            *norm(f"{hf}.output.LayerNorm", f"{fz}.mlp_norm"),
        ]
    return entries


def deberta_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls`` (``base``: ``"deberta."``, or ``""`` for a bare ``DebertaV2Model`` checkpoint); the
    other heads' tensors, a v3 checkpoint's unused absolute positions and its pre-training ``mask_predictions`` head
    are skipped on load."""
    entries = deberta_entries(config, base)
    ignored = [rf"{re.escape(base)}embeddings\.position_ids", r"mask_predictions\..*"]
    if config.position != "learned":
        ignored.append(rf"{re.escape(base)}embeddings\.position_embeddings\.weight")
    entries += [*pooler_head(cls, ignored, "pooler.dense", (BertForSequenceClassification,)),
                *classifier_head(cls, ignored), *qa_head(cls, ignored)]
    head, tied, unused = masked_lm_head(config, cls, base, ignored, r"(cls\.predictions|lm_predictions)\..*",
                                        dense="cls.predictions.transform.dense",
                                        layer_norm="cls.predictions.transform.LayerNorm",
                                        decoder="cls.predictions.decoder", bias="cls.predictions.bias")
    return weight_map(entries + head, ignored, tied, unused)


LM_PREDICTIONS = (("lm_predictions.lm_head.dense.", "cls.predictions.transform.dense."),
                  ("lm_predictions.lm_head.LayerNorm.", "cls.predictions.transform.LayerNorm."),
                  ("lm_predictions.lm_head.bias", "cls.predictions.bias"))


def legacy_head_names(name: str) -> str:
    """The ``legacy=false`` MLM head's tensor names → the legacy head's (the same computation)."""
    for new, old in LM_PREDICTIONS:
        if name.startswith(new):
            return old + name[len(new):]
    return name


def _same_as_hidden(hf: Mapping[str, Any], field: str, expected: int, what: str) -> None:
    value = hf.get(field)
    if value is not None and value != expected:
        raise ValueError(f"config.json: {field}={value!r} is not supported by flaxzoo (supported: {expected}, "
                         f"{what})")


def _relative_types(hf: Mapping[str, Any]) -> tuple[str, ...]:
    types = hf.get("pos_att_type") or []
    if isinstance(types, str):
        types = [t.strip() for t in types.lower().split("|") if t.strip()]
    if any(t not in ("c2p", "p2c") for t in types) or len(set(types)) != len(types):
        raise ValueError(f"config.json: pos_att_type={hf.get('pos_att_type')!r} is not supported by flaxzoo "
                         "(supported: distinct entries of ['c2p', 'p2c'])")
    return tuple(types)


def deberta_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """The flaxzoo config of a ``deberta-v2`` ``config.json`` (ValueError for what flaxzoo cannot run: see the
    module docstring)."""
    hf = {"pad_token_id": 0} | dict(hf)
    conv = hf.get("conv_kernel_size") or 0
    if conv:
        raise ValueError(f"config.json: conv_kernel_size={conv!r} is not supported by flaxzoo (supported: 0; the "
                         "ConvLayer of DeBERTa-v2-xlarge / xxlarge is not implemented)")
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    _same_as_hidden(hf, "embedding_size", hidden, "the hidden_size: no embed_proj")
    _same_as_hidden(hf, "pooler_hidden_size", hidden, "the hidden_size")
    if heads and hidden % heads == 0:
        _same_as_hidden(hf, "attention_head_size", hidden // heads, "hidden_size / num_attention_heads")
    norm_rel = [x.strip() for x in str(hf.get("norm_rel_ebd", "none")).lower().split("|")]
    if any(x not in NORM_REL_EBD for x in norm_rel):
        raise ValueError(f"config.json: norm_rel_ebd={hf.get('norm_rel_ebd')!r} is not supported by flaxzoo "
                         f"(supported: {list(NORM_REL_EBD)})")
    relative = bool(hf.get("relative_attention", False))
    types = _relative_types(hf)
    if types and not relative:
        raise ValueError(f"config.json: pos_att_type={list(types)!r} with relative_attention=false is not supported "
                         "by flaxzoo (supported: pos_att_type empty without relative attention)")
    buckets = hf.get("position_buckets", -1)
    max_relative = hf.get("max_relative_positions", -1)
    pooler_act = hf.get("pooler_hidden_act", "gelu")
    refuse(hf, "position_biased_input", [True, False], True)
    values = dict(
        vocab_size=hf["vocab_size"], hidden_size=hidden, num_layers=hf["num_hidden_layers"], num_heads=heads,
        intermediate_size=hf["intermediate_size"], max_position_embeddings=hf.get("max_position_embeddings", 512),
        model_type="deberta-v2", norm_eps=hf.get("layer_norm_eps", 1e-7),
        activation=activation(hf, "hidden_act", "gelu"),
        pooler_activation="tanh" if pooler_act == "tanh" else activation(hf, "pooler_hidden_act", "gelu"),
        tie_word_embeddings=hf.get("tie_word_embeddings", True), type_vocab_size=hf.get("type_vocab_size", 0),
        dropout=hf.get("hidden_dropout_prob", 0.1), attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        position="learned" if hf.get("position_biased_input", True) else "none",
        relative_attention=relative, **DEBERTA_LAYOUT, **common_from_hf(hf))
    if relative:
        values |= dict(relative_attention_types=types, share_att_key=bool(hf.get("share_att_key", False)),
                       position_buckets=buckets if buckets and buckets > 0 else None,
                       max_relative_positions=max_relative if max_relative and max_relative >= 1 else None,
                       relative_embedding_norm="layer_norm" in norm_rel)
    return TransformerConfig(**values)


def deberta_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The ``deberta-v2`` fields of ``config.json`` (the legacy MLM head; no ConvLayer)."""
    return {
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "intermediate_size": config.intermediate_size,
        "hidden_act": ACTIVATIONS_TO_HF[config.activation], "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_position_embeddings, "type_vocab_size": config.type_vocab_size,
        "layer_norm_eps": config.norm_eps, "position_biased_input": config.position == "learned",
        "relative_attention": config.relative_attention, "pos_att_type": list(config.relative_attention_types),
        "share_att_key": config.share_att_key,
        "position_buckets": config.position_buckets if config.position_buckets is not None else -1,
        "max_relative_positions": config.max_relative_positions if config.max_relative_positions is not None else -1,
        "norm_rel_ebd": "layer_norm" if config.relative_embedding_norm else "none",
        "pooler_hidden_size": config.hidden_size, "pooler_dropout": 0.0,
        "pooler_hidden_act": "tanh" if config.pooler_activation == "tanh" else
        ACTIVATIONS_TO_HF[config.pooler_activation],
        "legacy": True, "conv_kernel_size": 0,
    }


def deberta_save_problems(config: TransformerConfig) -> list[str]:
    """Full-width heads, and absolute positions learned or none."""
    problems = full_width_heads(config, "deberta-v2")
    if config.position not in ("learned", "none"):
        problems.append(f"position={config.position!r} (Hugging Face deberta-v2 has learned absolute positions or "
                        "none: 'learned' / 'none')")
    return problems


FAMILY = Family(
    model_type="deberta-v2", base_prefix="deberta",
    architectures=encoder_architectures("DebertaV2"),
    config_from_hf=deberta_config_from_hf, config_to_hf=deberta_config_to_hf, weights=deberta_weights,
    layout=DEBERTA_LAYOUT, save_problems=deberta_save_problems, factory=encoder_factory,
    rename=legacy_head_names, presets=PRESETS)
