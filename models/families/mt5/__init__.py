"""mT5: the encoder-decoder architecture's classes (``architectures/encoder_decoder``) under Hugging Face
``mt5`` names (``hf.py``)."""

from flaxzoo.models.families.mt5.hf import FAMILY

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {20: FAMILY}

__all__ = ["RECORDS", "FAMILY"]
