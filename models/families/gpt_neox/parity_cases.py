"""GPT-NeoX's (Pythia's) cases against transformers: per-head fused q/k/v with a quarter of each head rotated and
parallel residuals; half rotated, sequential residuals and a tied head. Full-width heads only (no
``num_key_value_heads``).

The data only (no transformers import): ``tests/test_decoder_families.py`` gathers every folder's ``CASES`` and
builds each case's transformers ``model`` from its ``config`` class with the shared small sizes
(``tests/family_parity.py`` ``SMALL``, less the keys in ``without``) updated by ``settings``, random weights;
``quick``: in the quick tier (``-m "not slow"``; the others are ``slow``). The case names are the tests' ids."""

CASES = {
    "gpt_neox": {"model": "GPTNeoXForCausalLM", "config": "GPTNeoXConfig", "quick": True,
                 "without": ["num_key_value_heads"],
                 "settings": {"num_hidden_layers": 2, "rotary_pct": 0.25, "rotary_emb_base": 20_000.0,
                              "use_parallel_residual": True}},
    "gpt_neox_sequential": {"model": "GPTNeoXForCausalLM", "config": "GPTNeoXConfig", "quick": False,
                            "without": ["num_key_value_heads"],
                            "settings": {"num_hidden_layers": 2, "rotary_pct": 0.5, "use_parallel_residual": False,
                                         "tie_word_embeddings": True}},
}
