"""XLM-RoBERTa: Hugging Face ``xlm-roberta`` ↔ the encoder architecture's classes, through RoBERTa's table and config.

Hugging Face's XLM-RoBERTa classes are RoBERTa's, renamed: the same tensor names under the same ``roberta.`` prefix
(``lm_head.*``, ``classifier.dense`` / ``classifier.out_proj``, ``qa_outputs``), the same ``config.json`` fields and
positions offset by ``pad_token_id + 1``. Only the ``model_type`` and the class names differ, so the record is
RoBERTa's with those replaced (``hf.py`` beside this file documents the table).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from flaxzoo.models.architectures.encoder.hf import encoder_architectures
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.roberta.hf import FAMILY as ROBERTA, roberta_config_from_hf
from flaxzoo.models.families.roberta.presets import PRESETS

MODEL_TYPE = "xlm-roberta"


def xlm_roberta_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """RoBERTa's translation (``position_offset = pad_token_id + 1``) under ``model_type="xlm-roberta"``."""
    return roberta_config_from_hf(hf).replace(model_type=MODEL_TYPE)


XLM_ROBERTA = dataclasses.replace(
    ROBERTA, model_type=MODEL_TYPE,
    architectures=encoder_architectures("XLMRoberta"),
    config_from_hf=xlm_roberta_config_from_hf, presets=PRESETS)
