"""DistilBERT: the encoder architecture's classes (``architectures/encoder/model.py``) under Hugging Face ``distilbert``
names (``hf.py``)."""

from flaxzoo.models.families.distilbert.hf import FAMILY

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {15: FAMILY}

__all__ = ["RECORDS", "FAMILY"]
