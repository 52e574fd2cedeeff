"""ELECTRA's small test configs.

The data only (no transformers import): the shared encoder tests (``tests/encoder_cases.py`` gathers every encoder
folder's ``SMALL_CONFIGS``: ``tests/test_every_encoder.py``, ``tests/test_finetune_families.py``) build a tiny
transformers config of each ``model_type`` here from their shared sizes, with factorised embeddings (``settings``,
the generators' shapes); ``mechanisms``: parameters every class must have."""

SMALL_CONFIGS = {
    "electra": {"settings": {"embedding_size": 16}, "mechanisms": ("backbone.embeddings.project.kernel",)},
}
