"""The family registry: every lookup derives from the family records, and a registered record is all a new family needs
(a new folder's ``RECORDS`` are registered when ``flaxzoo.models.families`` is imported; here ``register`` does it).

The new family here is Hugging Face's Ministral (Llama's layout with sliding-window layers, under its own ``model_type``): its
record is written in a few lines from Llama's pieces, registered with one call, and a random-weight transformers
``MinistralForCausalLM`` round-trips through ``from_pretrained`` / ``save_pretrained`` with transformers' logits.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from flaxzoo import models
from flaxzoo.models import families
from flaxzoo.models.families import bert, gpt2, llama, roberta
from flaxzoo.models.families.base import BACKBONE, Family
from flaxzoo.models.architectures.decoder.model import GPTForCausalLM, GPTModel
from flaxzoo.models.architectures.decoder.hf import decoder_config_from_hf, decoder_config_to_hf
from flaxzoo.models.io import from_pretrained, save_pretrained
from flaxzoo.models.layers.block import TransformerBlock
from flaxzoo.models.adapters.quantize import projection_paths


LAYOUT = {k: v for k, v in llama.hf.LLAMA_LAYOUT.items() if k != "sliding_window"}
MINISTRAL = dataclasses.replace(
    llama.FAMILY, model_type="ministral",
    architectures={"MinistralModel": GPTModel, "MinistralForCausalLM": GPTForCausalLM},
    config_from_hf=lambda hf: decoder_config_from_hf(hf, "ministral", LAYOUT),
    config_to_hf=decoder_config_to_hf, layout=LAYOUT, gguf=None, presets={})


@pytest.fixture
def registered():
    """``register(family)`` for the test, removed afterwards."""
    added = []

    def register(family: Family) -> Family:
        added.append(families.register(family))
        return added[-1]

    yield register
    for family in added:
        families.FAMILIES.pop(family.model_type)
        for name in family.presets:
            families.PRESETS.pop(name)


def test_the_families_and_their_lookups():
    assert list(families.FAMILIES)[:4] == ["bert", "roberta", "gpt2", "llama"]
    assert [families.family_of(k) for k in list(families.FAMILIES)[:4]] == [bert.FAMILY, roberta.FAMILY, gpt2.FAMILY,
                                                                            llama.FAMILY]
    assert {"qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi3", "gpt_neox", "olmo2"} <= \
        set(families.FAMILIES)
    assert {"BertForMaskedLM", "BertForQuestionAnswering", "BertForSequenceClassification",
            "BertForTokenClassification", "BertModel", "GPTForCausalLM", "GPTForSequenceClassification",
            "GPTModel"} <= set(families.model_classes())
    assert families.family_and_class({"model_type": "roberta", "architectures": ["RobertaForMaskedLM"]}, None) == \
        (roberta.FAMILY, models.BertForMaskedLM)
    assert families.family_and_class({"architectures": ["GPT2LMHeadModel"]}, None) == (gpt2.FAMILY, GPTForCausalLM)
    assert families.gguf_family("llama") is llama.FAMILY
    with pytest.raises(ValueError, match=r"unsupported GGUF architecture 'falcon' \(general.architecture\); flaxzoo "
                                         r"loads \[.*'llama'.*\]"):
        families.gguf_family("falcon")
    assert families.family_of_class(models.BertModel) is bert.FAMILY  # RoBERTa shares it; BERT comes first
    assert families.default_model_class(models.get_preset("bert-tiny")) is models.BertForMaskedLM
    assert families.default_model_class(models.get_preset("gpt2-tiny")) is GPTForCausalLM
    assert [c.task for c in bert.FAMILY.classes] == ["base", "masked_lm", "sequence_classification",
                                                     "token_classification", "question_answering"]
    assert llama.FAMILY.base_class is GPTModel and llama.FAMILY.block is TransformerBlock
    with pytest.raises(ValueError, match=r"model_type='whisper': expected one of \[.*'bert', .*'gpt2', .*'llama', "
                                         r".*'roberta'"):
        families.family_of("whisper")


def test_every_class_keeps_its_stack_at_backbone():
    config = models.get_preset("bert-tiny").replace(num_layers=1)
    for cls in bert.FAMILY.classes:
        roots = {path[0] for path, _ in nnx.to_flat_state(nnx.state(models.abstract_model(config, cls), nnx.Param))}
        assert BACKBONE in roots and roots <= {BACKBONE, "pooler", "classifier", "transform", "transform_norm",
                                               "qa_outputs", "decoder"}, (cls.__name__, roots)


def test_register_refuses_a_clash():
    with pytest.raises(ValueError, match=r"model_type='llama' is already registered"):
        families.register(llama.FAMILY)
    with pytest.raises(ValueError, match=r"ministral: Hugging Face architectures \['LlamaForCausalLM'\] are already "
                                         "registered"):
        families.register(dataclasses.replace(MINISTRAL, architectures={"LlamaForCausalLM": GPTForCausalLM}))
    with pytest.raises(ValueError, match=r"ministral: presets \['llama-tiny'\] are already registered .*presets=\{\}"):
        families.register(dataclasses.replace(MINISTRAL, presets={"llama-tiny": models.get_preset("llama-tiny")}))
    tiny = models.get_preset("llama-tiny")
    with pytest.raises(ValueError, match=r"ministral: presets \['ministral-tiny'\] have another model_type"):
        families.register(dataclasses.replace(MINISTRAL, presets={"ministral-tiny": tiny}))
    assert "ministral" not in families.FAMILIES and "ministral-tiny" not in families.PRESETS


def test_every_preset_is_its_familys():
    """The presets come from the family folders (``presets.py``), each under its own family's ``model_type``."""
    owners = {name: family.model_type for family in families.FAMILIES.values() for name in family.presets}
    assert owners.keys() == families.PRESETS.keys() and len(owners) >= 26
    assert all(families.PRESETS[name].model_type == owner for name, owner in owners.items())
    assert owners["gpt2-tiny"] == "gpt2" and owners["xlm-roberta-base"] == "xlm-roberta"


