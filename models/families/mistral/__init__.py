"""mistral: see ``hf.py``."""

from flaxzoo.models.families.mistral.hf import FAMILY

__all__ = ["FAMILY"]
