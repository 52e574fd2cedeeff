"""The Gemma line (Gemma, Gemma 2, Gemma 3 text): ``config.json`` read in transformers v5's form and the older one
(``rope_theta`` / ``rope_scaling`` / ``rope_local_base_freq`` / ``sliding_window_pattern``, no ``layer_types``) as
transformers reads it, and written so that transformers reads the same values back; what the families cannot express,
refused by name. The logits, both ways, layouts and greedy tokens against transformers: the cases in
``models/families/gemma/parity_cases.py``, run by ``tests/test_decoder_families.py``."""

from __future__ import annotations

from typing import Any

import pytest
import transformers

from flaxzoo import models
from flaxzoo.models import families
from flaxzoo.models.families.gemma import GEMMA, GEMMA2, GEMMA3
from flaxzoo.models.io import save_pretrained


# ------------------------------------------------------------------------------------------------------ config.json

SIZES = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=64)
# Files as older transformers wrote them: no rope_parameters, no layer_types.
OLD_FILES: dict[str, tuple[Any, dict[str, Any]]] = {
    "gemma": (GEMMA, SIZES | dict(model_type="gemma", hidden_act="gelu", hidden_activation=None, rope_theta=10_000.0,
                                  rope_scaling=None)),
    "gemma2": (GEMMA2, SIZES | dict(model_type="gemma2", hidden_act="gelu_pytorch_tanh",
                                    hidden_activation="gelu_pytorch_tanh", rope_theta=10_000.0, sliding_window=8,
                                    query_pre_attn_scalar=24, attn_logit_softcapping=50.0,
                                    final_logit_softcapping=30.0, cache_implementation="hybrid")),
    "gemma3": (GEMMA3, SIZES | dict(model_type="gemma3_text", hidden_activation="gelu_pytorch_tanh",
                                    rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, sliding_window=8,
                                    rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window_pattern=2,
                                    query_pre_attn_scalar=32, final_logit_softcapping=None,
                                    attn_logit_softcapping=None)),
}
CONFIG_CLASSES = {"gemma": transformers.GemmaConfig, "gemma2": transformers.Gemma2Config,
                  "gemma3_text": transformers.Gemma3TextConfig}
# What the attention and RoPE of transformers' classes read.
READ_KEYS = ("head_dim", "rope_parameters", "sliding_window", "layer_types", "query_pre_attn_scalar",
             "attn_logit_softcapping", "final_logit_softcapping", "hidden_act", "hidden_activation",
             "tie_word_embeddings", "rms_norm_eps", "attention_bias", "num_key_value_heads")


def _transformers_reads(hf: dict[str, Any]) -> transformers.PreTrainedConfig:
    return CONFIG_CLASSES[hf["model_type"]](**{k: v for k, v in hf.items() if k != "model_type"})


@pytest.mark.parametrize("case", sorted(OLD_FILES))
def test_older_and_v5_files_read_alike_and_write_what_transformers_reads_back(case):
    family, old = OLD_FILES[case]
    config = family.config_from_hf(old)
    theirs = _transformers_reads(old)  # transformers v5's reading of the older file
    assert family.config_from_hf(theirs.to_dict()) == config  # the same file as v5 writes it
    again = _transformers_reads({"model_type": family.model_type, **family.config_to_hf(config)})
    for key in READ_KEYS:
        if key == "hidden_act" and case != "gemma":  # Gemma 2 / 3 read hidden_activation only
            continue
        assert getattr(again, key, None) == getattr(theirs, key, None), key


