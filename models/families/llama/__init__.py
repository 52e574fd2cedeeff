"""Llama: GPT-2's classes (``families/gpt2/model.py``) under Hugging Face ``llama`` names (``hf.py``), and llama.cpp's
GGUF files (``gguf.py``)."""

from flaxzoo.models.families.llama.hf import FAMILY

__all__ = ["FAMILY"]
