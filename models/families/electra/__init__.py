"""ELECTRA: BERT's classes and the replaced-token-detection head ``ElectraForPreTraining`` (``model.py``), under
Hugging Face ``electra`` names (``hf.py``)."""

from flaxzoo.models.families.electra.hf import FAMILY
from flaxzoo.models.families.electra.model import ElectraForPreTraining

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {14: FAMILY}

__all__ = ["RECORDS", "FAMILY", "ElectraForPreTraining"]
