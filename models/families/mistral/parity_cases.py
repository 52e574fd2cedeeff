"""Mistral's case against transformers: a sliding window (6) on every layer, which generation passes.

The data only (no transformers import): ``tests/test_decoder_families.py`` gathers every folder's ``CASES`` and
builds each case's transformers ``model`` from its ``config`` class with the shared small sizes
(``tests/family_parity.py`` ``SMALL``, less the keys in ``without``) updated by ``settings``, random weights;
``quick``: in the quick tier (``-m "not slow"``; the others are ``slow``). The case names are the tests' ids."""

CASES = {
    "mistral": {"model": "MistralForCausalLM", "config": "MistralConfig", "quick": True,
                "settings": {"num_hidden_layers": 2, "sliding_window": 6}},
}
