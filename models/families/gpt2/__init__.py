"""GPT-2: Hugging Face ``gpt2`` names and config (``hf.py``) on the decoder architecture's classes
(:mod:`flaxzoo.models.architectures.decoder`)."""

from flaxzoo.models.families.gpt2.hf import FAMILY

__all__ = ["FAMILY"]
