"""BERT: Hugging Face ``bert`` names and config ↔ flaxzoo ``BertModel`` / ``BertForMaskedLM`` /
``BertForSequenceClassification`` / ``BertForTokenClassification`` / ``BertForQuestionAnswering`` (the encoder
architecture's classes, :mod:`flaxzoo.models.architectures.encoder`).
"""

from __future__ import annotations

import re

from flaxzoo.models.architectures.encoder.hf import (ENCODER_LAYOUT, classifier_head, encoder_architectures,
                                                     encoder_config_from_hf, encoder_config_to_hf, encoder_entries,
                                                     encoder_save_problems, masked_lm_head, pooler_head, qa_head,
                                                     tf_layernorm_names, weight_map)
from flaxzoo.models.architectures.encoder.model import BertForSequenceClassification, BertModel, encoder_factory
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family, WeightMap
from flaxzoo.models.families.bert.presets import PRESETS


def bert_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls``. ``base`` is the Hugging Face prefix of the encoder (``"bert."``, or ``""`` for a bare
    ``BertModel`` checkpoint). Tensors of the other BERT heads (and of pre-training's next-sentence head) are
    skipped on load, as transformers skips them."""
    ignored = [rf"{re.escape(base)}embeddings\.position_ids", r"cls\.seq_relationship\.(weight|bias)"]
    entries = [*encoder_entries(config, base),
               *pooler_head(cls, ignored, f"{base}pooler.dense", (BertModel, BertForSequenceClassification)),
               *classifier_head(cls, ignored), *qa_head(cls, ignored)]
    head, tied, unused = masked_lm_head(config, cls, base, ignored, r"cls\.predictions\..*",
                                        dense="cls.predictions.transform.dense",
                                        layer_norm="cls.predictions.transform.LayerNorm",
                                        decoder="cls.predictions.decoder", bias="cls.predictions.bias")
    return weight_map(entries + head, ignored, tied, unused)


FAMILY = Family(
    model_type="bert", base_prefix="bert",
    architectures=encoder_architectures("Bert"),
    config_from_hf=lambda hf: encoder_config_from_hf({"pad_token_id": 0} | dict(hf), "bert"),
    config_to_hf=encoder_config_to_hf, weights=bert_weights, layout=ENCODER_LAYOUT | {"position_offset": 0},
    save_problems=lambda config: encoder_save_problems(config, "bert"),
    factory=encoder_factory, rename=tf_layernorm_names, presets=PRESETS)
