"""ALBERT: the encoder architecture's classes (``architectures/encoder/model.py``) with factorised embeddings and one
block shared by every layer (``config.embedding_size``, ``config.shared_layers``), under Hugging Face ``albert``
names (``hf.py``)."""

from flaxzoo.models.families.albert.hf import FAMILY

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {13: FAMILY}

__all__ = ["RECORDS", "FAMILY"]
