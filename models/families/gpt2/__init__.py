"""GPT-2: ``model.py`` (the decoder classes, which Llama reuses) and ``hf.py`` (Hugging Face ``gpt2`` names and
config)."""

from flaxzoo.models.families.gpt2.hf import FAMILY
from flaxzoo.models.families.gpt2.model import GPTForCausalLM, GPTModel

__all__ = ["FAMILY", "GPTForCausalLM", "GPTModel"]
