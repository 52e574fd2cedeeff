"""mistral: see ``hf.py``."""

from flaxzoo.models.families.mistral.hf import FAMILY

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {6: FAMILY}

__all__ = ["RECORDS", "FAMILY"]
