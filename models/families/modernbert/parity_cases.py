"""ModernBERT's small test configs.

The data only (no transformers import): the shared encoder tests (``tests/encoder_cases.py`` gathers every encoder
folder's ``SMALL_CONFIGS``: ``tests/test_every_encoder.py``, ``tests/test_finetune_families.py``) build a tiny
transformers config of each ``model_type`` here from their shared sizes, with local attention in every other layer
and special token ids inside the small vocabulary."""

SMALL_CONFIGS = {
    "modernbert": {"settings": {"local_attention": 4, "global_attn_every_n_layers": 2, "bos_token_id": 1,
                                "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2}},
}
