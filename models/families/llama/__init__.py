"""Llama: the decoder architecture's classes (``architectures/decoder/model.py``) under Hugging Face ``llama`` names
(``hf.py``), and llama.cpp's GGUF files (``gguf.py``)."""

from flaxzoo.models.families.llama.hf import FAMILY

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {3: FAMILY}

__all__ = ["RECORDS", "FAMILY"]
