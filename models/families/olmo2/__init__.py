"""olmo2: see ``hf.py``."""

from flaxzoo.models.families.olmo2.hf import FAMILY

__all__ = ["FAMILY"]
