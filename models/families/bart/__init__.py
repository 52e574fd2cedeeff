"""BART: the encoder-decoder architecture's classes (``architectures/encoder_decoder``) under Hugging Face ``bart``
names (``hf.py``)."""

from flaxzoo.models.families.bart.hf import FAMILY

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {22: FAMILY}

__all__ = ["RECORDS", "FAMILY"]
