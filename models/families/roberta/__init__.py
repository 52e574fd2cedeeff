"""RoBERTa and XLM-RoBERTa: the encoder architecture's classes under Hugging Face ``roberta`` names (``hf.py``),
and the same record under ``xlm-roberta`` names (``xlm_roberta.py``)."""

from flaxzoo.models.families.roberta.hf import FAMILY
from flaxzoo.models.families.roberta.xlm_roberta import XLM_ROBERTA

__all__ = ["FAMILY", "XLM_ROBERTA"]
