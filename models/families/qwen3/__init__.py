"""qwen3: see ``hf.py``."""

from flaxzoo.models.families.qwen3.hf import FAMILY

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {5: FAMILY}

__all__ = ["RECORDS", "FAMILY"]
