"""qwen2: see ``hf.py``."""

from flaxzoo.models.families.qwen2.hf import FAMILY

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {4: FAMILY}

__all__ = ["RECORDS", "FAMILY"]
