"""BERT: ``model.py`` (the encoder classes, which RoBERTa reuses) and ``hf.py`` (Hugging Face ``bert`` names and
config)."""

from flaxzoo.models.families.bert.hf import FAMILY
from flaxzoo.models.families.bert.model import (BertForMaskedLM, BertForSequenceClassification,
                                                BertForTokenClassification, BertModel, EncoderOutput)

__all__ = ["FAMILY", "BertForMaskedLM", "BertForSequenceClassification", "BertForTokenClassification", "BertModel",
           "EncoderOutput"]
