"""DistilBERT: the encoder architecture's classes (``architectures/encoder/model.py``) under Hugging Face ``distilbert``
names (``hf.py``)."""

from flaxzoo.models.families.distilbert.hf import FAMILY

__all__ = ["FAMILY"]
