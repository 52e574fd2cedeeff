"""ALBERT's small test configs.

The data only (no transformers import): the shared encoder tests (``tests/encoder_cases.py`` gathers every encoder
folder's ``SMALL_CONFIGS``: ``tests/test_every_encoder.py``, ``tests/test_finetune_families.py``) build a tiny
transformers config of each ``model_type`` here from their shared sizes, with factorised embeddings (``settings``);
``mechanisms``: parameters every class must have (the shared block, the embeddings' projection)."""

SMALL_CONFIGS = {
    "albert": {"settings": {"embedding_size": 16},
               "mechanisms": ("backbone.shared_layer.attention.query.kernel", "backbone.embeddings.project.kernel")},
}
