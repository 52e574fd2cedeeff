"""gpt_neox: see ``hf.py``."""

from flaxzoo.models.families.gpt_neox.hf import FAMILY

__all__ = ["FAMILY"]
