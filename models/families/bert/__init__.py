"""BERT: Hugging Face ``bert`` names and config (``hf.py``) on the encoder architecture's classes
(:mod:`flaxzoo.models.architectures.encoder`)."""

from flaxzoo.models.families.bert.hf import FAMILY

__all__ = ["FAMILY"]
