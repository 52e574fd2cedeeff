"""What the BERT-layout encoder families share in Hugging Face's files (BERT, RoBERTa, XLM-RoBERTa, ALBERT, ELECTRA,
DistilBERT, DeBERTa-v2): the encoder's weight table under ``{base}embeddings`` / ``{base}encoder.layer.{i}``, the MLM
and span heads, the Hugging Face class names of :mod:`flaxzoo.models.architectures.encoder.model`'s classes, and the
encoder fields of ``config.json``. A family passes its prefix and names; the rest is this table.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from flaxzoo.models.architectures.encoder.model import (BertForMaskedLM, BertForQuestionAnswering,
                                                        BertForSequenceClassification, BertForTokenClassification,
                                                        BertModel)
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import BACKBONE, Entry, WeightMap, entry, layout, linear, norm, outside
from flaxzoo.models.families.fields import ACTIVATIONS_TO_HF, activation, common_from_hf, full_width_heads, refuse

ENCODER_LAYOUT = dict(causal=False, position="learned", norm="layernorm", norm_placement="post", embedding_norm=True,
                      final_norm=False, mlp_gated=False, attention_bias=True, mlp_bias=True, embedding_size=None,
                      shared_layers=False)


def encoder_entries(config: TransformerConfig, base: str) -> list[Entry]:
    """Embeddings and layers: Hugging Face ``{base}embeddings`` / ``{base}encoder.layer.{i}`` ↔ flaxzoo
    ``backbone``."""
    h, enc = config.num_heads, BACKBONE
    entries = [
        entry(f"{base}embeddings.word_embeddings.weight", f"{enc}.embeddings.tokens.embedding"),
        entry(f"{base}embeddings.position_embeddings.weight", f"{enc}.embeddings.positions.embedding"),
        entry(f"{base}embeddings.token_type_embeddings.weight", f"{enc}.embeddings.token_types"),
        *norm(f"{base}embeddings.LayerNorm", f"{enc}.embeddings.norm"),
    ]
    for i in range(config.num_layers):
        hf, fz = f"{base}encoder.layer.{i}", f"{enc}.layers.{i}"
        for name in ("query", "key", "value"):
            entries += linear(f"{hf}.attention.self.{name}", f"{fz}.attention.{name}", True,
                              layout("(h k) d", "d h k", h=h), layout("(h k)", "h k", h=h))
        entries += [
            *linear(f"{hf}.attention.output.dense", f"{fz}.attention.out", True, layout("d (h k)", "h k d", h=h)),
            *norm(f"{hf}.attention.output.LayerNorm", f"{fz}.attention_norm"),
            *linear(f"{hf}.intermediate.dense", f"{fz}.mlp.up", True),
            *linear(f"{hf}.output.dense", f"{fz}.mlp.down", True),
            *norm(f"{hf}.output.LayerNorm", f"{fz}.mlp_norm"),
        ]
    return entries


def mlm_head(config: TransformerConfig, base: str, *, dense: str, layer_norm: str, decoder: str, bias: str
             ) -> tuple[list[Entry], dict[str, str], dict[str, str]]:
    """The MLM head (Hugging Face names ``dense``, ``layer_norm``, ``decoder``, ``bias``) ↔ flaxzoo ``transform``,
    ``transform_norm``, ``decoder``: (entries, tied, unused). Hugging Face's decoder reads ``{decoder}.{weight,bias}``.
    Tied, they are the word embeddings and ``bias``, and only those are stored; untied, ``bias`` is a dead copy of
    ``{decoder}.bias``."""
    entries = [*linear(dense, "transform", True), *norm(layer_norm, "transform_norm")]
    if config.tie_word_embeddings:
        return (entries + [entry(bias, "decoder.bias")],
                {f"{decoder}.weight": f"{base}embeddings.word_embeddings.weight", f"{decoder}.bias": bias}, {})
    return entries + linear(decoder, "decoder", True), {}, {bias: f"{decoder}.bias"}


def encoder_architectures(prefix: str) -> dict[str, type]:
    """A family on BERT's classes: its Hugging Face classes → flaxzoo classes, the base model first:
    ``{prefix}Model``, ``{prefix}ForMaskedLM``, ``{prefix}ForSequenceClassification``,
    ``{prefix}ForTokenClassification``, ``{prefix}ForQuestionAnswering`` (``prefix``: ``"Bert"``, ``"Albert"`` ...)."""
    return {f"{prefix}Model": BertModel, f"{prefix}ForMaskedLM": BertForMaskedLM,
            f"{prefix}ForSequenceClassification": BertForSequenceClassification,
            f"{prefix}ForTokenClassification": BertForTokenClassification,
            f"{prefix}ForQuestionAnswering": BertForQuestionAnswering}


def qa_head(cls: type, ignored: list[str]) -> list[Entry]:
    """The span head ``qa_outputs`` (the same name in every encoder family) for ``BertForQuestionAnswering``; for
    other classes its tensors are added to ``ignored``."""
    if cls is BertForQuestionAnswering:
        return linear("qa_outputs", "qa_outputs", True)
    ignored.append(r"qa_outputs\.(weight|bias)")
    return []


def pooler_head(cls: type, ignored: list[str], name: str, classes: tuple[type, ...]) -> list[Entry]:
    """The pooler: Hugging Face's linear ``name`` ↔ flaxzoo ``pooler`` when ``cls`` is one of ``classes``; for other
    classes its tensors are added to ``ignored``."""
    if cls in classes:
        return linear(name, "pooler", True)
    ignored.append(rf"{re.escape(name)}\.(weight|bias)")
    return []


def classifier_head(cls: type, ignored: list[str], *, two_layer: bool = False) -> list[Entry]:
    """The classifiers' ``classifier`` ↔ ``classifier`` (sequence and token classification). ``two_layer``
    (RoBERTa, ELECTRA): the sequence head is Hugging Face's ``classifier.dense`` ↔ ``pooler`` then
    ``classifier.out_proj`` ↔ ``classifier``. For other classes ``classifier.*`` is added to ``ignored``."""
    if cls is BertForSequenceClassification and two_layer:
        return [*linear("classifier.dense", "pooler", True), *linear("classifier.out_proj", "classifier", True)]
    if cls in (BertForSequenceClassification, BertForTokenClassification):
        return linear("classifier", "classifier", True)
    ignored.append(r"classifier\..*")
    return []


def masked_lm_head(config: TransformerConfig, cls: type, base: str, ignored: list[str], skip: str, *, dense: str,
                   layer_norm: str, decoder: str, bias: str) -> tuple[list[Entry], dict[str, str], dict[str, str]]:
    """:func:`mlm_head`'s (entries, tied, unused) for ``BertForMaskedLM``; for other classes ``skip`` (a pattern
    over the head's tensors) is added to ``ignored`` and the head is empty."""
    if cls is BertForMaskedLM:
        return mlm_head(config, base, dense=dense, layer_norm=layer_norm, decoder=decoder, bias=bias)
    ignored.append(skip)
    return [], {}, {}


