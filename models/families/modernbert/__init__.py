"""ModernBERT: ``model.py`` (its block, with no attention norm on the first layer, and its head classes) and
``hf.py`` (Hugging Face ``modernbert`` names and config)."""

from flaxzoo.models.families.modernbert.hf import FAMILY
from flaxzoo.models.families.modernbert.model import (ModernBertBlock, ModernBertForMaskedLM,
                                                      ModernBertForQuestionAnswering,
                                                      ModernBertForSequenceClassification,
                                                      ModernBertForTokenClassification, ModernBertModel)

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {18: FAMILY}

__all__ = ["RECORDS", "FAMILY", "ModernBertBlock", "ModernBertForMaskedLM", "ModernBertForQuestionAnswering",
           "ModernBertForSequenceClassification", "ModernBertForTokenClassification", "ModernBertModel"]
