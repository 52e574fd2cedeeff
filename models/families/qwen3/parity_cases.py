"""Qwen3's case against transformers: QK-norm with an explicit ``head_dim`` (24, not hidden / heads), attention
biases, a tied head, θ = 1e6.

The data only (no transformers import): ``tests/test_decoder_families.py`` gathers every folder's ``CASES`` and
builds each case's transformers ``model`` from its ``config`` class with the shared small sizes
(``tests/family_parity.py`` ``SMALL``, less the keys in ``without``) updated by ``settings``, random weights;
``quick``: in the quick tier (``-m "not slow"``; the others are ``slow``). The case names are the tests' ids."""

CASES = {
    "qwen3": {"model": "Qwen3ForCausalLM", "config": "Qwen3Config", "quick": True,
              "settings": {"num_hidden_layers": 2, "head_dim": 24, "attention_bias": True, "tie_word_embeddings": True,
                           "rope_theta": 1_000_000.0}},
}
