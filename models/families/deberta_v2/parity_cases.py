"""DeBERTa-v2's small test configs.

The data only (no transformers import): the shared encoder tests (``tests/encoder_cases.py`` gathers every encoder
folder's ``SMALL_CONFIGS``: ``tests/test_every_encoder.py``, ``tests/test_finetune_families.py``) build a tiny
transformers config of each ``model_type`` here from their shared sizes, with v3's relative attention switched on
(both position terms, separate position projections, the table's norm, no absolute positions, no token types);
``mechanisms``: parameters every class must have."""

SMALL_CONFIGS = {
    "deberta-v2": {"settings": {"relative_attention": True, "pos_att_type": ["p2c", "c2p"], "position_buckets": 16,
                                "max_relative_positions": -1, "share_att_key": False, "norm_rel_ebd": "layer_norm",
                                "position_biased_input": False, "type_vocab_size": 0},
                   "mechanisms": ("attention.pos_key.kernel", "attention.pos_query.kernel",
                                  "backbone.relative.embedding", "backbone.relative.norm.scale")},
}
