"""DistilBERT's small test configs.

The data only (no transformers import): the shared encoder tests (``tests/encoder_cases.py`` gathers every encoder
folder's ``SMALL_CONFIGS``: ``tests/test_every_encoder.py``, ``tests/test_finetune_families.py``) build a tiny
transformers config of each ``model_type`` here from their shared sizes, its config naming the shared sizes otherwise
(``sizes``: the shared name → DistilBERT's)."""

SMALL_CONFIGS = {
    "distilbert": {"sizes": {"hidden_size": "dim", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                             "intermediate_size": "hidden_dim"}},
}
