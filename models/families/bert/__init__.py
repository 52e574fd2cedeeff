"""BERT: ``model.py`` (the encoder classes, which RoBERTa reuses) and ``hf.py`` (Hugging Face ``bert`` names and
config)."""

from flaxzoo.models.families.bert.hf import FAMILY
from flaxzoo.models.families.bert.model import (BertForMaskedLM, BertForQuestionAnswering,
                                                BertForSequenceClassification,
                                                BertForTokenClassification, BertModel, EncoderOutput, SpanLogits)

__all__ = ["FAMILY", "BertForMaskedLM", "BertForQuestionAnswering", "BertForSequenceClassification",
           "BertForTokenClassification", "BertModel", "EncoderOutput", "SpanLogits"]
