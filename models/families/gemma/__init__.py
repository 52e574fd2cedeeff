"""gemma, gemma2, gemma3_text: see ``hf.py`` (one folder for the Gemma line: the three records share their layout,
defaults and checks, and differ only in the fields ``hf.py`` lists per generation)."""

from flaxzoo.models.families.gemma.hf import GEMMA, GEMMA2, GEMMA3

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {10: GEMMA, 11: GEMMA2, 12: GEMMA3}

__all__ = ["RECORDS", "GEMMA", "GEMMA2", "GEMMA3"]
