"""XLM-RoBERTa: RoBERTa's layout (``families/roberta/hf.py``) under Hugging Face ``xlm-roberta`` names (``hf.py``)."""

from flaxzoo.models.families.xlm_roberta.hf import FAMILY

__all__ = ["FAMILY"]
