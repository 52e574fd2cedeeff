"""BERT: Hugging Face ``bert`` names and config (``hf.py``) on the encoder architecture's classes
(:mod:`flaxzoo.models.architectures.encoder`)."""

from flaxzoo.models.families.bert.hf import FAMILY

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {0: FAMILY}

__all__ = ["RECORDS", "FAMILY"]
