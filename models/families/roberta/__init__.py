"""RoBERTa: BERT's classes (``families/bert/model.py``) under Hugging Face ``roberta`` names (``hf.py``)."""

from flaxzoo.models.families.roberta.hf import FAMILY

__all__ = ["FAMILY"]
