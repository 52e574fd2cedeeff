"""The encoder architecture: the bidirectional stack and its heads (``model.py``) and what the BERT-layout families
share in Hugging Face's files (``hf.py``)."""

from flaxzoo.models.architectures.encoder.model import (BertForMaskedLM, BertForQuestionAnswering,
                                                        BertForSequenceClassification, BertForTokenClassification,
                                                        BertModel, EncoderOutput, SpanLogits)

__all__ = ["BertForMaskedLM", "BertForQuestionAnswering", "BertForSequenceClassification",
           "BertForTokenClassification", "BertModel", "EncoderOutput", "SpanLogits"]
