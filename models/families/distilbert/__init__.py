"""DistilBERT: BERT's classes (``families/bert/model.py``) under Hugging Face ``distilbert`` names (``hf.py``)."""

from flaxzoo.models.families.distilbert.hf import FAMILY

__all__ = ["FAMILY"]
