"""Phi-3, GPT-NeoX (Pythia) and OLMo 2: the older ``config.json`` spellings read as transformers reads them, and what
the families cannot express, refused by name. The logits, both ways, layouts and greedy tokens against transformers:
the cases in ``models/families/{phi3,gpt_neox,olmo2}/parity_cases.py``, run by ``tests/test_decoder_families.py``."""

from __future__ import annotations

import pytest
import transformers

from flaxzoo import models
from flaxzoo.models import families
from flaxzoo.models.io import save_pretrained


# ------------------------------------------------------------------------------------- older files and refusals

PYTHIA_OLD = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": 512,
              "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
              "hidden_act": "gelu", "layer_norm_eps": 1e-5, "max_position_embeddings": 2048, "rotary_pct": 0.25,
              "rotary_emb_base": 10000, "use_parallel_residual": True, "tie_word_embeddings": False,
              "bos_token_id": 0, "eos_token_id": 0}


def test_older_config_files_read_as_transformers_reads_them():
    """Pythia's v4 file (``rotary_pct`` / ``rotary_emb_base``; no fraction at all: 0.25), Phi-3.5's (``rope_scaling``
    of type ``su`` and the top-level original length, which wins over the dict's; none: 4096), OLMo 2's."""
    neox = families.family_of("gpt_neox").config_from_hf
    config = neox(PYTHIA_OLD | {"hidden_dropout": 0.1})
    assert (config.rotary_fraction, config.rotary_dim, config.rope_theta) == (0.25, 4, 10_000.0)
    assert config.parallel_residual and config.attention_bias and config.dropout == 0.1 and config.norm == "layernorm"
    bare = {k: v for k, v in PYTHIA_OLD.items() if k not in ("rotary_pct", "rotary_emb_base")}
    assert neox(bare).rotary_fraction == 0.25
    assert neox(bare | {"rope_parameters": {"rope_type": "default", "rope_theta": 5.0}}).rotary_fraction == 0.25
    assert neox(bare | {"rope_parameters": {"rope_theta": 5.0, "partial_rotary_factor": 1.0}}).rotary_dim == 16

    phi3 = families.family_of("phi3").config_from_hf
    old = {"model_type": "phi3", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "intermediate_size": 96, "max_position_embeddings": 128, "rope_theta": 500.0,
           "original_max_position_embeddings": 16, "sliding_window": 8, "resid_pdrop": 0.1,
           "rope_scaling": {"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                            "original_max_position_embeddings": 64}}
    config = phi3(old)
    scaling = config.rope_scaling_dict
    assert scaling["rope_type"] == "longrope" and scaling["original_max_position_embeddings"] == 16
    assert (config.rope_theta, config.sliding_window, config.layer_types, config.dropout) == (500.0, 8, None, 0.1)
    without = {k: v for k, v in old.items() if k != "original_max_position_embeddings"}
    assert phi3(without).rope_scaling_dict["original_max_position_embeddings"] == 4096
    hf = transformers.Phi3Config(**without)
    assert hf.rope_parameters["original_max_position_embeddings"] == 4096

    olmo2 = families.family_of("olmo2").config_from_hf
    config = olmo2({"model_type": "olmo2", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "intermediate_size": 96, "rope_theta": 500000, "rms_norm_eps": 1e-6,
                    "rope_scaling": None})
    assert (config.qk_norm, config.norm_placement, config.num_kv_heads, config.rope_theta) == ("full", "post_branch",
                                                                                              4, 500_000.0)


def test_what_the_families_cannot_express_is_refused(tmp_path):
    phi3 = families.family_of("phi3").config_from_hf
    base = {"model_type": "phi3", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 4, "intermediate_size": 96}
    with pytest.raises(ValueError, match=r"rope_type='linear'.*phi3 reads only"):
        phi3(base | {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}})
    olmo2 = families.family_of("olmo2").config_from_hf
    with pytest.raises(ValueError, match=r"partial_rotary_factor=0.5 is not supported for olmo2"):
        olmo2(base | {"model_type": "olmo2", "partial_rotary_factor": 0.5})

    def save(config):  # refused before any weight is read: an abstract model suffices
        return save_pretrained(models.abstract_model(config, models.GPTForCausalLM), tmp_path / config.model_type)

    neox = families.family_of("gpt_neox").config_from_hf(PYTHIA_OLD | {"num_hidden_layers": 1})
    with pytest.raises(ValueError, match=r"gpt_neox checkpoint: .*num_kv_heads=2"):
        save(neox.replace(num_kv_heads=2))
    with pytest.raises(ValueError, match=r"gpt_neox checkpoint: .*attention_out_bias=False"):
        save(neox.replace(attention_out_bias=False))
    with pytest.raises(ValueError, match=r"phi3 checkpoint: .*rope_type 'yarn'"):
        save(phi3(base).replace(rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                              "original_max_position_embeddings": 64}))
    with pytest.raises(ValueError, match=r"olmo2 checkpoint: .*qk_norm='head'"):
        save(families.family_of("olmo2").config_from_hf(base | {"model_type": "olmo2"}).replace(qk_norm="head"))
