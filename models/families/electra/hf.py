"""ELECTRA (Clark et al., 2020): Hugging Face ``electra`` names and config ↔ flaxzoo's BERT classes and
``ElectraForPreTraining``.

ELECTRA is BERT's encoder (the same layer names, under ``electra.``) with no pooler and, when ``embedding_size`` !=
``hidden_size`` (the generators, electra-small), factorised embeddings: ``embeddings_project`` ↔
``backbone.embeddings.project`` (``config.embedding_size``). Heads:

* ``ElectraForPreTraining`` (the discriminator): ``discriminator_predictions.{dense, dense_prediction}`` ↔
  ``discriminator``, ``prediction``;
* ``ElectraForMaskedLM`` (the generator): ``generator_predictions.{dense, LayerNorm}`` ↔ ``transform`` (hidden →
  embedding_size), ``transform_norm``; ``generator_lm_head`` (tied to the token table, its own bias) ↔ ``decoder``.
  Its activation is always exact GELU, as flaxzoo's is the config's: other activations are refused;
* ``ElectraForSequenceClassification``'s ``classifier.dense`` ↔ ``pooler``, ``classifier.out_proj`` ↔ ``classifier``:
  ``out_proj(gelu(dense(h[:, 0])))`` is the pooler with ``pooler_activation="gelu"`` then the classifier (its extra
  dropout before ``dense`` only acts in training);
* ``ElectraForTokenClassification``'s ``classifier``, ``ElectraForQuestionAnswering``'s ``qa_outputs``.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, Collection, Mapping

from flax import nnx

from flaxzoo.models.architectures.encoder.hf import (ENCODER_LAYOUT, classifier_head, encoder_architectures,
                                                     encoder_config_from_hf, encoder_config_to_hf, encoder_entries,
                                                     encoder_save_problems, qa_head, weight_map)
from flaxzoo.models.architectures.encoder.model import BertForMaskedLM, BertModel
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import BACKBONE, Entry, Family, LINEAR, ParamPath, WeightMap, entry, linear, norm
from flaxzoo.models.families.electra.model import ElectraForPreTraining
from flaxzoo.models.families.electra.presets import PRESETS

ELECTRA_LAYOUT = {k: v for k, v in ENCODER_LAYOUT.items() if k != "embedding_size"} | dict(
    position_offset=0, pooler_activation="gelu")


def generator_head(config: TransformerConfig, base: str) -> tuple[list[Entry], dict[str, str]]:
    """``ElectraForMaskedLM``'s head: (entries, tied names). Tied, ``generator_lm_head.weight`` is the token table
    and only its bias is stored."""
    if config.activation != "gelu":
        raise ValueError(f"activation={config.activation!r}: Hugging Face's ElectraForMaskedLM head always applies "
                         "exact GELU, flaxzoo's the config's activation; expected 'gelu'")
    entries = [*linear("generator_predictions.dense", "transform", True),
               *norm("generator_predictions.LayerNorm", "transform_norm")]
    if config.tie_word_embeddings:
        return (entries + [entry("generator_lm_head.bias", "decoder.bias")],
                {"generator_lm_head.weight": f"{base}embeddings.word_embeddings.weight"})
    return entries + [entry("generator_lm_head.weight", "decoder.kernel", LINEAR),
                      entry("generator_lm_head.bias", "decoder.bias")], {}


def electra_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls`` (``base``: ``"electra."``, or ``""`` for a bare ``ElectraModel`` checkpoint); the other
    ELECTRA heads' tensors are skipped on load."""
    entries = encoder_entries(config, base)
    if config.embedding_size is not None:
        entries += linear(f"{base}embeddings_project", f"{BACKBONE}.embeddings.project", True)
    ignored = [rf"{re.escape(base)}embeddings\.(position_ids|token_type_ids)"]
    tied: dict[str, str] = {}
    if cls is ElectraForPreTraining:
        entries += [*linear("discriminator_predictions.dense", "discriminator", True),
                    *linear("discriminator_predictions.dense_prediction", "prediction", True)]
    else:
        ignored.append(r"discriminator_predictions\..*")
    entries += [*classifier_head(cls, ignored, two_layer=True), *qa_head(cls, ignored)]
    if cls is BertForMaskedLM:
        head, tied = generator_head(config, base)
        entries += head
    else:
        ignored.append(r"generator_(predictions|lm_head)\..*")
    return weight_map(entries, ignored, tied)


def electra_factory(cls: type, params: Collection[ParamPath]) -> Callable[..., nnx.Module]:
    """``ElectraModel`` has no pooler: a ``BertModel`` is built without one."""
    return functools.partial(BertModel, add_pooler=False) if cls is BertModel else cls


def electra_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """ELECTRA's ``config.json``: ``embedding_size`` (None when it equals ``hidden_size``: no projection), the
    classification head's GELU as ``pooler_activation``."""
    hf = {"pad_token_id": 0, "embedding_size": 128} | dict(hf)
    width = hf["embedding_size"]
    return encoder_config_from_hf(hf, "electra", embedding_size=None if width == hf["hidden_size"] else width,
                                  pooler_activation="gelu")


def electra_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The encoder fields and the embedding width (``hidden_size`` for unfactorised embeddings)."""
    return encoder_config_to_hf(config) | {"embedding_size": config.embedding_width, "summary_activation": "gelu"}


def electra_save_problems(config: TransformerConfig) -> list[str]:
    """Full-width heads, token types, and a projection only between different widths (Hugging Face's rule)."""
    problems = encoder_save_problems(config, "electra")
    if config.embedding_size == config.hidden_size:
        problems.append(f"embedding_size={config.embedding_size} == hidden_size (Hugging Face electra has no "
                        "projection then: set embedding_size=None)")
    return problems


FAMILY = Family(
    model_type="electra", base_prefix="electra",
    architectures={"ElectraModel": BertModel, "ElectraForPreTraining": ElectraForPreTraining,
                   **{name: cls for name, cls in encoder_architectures("Electra").items() if cls is not BertModel}},
    config_from_hf=electra_config_from_hf, config_to_hf=electra_config_to_hf, weights=electra_weights,
    layout=ELECTRA_LAYOUT, save_problems=electra_save_problems, factory=electra_factory, presets=PRESETS)