def test_a_new_family_is_one_registration(registered, tmp_path):
    """Ministral registered in one line: found by model_type and by config.json, loaded with transformers' logits,
    saved as a MinistralForCausalLM transformers reads back to the same logits."""
    registered(MINISTRAL)
    assert families.family_of("ministral") is MINISTRAL
    hf_config = transformers.MinistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                             max_position_embeddings=64, sliding_window=4,
                                             tie_word_embeddings=False)
    torch.manual_seed(0)
    reference = transformers.MinistralForCausalLM(hf_config).eval()
    reference.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf")
    assert isinstance(model, GPTForCausalLM) and model.config.model_type == "ministral"
    ids = np.random.default_rng(0).integers(0, 96, (2, 9))
    with torch.no_grad():
        want = reference(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(ids)), want, atol=2e-5, rtol=1e-4)

    save_pretrained(model, tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(back).__name__ == "MinistralForCausalLM"
    with torch.no_grad():
        np.testing.assert_allclose(back(torch.from_numpy(ids)).logits.numpy(), want, atol=1e-6, rtol=1e-6)


class NoBiasBlock(TransformerBlock):
    """A block of its own (here the shared one under another name): what a family with other layers supplies."""


class ToyLM(GPTForCausalLM):
    block = NoBiasBlock


def test_a_family_record_drives_blocks_lora_and_int8(registered):
    """The block class, the int8 projections and the LoRA target names all come from the record (and its
    classes)."""
    toy = registered(dataclasses.replace(
        gpt2.FAMILY, model_type="toy", architectures={"ToyForCausalLM": ToyLM},
        projections={"attention": ("query",)}, lora_targets={"q": r"(^|\.)attention\.query$"}, presets={}))
    assert toy.block is NoBiasBlock and families.family_of_class(ToyLM) is toy
    config = models.get_preset("gpt2-tiny").replace(num_layers=2, hidden_size=32, num_heads=2,
                                                     intermediate_size=64, vocab_size=64, model_type="toy")
    model = models.abstract_model(config, ToyLM)
    assert all(isinstance(block, NoBiasBlock) for block in model.backbone.layers)
    assert projection_paths(model) == [(BACKBONE, "layers", i, "attention", "query") for i in range(2)]
    assert families.lora_targets(model) == {"q": r"(^|\.)attention\.query$"}
    assert "q" in families.lora_targets()  # a name any family defines passes LoraConfig's check
    assert families.plain_factory(model) is ToyLM


def test_a_family_on_bert_classes_keeps_its_own_targets(registered):
    """Families share BERT's classes (RoBERTa, ALBERT ...): LoRA and int8 read the targets of the model's own family
    (its config's model_type), not of the first family registered with the class."""
    from flaxzoo.models.adapters.lora import LoraConfig, apply_lora
    from flaxzoo.models.adapters.quantize import projection_paths, projections_of

    own = registered(dataclasses.replace(
        roberta.FAMILY, model_type="roberta-values-only", architectures={"ValuesOnlyModel": models.BertModel},
        lora_targets={"values": r".*attention\.value"}, projections={"attention": ("value",)}))
    config = models.get_preset("bert-tiny").replace(model_type=own.model_type, num_layers=1)
    model = models.BertModel(config, rngs=nnx.Rngs(0))
    assert families.family_of_model(model) is own and families.family_of_model(models.BertModel) is bert.FAMILY
    assert projections_of(model) == {"attention": ("value",)}
    assert [p[-2:] for p in projection_paths(model)] == [("attention", "value")]
    assert families.lora_targets(model) == {"values": r".*attention\.value"}
    adapted = apply_lora(model, LoraConfig(rank=2, alpha=4.0, targets=("values",)))
    adapters = [tuple(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(adapted, nnx.Param)) if "lora" in str(p[-1])]
    assert adapters == [("backbone", "layers", "0", "attention", "value", "kernel_lora_a"),
                        ("backbone", "layers", "0", "attention", "value", "kernel_lora_b")]
