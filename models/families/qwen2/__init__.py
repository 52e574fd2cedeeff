"""qwen2: see ``hf.py``."""

from flaxzoo.models.families.qwen2.hf import FAMILY

__all__ = ["FAMILY"]
