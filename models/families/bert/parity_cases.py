"""BERT's small test configs.

The data only (no transformers import): the shared encoder tests (``tests/encoder_cases.py`` gathers every encoder
folder's ``SMALL_CONFIGS``: ``tests/test_every_encoder.py``, ``tests/test_finetune_families.py``) build a tiny
transformers config of each ``model_type`` here from their shared sizes, with nothing of the family's own to add."""

SMALL_CONFIGS = {"bert": {}}
