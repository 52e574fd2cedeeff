"""Llama: the decoder architecture's classes (``architectures/decoder/model.py``) under Hugging Face ``llama`` names
(``hf.py``), and llama.cpp's GGUF files (``gguf.py``)."""

from flaxzoo.models.families.llama.hf import FAMILY

__all__ = ["FAMILY"]
