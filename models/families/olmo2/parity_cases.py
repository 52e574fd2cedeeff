"""OLMo 2's case against transformers: post-branch norms and full-width QK-norm with grouped-query heads.

The data only (no transformers import): ``tests/test_decoder_families.py`` gathers every folder's ``CASES`` and
builds each case's transformers ``model`` from its ``config`` class with the shared small sizes
(``tests/family_parity.py`` ``SMALL``, less the keys in ``without``) updated by ``settings``, random weights;
``quick``: in the quick tier (``-m "not slow"``; the others are ``slow``). The case names are the tests' ids."""

CASES = {
    "olmo2": {"model": "Olmo2ForCausalLM", "config": "Olmo2Config", "quick": True,
              "settings": {"num_hidden_layers": 2, "rope_theta": 500_000.0, "rms_norm_eps": 1e-6}},
}
