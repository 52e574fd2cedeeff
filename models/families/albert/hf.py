"""ALBERT (Lan et al., 2020): Hugging Face ``albert`` names and config ↔ the flaxzoo BERT classes.

ALBERT is BERT's post-LN encoder with two mechanisms, both in ``models/layers``: factorised embeddings (tables
``embedding_size`` wide, then ``encoder.embedding_hidden_mapping_in`` ↔ ``backbone.embeddings.project``) and one
block shared by all layers (``albert_layer_groups.0.albert_layers.0`` ↔ ``backbone.shared_layer``). Every published
ALBERT has one hidden group of one inner layer; other groupings are refused. Heads:

* ``AlbertModel``'s ``pooler`` (tanh) ↔ ``pooler``; ``AlbertForSequenceClassification``: that pooler then
  ``classifier``;
* ``AlbertForMaskedLM``'s ``predictions.{dense, LayerNorm, decoder, bias}`` ↔ ``transform`` (hidden →
  embedding_size), ``transform_norm``, ``decoder`` (tied to the token table);
* ``AlbertForTokenClassification``'s ``classifier``, ``AlbertForQuestionAnswering``'s ``qa_outputs``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from flaxzoo.models.architectures.encoder.hf import (ENCODER_LAYOUT, classifier_head, encoder_architectures,
                                                     encoder_config_from_hf, encoder_config_to_hf,
                                                     encoder_save_problems, masked_lm_head, pooler_head, qa_head,
                                                     weight_map)
from flaxzoo.models.architectures.encoder.model import BertForSequenceClassification, BertModel, encoder_factory
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.albert.presets import PRESETS
from flaxzoo.models.families.base import BACKBONE, Entry, Family, WeightMap, entry, layout, linear, norm
from flaxzoo.models.families.fields import refuse

ALBERT_LAYOUT = {k: v for k, v in ENCODER_LAYOUT.items() if k != "embedding_size"} | dict(
    position_offset=0, shared_layers=True)
SHARED = f"{BACKBONE}.shared_layer"


def albert_entries(config: TransformerConfig, base: str) -> list[Entry]:
    """Embeddings, the projection to ``hidden_size`` and the one shared layer (Hugging Face ``{base}embeddings``,
    ``{base}encoder``) ↔ flaxzoo ``backbone``."""
    h, emb, hf = config.num_heads, f"{BACKBONE}.embeddings", f"{base}encoder.albert_layer_groups.0.albert_layers.0"
    entries = [
        entry(f"{base}embeddings.word_embeddings.weight", f"{emb}.tokens.embedding"),
        entry(f"{base}embeddings.position_embeddings.weight", f"{emb}.positions.embedding"),
        entry(f"{base}embeddings.token_type_embeddings.weight", f"{emb}.token_types"),
        *norm(f"{base}embeddings.LayerNorm", f"{emb}.norm"),
        *linear(f"{base}encoder.embedding_hidden_mapping_in", f"{emb}.project", True),
    ]
    for name in ("query", "key", "value"):
        entries += linear(f"{hf}.attention.{name}", f"{SHARED}.attention.{name}", True,
                          layout("(h k) d", "d h k", h=h), layout("(h k)", "h k", h=h))
    return entries + [
        *linear(f"{hf}.attention.dense", f"{SHARED}.attention.out", True, layout("d (h k)", "h k d", h=h)),
        *norm(f"{hf}.attention.LayerNorm", f"{SHARED}.attention_norm"),
        *linear(f"{hf}.ffn", f"{SHARED}.mlp.up", True),
        *linear(f"{hf}.ffn_output", f"{SHARED}.mlp.down", True),
        *norm(f"{hf}.full_layer_layer_norm", f"{SHARED}.mlp_norm"),
    ]


def albert_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls`` (``base``: ``"albert."``, or ``""`` for a bare ``AlbertModel`` checkpoint); the other
    ALBERT heads' tensors (and pre-training's sentence-order head) are skipped on load."""
    ignored = [rf"{re.escape(base)}embeddings\.(position_ids|token_type_ids)", r"sop_classifier\..*"]
    entries = [*albert_entries(config, base),
               *pooler_head(cls, ignored, f"{base}pooler", (BertModel, BertForSequenceClassification)),
               *classifier_head(cls, ignored), *qa_head(cls, ignored)]
    head, tied, unused = masked_lm_head(config, cls, base, ignored, r"predictions\..*", dense="predictions.dense",
                                        layer_norm="predictions.LayerNorm", decoder="predictions.decoder",
                                        bias="predictions.bias")
    return weight_map(entries + head, ignored, tied, unused)


def albert_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """ALBERT's ``config.json`` (its defaults: ``gelu_new``, no dropout, ``embedding_size`` 128); ValueError for
    ``num_hidden_groups`` or ``inner_group_num`` other than 1."""
    hf = {"pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3, "hidden_act": "gelu_new",
          "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "embedding_size": 128} | dict(hf)
    refuse(hf, "num_hidden_groups", [1], 1)
    refuse(hf, "inner_group_num", [1], 1)
    return encoder_config_from_hf(hf, "albert", embedding_size=hf["embedding_size"], shared_layers=True)


def albert_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The encoder fields, the embedding width, one group of one layer, and the classifier's dropout (flaxzoo's
    classifiers apply ``dropout``)."""
    return encoder_config_to_hf(config) | {"embedding_size": config.embedding_width, "num_hidden_groups": 1,
                                           "inner_group_num": 1, "classifier_dropout_prob": config.dropout}


def albert_save_problems(config: TransformerConfig) -> list[str]:
    """Full-width heads, token types, and the embedding projection Hugging Face's ALBERT always has."""
    problems = encoder_save_problems(config, "albert")
    if config.embedding_size is None:
        problems.append("embedding_size=None (Hugging Face albert always projects its embeddings: set "
                        "embedding_size, e.g. 128)")
    return problems


FAMILY = Family(
    model_type="albert", base_prefix="albert",
    architectures=encoder_architectures("Albert"),
    config_from_hf=albert_config_from_hf, config_to_hf=albert_config_to_hf, weights=albert_weights,
    layout=ALBERT_LAYOUT, save_problems=albert_save_problems, factory=encoder_factory, presets=PRESETS)
