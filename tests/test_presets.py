"""The published decoder presets: each one's parameter count (from ``eval_shape``, nothing allocated) equals the
count of transformers' own model built from the ``config.json`` flaxzoo writes for it (on torch's meta device), and
the figures the model cards publish."""

from __future__ import annotations

import math

import jax
import pytest
import torch
import transformers
from flax import nnx

from flaxzoo import models
from flaxzoo.models import families
from flaxzoo.models.families.fields import common_to_hf

# Preset → the parameter count its model card gives (transformers counts tied tables once, as flaxzoo does).
PUBLISHED = {
    "llama-3.2-1b": 1_235_814_400,
    "qwen2.5-0.5b": 494_032_768,
    "qwen3-0.6b": 596_049_920,
    "mistral-7b": 7_241_732_096,
    "gemma-3-270m": 268_098_176,
    "phi-3-mini": 3_821_079_552,
    "pythia-160m": 162_322_944,
    "olmo-2-1b": None,  # the card rounds it ("1B"): checked against transformers only
}


def flaxzoo_count(config: models.TransformerConfig) -> int:
    cls = families.family_of(config.model_type).class_for("causal_lm")
    state = nnx.state(models.abstract_model(config, cls), nnx.Param)
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(state))


def transformers_count(config: models.TransformerConfig) -> int:
    family = families.family_of(config.model_type)
    cls = family.class_for("causal_lm")
    hf = family.config_to_hf(config) | common_to_hf(config) | {"model_type": config.model_type,
                                                               "architectures": [family.hf_architecture(cls)]}
    hf_config = transformers.AutoConfig.for_model(**hf)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.slow_variants
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_count_equals_transformers(name):
    config = models.get_preset(name)
    ours = flaxzoo_count(config)
    assert ours == transformers_count(config)
    if PUBLISHED[name] is not None:
        assert ours == PUBLISHED[name]


# Factorised-embedding presets → the count of Hugging Face's base model (AlbertModel with its pooler; ElectraModel
# has none: 13,483,008 by the sizes and by transformers' model, 65,792 = 256 · 256 + 256 fewer than the 13,548,800
# sometimes quoted, which is no ElectraModel's count).
FACTORISED_PUBLISHED = {"albert-base-v2": 11_683_584, "electra-small-discriminator": 13_483_008}


@pytest.mark.parametrize("name", sorted(FACTORISED_PUBLISHED))
def test_factorised_preset_count_equals_transformers_base_model(name):
    config = models.get_preset(name)
    family = families.family_of(config.model_type)
    cls = family.base_class
    params = [path for entry in family.weights(config, cls, "").entries for path in entry.paths]
    state = nnx.state(models.abstract_model(config, family.factory(cls, params)), nnx.Param)
    ours = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(state))
    hf = family.config_to_hf(config) | common_to_hf(config) | {"model_type": config.model_type,
                                                               "architectures": [family.hf_architecture(cls)]}
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(transformers.AutoConfig.for_model(**hf))
    assert type(model).__name__ == family.hf_architecture(cls)
    assert ours == sum(p.numel() for p in model.parameters()) == FACTORISED_PUBLISHED[name]
    assert family.config_from_hf(hf) == config  # the preset is what its config.json reads back as


def test_another_depth_keeps_the_layer_pattern():
    """Gemma 3's five sliding layers then a global one: 7 layers repeat the pattern from the start, 2 keep its
    first two; a pattern given with the new depth wins."""
    config = models.get_preset("gemma-3-270m")
    seven = config.replace(num_layers=7).layer_types
    assert seven == ("sliding_attention",) * 5 + ("full_attention", "sliding_attention")
    assert config.replace(num_layers=2).layer_types == ("sliding_attention",) * 2
    assert config.replace(num_layers=2, layer_types=("full_attention",) * 2).layer_types == ("full_attention",) * 2


def test_modernbert_base_count_equals_transformers():
    """ModernBERT-base's masked-LM model: transformers' count (the card's "149M"), plus the one hidden-wide scale of
    layer 0's unused attention norm that flaxzoo keeps so all layers stack (``families/modernbert/model.py``;
    bias-free norms: no bias)."""
    config = models.get_preset("modernbert-base")
    family = families.family_of("modernbert")
    cls = family.class_for("masked_lm")
    state = nnx.state(models.abstract_model(config, cls), nnx.Param)
    ours = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(state))
    hf = family.config_to_hf(config) | common_to_hf(config) | {"model_type": "modernbert",
                                                               "architectures": [family.hf_architecture(cls)]}
    with torch.device("meta"):
        model = transformers.AutoModelForMaskedLM.from_config(transformers.AutoConfig.for_model(**hf))
        default = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig())
    theirs = sum(p.numel() for p in model.parameters())
    assert theirs == sum(p.numel() for p in default.parameters()) == 149_655_232
    assert ours == theirs + config.hidden_size


# Encoder presets → the published parameter count of Hugging Face's base model (DistilBertModel: no pooler;
# XLMRobertaModel: with its pooler; DebertaV2Model: none).
ENCODERS_PUBLISHED = {"distilbert-base-uncased": 66_362_880, "xlm-roberta-base": 278_043_648,
                      "deberta-v3-small": 141_304_320}


@pytest.mark.slow_variants
@pytest.mark.parametrize("name", sorted(ENCODERS_PUBLISHED))
def test_encoder_preset_count_equals_transformers_base_model(name):
    """flaxzoo's base model as a Hugging Face base checkpoint of the family builds it (the family's factory: a pooler
    only where the table has one) against transformers' ``AutoModel`` of the config.json flaxzoo writes."""
    config = models.get_preset(name)
    family = families.family_of(config.model_type)
    cls = family.base_class
    params = [path for entry in family.weights(config, cls, "").entries for path in entry.paths]
    state = nnx.state(models.abstract_model(config, family.factory(cls, params)), nnx.Param)
    ours = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(state))
    hf = family.config_to_hf(config) | common_to_hf(config) | {"model_type": config.model_type,
                                                               "architectures": [family.hf_architecture(cls)]}
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(transformers.AutoConfig.for_model(**hf))
    assert type(model).__name__ == family.hf_architecture(cls)
    assert ours == sum(p.numel() for p in model.parameters()) == ENCODERS_PUBLISHED[name]
    assert family.config_from_hf(hf) == config  # the preset is what its config.json reads back as
