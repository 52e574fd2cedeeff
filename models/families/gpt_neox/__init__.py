"""gpt_neox: see ``hf.py``."""

from flaxzoo.models.families.gpt_neox.hf import FAMILY

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {8: FAMILY}

__all__ = ["RECORDS", "FAMILY"]
