"""RoBERTa: Hugging Face ``roberta`` names and config ↔ the flaxzoo BERT classes.

RoBERTa is BERT's encoder (same layer names, under ``roberta.``) with positions offset by ``pad_token_id + 1``
(``config.position_offset``; pad tokens take position ``pad_token_id``) and its own heads:

* ``RobertaForMaskedLM``'s ``lm_head.{dense, layer_norm, decoder, bias}`` ↔ ``transform``, ``transform_norm``,
  ``decoder`` (its head always applies exact GELU);
* ``RobertaForSequenceClassification``'s ``classifier.dense`` ↔ the pooler, ``classifier.out_proj`` ↔ ``classifier``
  (the same ``tanh(dense(h[:, 0]))`` then a linear layer; Hugging Face's classifier model has no pooler of its own);
* ``RobertaForTokenClassification``'s ``classifier`` ↔ ``classifier``;
* ``RobertaForQuestionAnswering``'s ``qa_outputs`` ↔ ``qa_outputs``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from flaxzoo.models.architectures.encoder.hf import (ENCODER_LAYOUT, classifier_head, encoder_architectures,
                                                     encoder_config_from_hf, encoder_config_to_hf, encoder_entries,
                                                     encoder_save_problems, masked_lm_head, pooler_head, qa_head,
                                                     tf_layernorm_names, weight_map)
from flaxzoo.models.architectures.encoder.model import BertForMaskedLM, BertModel, encoder_factory
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family, WeightMap


def roberta_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls`` (``base``: ``"roberta."``, or ``""`` for a bare ``RobertaModel`` checkpoint); the other
    RoBERTa heads' tensors are skipped on load."""
    entries = encoder_entries(config, base)
    ignored = [rf"{re.escape(base)}embeddings\.position_ids"]
    # pre-training checkpoints (roberta-base) hold a pooler no head class reads
    entries += [*pooler_head(cls, ignored, f"{base}pooler.dense", (BertModel,)),
                *classifier_head(cls, ignored, two_layer=True), *qa_head(cls, ignored)]
    if cls is BertForMaskedLM and config.activation != "gelu":
        raise ValueError(f"activation={config.activation!r}: Hugging Face's RobertaForMaskedLM head always "
                         "applies exact GELU, flaxzoo's the config's activation; expected 'gelu'")
    head, tied, unused = masked_lm_head(config, cls, base, ignored, r"lm_head\..*", dense="lm_head.dense",
                                        layer_norm="lm_head.layer_norm", decoder="lm_head.decoder",
                                        bias="lm_head.bias")
    return weight_map(entries + head, ignored, tied, unused)


def roberta_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """``position_offset = pad_token_id + 1``; ValueError without a ``pad_token_id`` (RoBERTa's positions need it)."""
    hf = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2} | dict(hf)
    pad = hf["pad_token_id"]
    if not isinstance(pad, int) or isinstance(pad, bool) or pad < 0:
        raise ValueError(f"config.json: pad_token_id={pad!r}: expected a token id >= 0 (RoBERTa's positions start "
                         "at pad_token_id + 1)")
    return encoder_config_from_hf(hf, "roberta", position_offset=pad + 1)


def roberta_save_problems(config: TransformerConfig) -> list[str]:
    """Full-width heads, token types, and positions offset by ``pad_token_id + 1`` (what Hugging Face derives)."""
    problems = encoder_save_problems(config, "roberta")
    if config.pad_token_id is None or config.position_offset != config.pad_token_id + 1:
        problems.append(f"position_offset={config.position_offset} with pad_token_id={config.pad_token_id} "
                        "(Hugging Face roberta needs position_offset = pad_token_id + 1)")
    return problems


FAMILY = Family(
    model_type="roberta", base_prefix="roberta",
    architectures=encoder_architectures("Roberta"),
    config_from_hf=roberta_config_from_hf, config_to_hf=encoder_config_to_hf, weights=roberta_weights,
    layout=ENCODER_LAYOUT, save_problems=roberta_save_problems, factory=encoder_factory,
    rename=tf_layernorm_names)
