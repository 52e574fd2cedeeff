"""T5 (v1.0, v1.1, Flan-T5): the encoder-decoder architecture's classes (``architectures/encoder_decoder``) under
Hugging Face ``t5`` names (``hf.py``)."""

from flaxzoo.models.families.t5.hf import FAMILY

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {19: FAMILY}

__all__ = ["RECORDS", "FAMILY"]
