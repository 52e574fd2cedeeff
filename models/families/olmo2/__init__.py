"""olmo2: see ``hf.py``."""

from flaxzoo.models.families.olmo2.hf import FAMILY

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {9: FAMILY}

__all__ = ["RECORDS", "FAMILY"]
