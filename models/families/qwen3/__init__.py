"""qwen3: see ``hf.py``."""

from flaxzoo.models.families.qwen3.hf import FAMILY

__all__ = ["FAMILY"]
