"""DistilBERT (Sanh et al., 2019): Hugging Face ``distilbert`` names and config ↔ the flaxzoo BERT classes.

DistilBERT is BERT's post-LN encoder with learned positions and no token-type embeddings (``type_vocab_size=0``:
a ``token_type_ids`` input is refused), its LayerNorms at eps 1e-12 whatever the config says, and its own names:

* embeddings ``distilbert.embeddings.{word_embeddings, position_embeddings, LayerNorm}``; layer ``i``
  ``distilbert.transformer.layer.{i}.attention.{q_lin, k_lin, v_lin, out_lin}``, ``sa_layer_norm``,
  ``ffn.{lin1, lin2}``, ``output_layer_norm``;
* ``DistilBertForMaskedLM``'s ``vocab_transform``, ``vocab_layer_norm``, ``vocab_projector`` ↔ ``transform``,
  ``transform_norm``, ``decoder`` (the head applies the config's ``activation``, as flaxzoo's; the projector's
  weight is the word embeddings when tied, its bias the vocabulary bias);
* ``DistilBertForSequenceClassification``'s ``pre_classifier`` ↔ the pooler with ``pooler_activation="relu"``
  (``relu(pre_classifier(h[:, 0]))``), ``classifier`` ↔ ``classifier``;
* ``DistilBertForTokenClassification``'s ``classifier`` and ``DistilBertForQuestionAnswering``'s ``qa_outputs``
  under their own names; ``DistilBertModel`` has no pooler.

Config names: ``dim``, ``n_layers``, ``n_heads``, ``hidden_dim``, ``activation``, ``dropout``,
``attention_dropout``. flaxzoo keeps one residual dropout rate: ``seq_classif_dropout`` and ``qa_dropout`` are read
and not kept (dropout only acts in training), and written as ``dropout``. ``sinusoidal_pos_embds=true`` is refused:
transformers stores that sinusoid as the position table's weights and initialises it as a sinusoid when absent;
flaxzoo would read it as a trainable learned table and write it back as ``sinusoidal_pos_embds=false``.
``tie_weights_`` (old config.json files) must agree with ``tie_word_embeddings`` (transformers reads only the
latter); it is written equal to it.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from flaxzoo.models.architectures.encoder.hf import (ENCODER_LAYOUT, classifier_head, encoder_architectures,
                                                     pooler_head, qa_head, weight_map)
from flaxzoo.models.architectures.encoder.model import BertForMaskedLM, BertForSequenceClassification, encoder_factory
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import BACKBONE, Entry, Family, WeightMap, entry, layout, linear, norm
from flaxzoo.models.families.fields import ACTIVATIONS_TO_HF, activation, common_from_hf, full_width_heads, refuse

NORM_EPS = 1e-12  # Hugging Face's DistilBERT LayerNorms: fixed, not a config field
DISTILBERT_LAYOUT = ENCODER_LAYOUT | dict(type_vocab_size=0, position_offset=0, norm_eps=NORM_EPS,
                                          pooler_activation="relu")
from flaxzoo.models.families.distilbert.presets import PRESETS


def distilbert_entries(config: TransformerConfig, base: str) -> list[Entry]:
    """Embeddings and layers: Hugging Face ``{base}embeddings`` / ``{base}transformer.layer.{i}`` ↔ flaxzoo
    ``backbone``."""
    h, enc = config.num_heads, BACKBONE
    entries = [
        entry(f"{base}embeddings.word_embeddings.weight", f"{enc}.embeddings.tokens.embedding"),
        entry(f"{base}embeddings.position_embeddings.weight", f"{enc}.embeddings.positions.embedding"),
        *norm(f"{base}embeddings.LayerNorm", f"{enc}.embeddings.norm"),
    ]
    for i in range(config.num_layers):
        hf, fz = f"{base}transformer.layer.{i}", f"{enc}.layers.{i}"
        for hf_name, name in (("q_lin", "query"), ("k_lin", "key"), ("v_lin", "value")):
            entries += linear(f"{hf}.attention.{hf_name}", f"{fz}.attention.{name}", True,
                              layout("(h k) d", "d h k", h=h), layout("(h k)", "h k", h=h))
        entries += [
            *linear(f"{hf}.attention.out_lin", f"{fz}.attention.out", True, layout("d (h k)", "h k d", h=h)),
            *norm(f"{hf}.sa_layer_norm", f"{fz}.attention_norm"),
            *linear(f"{hf}.ffn.lin1", f"{fz}.mlp.up", True),
            *linear(f"{hf}.ffn.lin2", f"{fz}.mlp.down", True),
            *norm(f"{hf}.output_layer_norm", f"{fz}.mlp_norm"),
        ]
    return entries


def distilbert_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls`` (``base``: ``"distilbert."``, or ``""`` for a bare ``DistilBertModel`` checkpoint); the
    other DistilBERT heads' tensors are skipped on load."""
    entries = distilbert_entries(config, base)
    ignored = [rf"{re.escape(base)}embeddings\.position_ids"]
    tied: dict[str, str] = {}
    entries += [*pooler_head(cls, ignored, "pre_classifier", (BertForSequenceClassification,)),
                *classifier_head(cls, ignored), *qa_head(cls, ignored)]
    if cls is BertForMaskedLM:
        entries += [*linear("vocab_transform", "transform", True), *norm("vocab_layer_norm", "transform_norm")]
        if config.tie_word_embeddings:
            entries.append(entry("vocab_projector.bias", "decoder.bias"))
            tied = {"vocab_projector.weight": f"{base}embeddings.word_embeddings.weight"}
        else:
            entries += linear("vocab_projector", "decoder", True)
    else:
        ignored.append(r"vocab_(transform|layer_norm|projector)\.(weight|bias)")
    return weight_map(entries, ignored, tied)


