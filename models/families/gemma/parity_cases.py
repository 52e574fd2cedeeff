"""The Gemma line's cases against transformers, one per generation. Gemma: the (1 + w) RMSNorm, √hidden embedding
scale, GELU-tanh and a head_dim other than hidden / heads. Gemma 2: sandwich norms, score and logit soft caps,
``query_pre_attn_scalar`` other than head_dim and alternating sliding / global layers (window 6: generation passes
it). Gemma 3: QK-norm and per-layer RoPE (local θ unscaled, global θ with linear scaling) on mixed layers, which the
scanned layout runs through a traced window mask. transformers picks its own attention: sdpa for Gemma and Gemma 3,
eager for Gemma 2 (its sdpa cannot soft-cap); both agree with flaxzoo.

The data only (no transformers import): ``tests/test_decoder_families.py`` gathers every folder's ``CASES`` and
builds each case's transformers ``model`` from its ``config`` class with the shared small sizes
(``tests/family_parity.py`` ``SMALL``, less the keys in ``without``) updated by ``settings``, random weights;
``quick``: in the quick tier (``-m "not slow"``; the others are ``slow``). The case names are the tests' ids."""

CASES = {
    "gemma": {"model": "GemmaForCausalLM", "config": "GemmaConfig", "quick": True,
              "settings": {"num_hidden_layers": 2, "head_dim": 32}},
    "gemma2": {"model": "Gemma2ForCausalLM", "config": "Gemma2Config", "quick": True,
               "settings": {"num_hidden_layers": 3, "head_dim": 24, "sliding_window": 6, "query_pre_attn_scalar": 20,
                            "attn_logit_softcapping": 1.5, "final_logit_softcapping": 2.0}},
    "gemma3": {"model": "Gemma3ForCausalLM", "config": "Gemma3TextConfig", "quick": True,
               "settings": {"num_hidden_layers": 3, "head_dim": 32, "sliding_window": 6, "query_pre_attn_scalar": 24,
                            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                            "rope_parameters": {
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}}}},
}
