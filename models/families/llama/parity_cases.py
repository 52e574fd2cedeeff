"""Llama's case against transformers: Llama 3's RoPE scaling (``rope_type`` llama3, factor 8) with an original length
(16) the batches pass.

The data only (no transformers import): ``tests/test_decoder_families.py`` gathers every folder's ``CASES`` and
builds each case's transformers ``model`` from its ``config`` class with the shared small sizes
(``tests/family_parity.py`` ``SMALL``, less the keys in ``without``) updated by ``settings``, random weights;
``quick``: in the quick tier (``-m "not slow"``; the others are ``slow``). The case names are the tests' ids."""

CASES = {
    "llama3": {"model": "LlamaForCausalLM", "config": "LlamaConfig", "quick": True,
               "settings": {"num_hidden_layers": 2,
                            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}},
}