def distilbert_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """A ``distilbert`` config.json → ``TransformerConfig``; ValueError naming a value flaxzoo cannot represent."""
    hf = {"pad_token_id": 0} | dict(hf)
    refuse(hf, "sinusoidal_pos_embds", [False], False)
    tie = hf.get("tie_word_embeddings", True)
    if "tie_weights_" in hf and hf["tie_weights_"] != tie:
        raise ValueError(f"config.json: tie_weights_={hf['tie_weights_']!r} with tie_word_embeddings={tie!r}: "
                         "expected them equal (transformers ties by tie_word_embeddings alone)")
    return TransformerConfig(
        vocab_size=hf.get("vocab_size", 30522), hidden_size=hf.get("dim", 768), num_layers=hf.get("n_layers", 6),
        num_heads=hf.get("n_heads", 12), intermediate_size=hf.get("hidden_dim", 3072),
        max_position_embeddings=hf.get("max_position_embeddings", 512), model_type="distilbert",
        activation=activation(hf, "activation", "gelu"), tie_word_embeddings=tie,
        dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("attention_dropout", 0.1),
        **DISTILBERT_LAYOUT, **common_from_hf({"vocab_size": 30522} | hf))


def distilbert_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The DistilBERT fields of ``config.json``; the heads' dropout rates are the residual one (flaxzoo's)."""
    return {
        "vocab_size": config.vocab_size, "dim": config.hidden_size, "n_layers": config.num_layers,
        "n_heads": config.num_heads, "hidden_dim": config.intermediate_size,
        "activation": ACTIVATIONS_TO_HF[config.activation], "dropout": config.dropout,
        "attention_dropout": config.attention_dropout, "seq_classif_dropout": config.dropout,
        "qa_dropout": config.dropout, "max_position_embeddings": config.max_position_embeddings,
        "sinusoidal_pos_embds": False, "tie_weights_": config.tie_word_embeddings,
    }


FAMILY = Family(
    model_type="distilbert", base_prefix="distilbert",
    architectures=encoder_architectures("DistilBert"),
    config_from_hf=distilbert_config_from_hf, config_to_hf=distilbert_config_to_hf, weights=distilbert_weights,
    layout=DISTILBERT_LAYOUT, save_problems=lambda config: full_width_heads(config, "distilbert"),
    factory=encoder_factory, presets=PRESETS)
