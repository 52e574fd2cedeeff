"""ELECTRA: BERT's classes and the replaced-token-detection head ``ElectraForPreTraining`` (``model.py``), under
Hugging Face ``electra`` names (``hf.py``)."""

from flaxzoo.models.families.electra.hf import FAMILY
from flaxzoo.models.families.electra.model import ElectraForPreTraining

__all__ = ["FAMILY", "ElectraForPreTraining"]