def test_older_files_follow_transformers_rules():
    """Gemma's ``hidden_act="gelu"`` is the tanh approximation; Gemma 2's even layers slide; Gemma 3's every
    ``sliding_window_pattern``-th layer is global, its sliding layers rotate by ``rope_local_base_freq`` unscaled and
    its global ones by ``rope_theta`` with ``rope_scaling``."""
    assert GEMMA.config_from_hf(OLD_FILES["gemma"][1]).activation == "gelu_tanh"
    gemma2 = GEMMA2.config_from_hf(OLD_FILES["gemma2"][1])
    assert gemma2.sliding_layers == (True, False, True, False) and gemma2.query_scale == 24 ** -0.5
    assert (gemma2.attention_softcap, gemma2.final_logit_softcap, gemma2.sliding_window) == (50.0, 30.0, 8)
    gemma3 = GEMMA3.config_from_hf(OLD_FILES["gemma3"][1])
    assert gemma3.sliding_layers == (True, False, True, False) and gemma3.query_scale is None
    assert (gemma3.rope_theta, gemma3.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert gemma3.rope_scaling_dict == {"rope_type": "linear", "factor": 8.0}
    assert gemma3.embedding_multiplier == 8.0 and gemma3.norm_unit_offset and gemma3.qk_norm == "head"
    # transformers' defaults for a file without head_dim, tie_word_embeddings or the Gemma 3 thetas
    bare = {k: v for k, v in OLD_FILES["gemma3"][1].items() if k not in (
        "head_dim", "rope_theta", "rope_local_base_freq", "rope_scaling", "sliding_window_pattern")}
    bare = GEMMA3.config_from_hf(bare)
    assert (bare.head_dim, bare.tie_word_embeddings, bare.rope_theta, bare.rope_local_theta) == (
        256, True, 1_000_000.0, 10_000.0)
    assert bare.sliding_layers == (True, True, True, True)  # the 6th layer would be the first global one


@pytest.mark.parametrize("family", [GEMMA, GEMMA2, GEMMA3], ids=lambda f: f.model_type)
def test_bidirectional_attention_is_refused_by_name(family):
    hf = SIZES | {"model_type": family.model_type, "use_bidirectional_attention": True}
    with pytest.raises(ValueError, match=r"use_bidirectional_attention=True is not supported"):
        family.config_from_hf(hf)
    assert family.config_from_hf(hf | {"use_bidirectional_attention": False}).causal


def test_gemma3_rope_the_families_cannot_express_is_refused_and_score_caps_are_ignored_as_transformers_does():
    rope = {"sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}}
    hf = SIZES | {"model_type": "gemma3_text", "rope_parameters": rope}
    with pytest.raises(ValueError, match=r"rope_parameters\['sliding_attention'\]=.* the sliding layers' RoPE must"):
        GEMMA3.config_from_hf(hf)
    same = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0}  # sliding layers rotate as global ones
    config = GEMMA3.config_from_hf(hf | {"rope_parameters": {"sliding_attention": same, "full_attention": same}})
    assert config.rope_local_theta is None and config.rope_scaling_dict == {"rope_type": "linear", "factor": 2.0}
    assert _transformers_reads({"model_type": "gemma3_text", **GEMMA3.config_to_hf(config)}).rope_parameters == {
        "sliding_attention": same, "full_attention": same}
    with pytest.warns(UserWarning, match=r"attn_logit_softcapping=50.0 is ignored"):
        assert GEMMA3.config_from_hf(SIZES | {"attn_logit_softcapping": 50.0}).attention_softcap is None


def test_what_transformers_gemma_classes_cannot_express_is_refused_on_save(tmp_path):
    gemma2 = GEMMA2.config_from_hf(OLD_FILES["gemma2"][1])
    gemma = GEMMA.config_from_hf(OLD_FILES["gemma"][1])
    cases = [
        (gemma2.replace(query_scale=0.3),
         r"query_scale=0.3 \(Hugging Face gemma2 scales by query_pre_attn_scalar \*\* -0.5 with an integer"),
        (gemma2.replace(embedding_multiplier=1.0), r"embedding_multiplier=1.0 .*√hidden_size = 8"),
        (gemma2.replace(qk_norm="head"), r"qk_norm='head' \(Hugging Face gemma2 needs 'none'\)"),
        (gemma.replace(activation="gelu"),
         r"activation='gelu' \(Hugging Face gemma reads hidden_act='gelu' as the tanh approximation"),
    ]
    for config, message in cases:
        model = models.abstract_model(config, families.family_of(config.model_type).class_for("causal_lm"))
        with pytest.raises(ValueError, match=message):
            save_pretrained(model, tmp_path / "out")
