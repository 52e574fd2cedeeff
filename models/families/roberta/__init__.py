"""RoBERTa and XLM-RoBERTa: the encoder architecture's classes under Hugging Face ``roberta`` names (``hf.py``),
and the same record under ``xlm-roberta`` names (``xlm_roberta.py``)."""

from flaxzoo.models.families.roberta.hf import FAMILY
from flaxzoo.models.families.roberta.xlm_roberta import XLM_ROBERTA

# The records the registry gathers, by their place in the order the families were added (flaxzoo.models.families).
RECORDS = {1: FAMILY, 16: XLM_ROBERTA}

__all__ = ["RECORDS", "FAMILY", "XLM_ROBERTA"]
