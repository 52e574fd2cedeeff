"""Qwen2's cases against transformers: q/k/v biases without an output bias, a sliding window on the layers past
``max_window_layers``, an untied head; and YaRN RoPE scaling with a tied head.

The data only (no transformers import): ``tests/test_decoder_families.py`` gathers every folder's ``CASES`` and
builds each case's transformers ``model`` from its ``config`` class with the shared small sizes
(``tests/family_parity.py`` ``SMALL``, less the keys in ``without``) updated by ``settings``, random weights;
``quick``: in the quick tier (``-m "not slow"``; the others are ``slow``). The case names are the tests' ids."""

CASES = {
    "qwen2": {"model": "Qwen2ForCausalLM", "config": "Qwen2Config", "quick": True,
              "settings": {"num_hidden_layers": 3, "use_sliding_window": True, "sliding_window": 8,
                           "max_window_layers": 1, "rope_theta": 20_000.0, "tie_word_embeddings": False}},
    "qwen2_yarn": {"model": "Qwen2ForCausalLM", "config": "Qwen2Config", "quick": False,
                   "settings": {"num_hidden_layers": 2, "tie_word_embeddings": True,
                                "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 32}}},
}
