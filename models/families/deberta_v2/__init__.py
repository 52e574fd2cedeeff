"""DeBERTa-v2 / v3 (``model_type`` ``"deberta-v2"``): the encoder architecture's classes
(``architectures/encoder/model.py``) with disentangled relative attention (``models/layers/relative_attention.py``),
under Hugging Face's ``deberta`` names (``hf.py``)."""

from flaxzoo.models.families.deberta_v2.hf import FAMILY

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {17: FAMILY}

__all__ = ["RECORDS", "FAMILY"]
