"""phi3: see ``hf.py``."""

from flaxzoo.models.families.phi3.hf import FAMILY

__all__ = ["FAMILY"]
