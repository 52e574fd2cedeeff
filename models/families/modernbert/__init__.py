"""ModernBERT: ``model.py`` (its block, with no attention norm on the first layer, and its head classes) and
``hf.py`` (Hugging Face ``modernbert`` names and config)."""

from flaxzoo.models.families.modernbert.hf import FAMILY
from flaxzoo.models.families.modernbert.model import (ModernBertBlock, ModernBertForMaskedLM,
                                                      ModernBertForQuestionAnswering,
                                                      ModernBertForSequenceClassification,
                                                      ModernBertForTokenClassification, ModernBertModel)

__all__ = ["FAMILY", "ModernBertBlock", "ModernBertForMaskedLM", "ModernBertForQuestionAnswering",
           "ModernBertForSequenceClassification", "ModernBertForTokenClassification", "ModernBertModel"]