def weight_map(entries: list[Entry], ignored: list[str], tied: dict[str, str] | None = None,
               unused: dict[str, str] | None = None) -> WeightMap:
    """A ``WeightMap`` whose optional tensors are those outside the backbone (the pooler and the heads)."""
    return WeightMap(entries, tied or {}, unused or {}, tuple(ignored), outside(entries))


def encoder_config_from_hf(hf: Mapping[str, Any], model_type: str, **fields: Any) -> TransformerConfig:
    """The encoder config both BERT and RoBERTa read; ``fields`` adds or overrides (RoBERTa's ``position_offset``)."""
    refuse(hf, "position_embedding_type", ["absolute"], "absolute")
    refuse(hf, "is_decoder", [False], False)
    refuse(hf, "add_cross_attention", [False], False)
    values = dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf.get("max_position_embeddings", 512), model_type=model_type,
        norm_eps=hf.get("layer_norm_eps", 1e-12), activation=activation(hf, "hidden_act", "gelu"),
        tie_word_embeddings=hf.get("tie_word_embeddings", True), type_vocab_size=hf.get("type_vocab_size", 2),
        dropout=hf.get("hidden_dropout_prob", 0.1), attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        **ENCODER_LAYOUT, **common_from_hf(hf))
    return TransformerConfig(**(values | fields))


def encoder_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The encoder fields of ``config.json`` (BERT and RoBERTa). The classifier's dropout is the residual one, as
    flaxzoo's classifiers apply ``dropout``."""
    return {
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "intermediate_size": config.intermediate_size,
        "hidden_act": ACTIVATIONS_TO_HF[config.activation], "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attention_dropout, "classifier_dropout": None,
        "max_position_embeddings": config.max_position_embeddings, "type_vocab_size": config.type_vocab_size,
        "layer_norm_eps": config.norm_eps, "position_embedding_type": "absolute", "is_decoder": False,
        "add_cross_attention": False,
    }


def encoder_save_problems(config: TransformerConfig, model_type: str) -> list[str]:
    """Full-width heads and token-type embeddings, which Hugging Face's encoders always have."""
    problems = full_width_heads(config, model_type)
    if config.type_vocab_size < 1:
        problems.append(f"type_vocab_size=0 (Hugging Face {model_type} always has token-type embeddings: needs >= 1)")
    return problems


def tf_layernorm_names(name: str) -> str:
    """TF-era ``LayerNorm.gamma`` / ``LayerNorm.beta`` → ``LayerNorm.weight`` / ``LayerNorm.bias``."""
    return re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name))
