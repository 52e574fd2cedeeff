"""GPT-2: Hugging Face ``gpt2`` names and config (``hf.py``) on the decoder architecture's classes
(:mod:`flaxzoo.models.architectures.decoder`)."""

from flaxzoo.models.families.gpt2.hf import FAMILY

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {2: FAMILY}

__all__ = ["RECORDS", "FAMILY"]
