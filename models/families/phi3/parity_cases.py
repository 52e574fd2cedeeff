"""Phi-3's cases against transformers: the fused q/k/v split unevenly by grouped-query heads and a sliding window the
generation passes; LongRoPE with a partial rotary (0.75 of 16 features: 6 frequencies), where the 12-token batches use
the long factors, the 10-token prompt the short ones, and generation crosses the original length 10.

The data only (no transformers import): ``tests/test_decoder_families.py`` gathers every folder's ``CASES`` and
builds each case's transformers ``model`` from its ``config`` class with the shared small sizes
(``tests/family_parity.py`` ``SMALL``, less the keys in ``without``) updated by ``settings``, random weights;
``quick``: in the quick tier (``-m "not slow"``; the others are ``slow``). The case names are the tests' ids."""

CASES = {
    "phi3": {"model": "Phi3ForCausalLM", "config": "Phi3Config", "quick": True,
             "settings": {"num_hidden_layers": 2, "sliding_window": 6, "rope_theta": 20_000.0}},
    "phi3_longrope": {"model": "Phi3ForCausalLM", "config": "Phi3Config", "quick": False,
                      "settings": {"num_hidden_layers": 2, "original_max_position_embeddings": 10,
                                   "rope_parameters": {
                                       "rope_type": "longrope", "rope_theta": 10_000.0, "partial_rotary_factor": 0.75,
                                       "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5],
                                       "long_factor": [1.0, 2.4000000000000004, 3.8000000000000003,
                                                       5.200000000000001, 6.6000000000000005, 8.0]}}},
}
