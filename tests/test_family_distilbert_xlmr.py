"""DistilBERT and XLM-RoBERTa (BERT's classes under their Hugging Face names) against transformers: every head, both
ways, on right-padded batches (pad id = the config's ``pad_token_id``; the scanned layout proven equal to the
unrolled one per family); and the config values
flaxzoo refuses."""

import json

import numpy as np
import pytest
import torch
import transformers

from flaxzoo import models
from flaxzoo.models.families import distilbert, family_and_class, roberta
from flaxzoo.models.io import from_pretrained
from tests.encoder_parity import check_both_ways, check_encoder_layouts

HEADS = {"base": "Model", "masked_lm": "ForMaskedLM", "sequence_classification": "ForSequenceClassification",
         "token_classification": "ForTokenClassification", "question_answering": "ForQuestionAnswering"}
AUTO = {"base": transformers.AutoModel, "masked_lm": transformers.AutoModelForMaskedLM,
        "sequence_classification": transformers.AutoModelForSequenceClassification,
        "token_classification": transformers.AutoModelForTokenClassification,
        "question_answering": transformers.AutoModelForQuestionAnswering}
FLAX = {"base": models.BertModel, "masked_lm": models.BertForMaskedLM,
        "sequence_classification": models.BertForSequenceClassification,
        "token_classification": models.BertForTokenClassification,
        "question_answering": models.BertForQuestionAnswering}


def hf_config(name: str, num_labels: int = 3) -> transformers.PretrainedConfig:
    """A tiny config; ``num_labels=2`` for the span heads (start and end)."""
    if name == "distilbert":  # relu in the layers and the MLM head: the head follows the config's activation
        return transformers.DistilBertConfig(vocab_size=200, dim=32, n_layers=2, n_heads=4, hidden_dim=72,
                                             max_position_embeddings=40, activation="relu", num_labels=num_labels)
    return transformers.XLMRobertaConfig(vocab_size=240, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=80, max_position_embeddings=40, type_vocab_size=1,
                                         pad_token_id=1, layer_norm_eps=1e-5, num_labels=num_labels)


PREFIX = {"distilbert": "DistilBert", "xlm-roberta": "XLMRoberta"}
PAIRS = [(name, head) for name in PREFIX for head in HEADS]
QUICK = (("distilbert", "masked_lm"), ("xlm-roberta", "masked_lm"))  # the quick tier's cases (``-m "not slow"``)


@pytest.fixture(scope="module")
def hf_models():
    """One transformers model per (family, head), shared by both layouts."""
    built = {}
    for index, (name, head) in enumerate(PAIRS):
        torch.manual_seed(index)
        config = hf_config(name, 2 if head == "question_answering" else 3)
        built[name, head] = getattr(transformers, PREFIX[name] + HEADS[head])(config)
    return built


@pytest.mark.parametrize("name,head", [pytest.param(n, h, id=f"{n}-{h}", marks=() if (n, h) in QUICK
                                                    else pytest.mark.slow) for n, h in PAIRS])
def test_every_head_both_ways(name, head, hf_models, tmp_path):
    hf = hf_models[name, head]
    loaded, saved = check_both_ways(hf, tmp_path / "hf", tmp_path / "out", auto=AUTO[head],
                                    with_types=False, pad_id=hf.config.pad_token_id, first_id=3)
    print(f"PARITY {name} {head} hf->flaxzoo {loaded:.3g} flaxzoo->hf {saved:.3g}")
    model = from_pretrained(tmp_path / "out")
    assert type(model) is FLAX[head] and model.config.model_type == name


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PREFIX))
def test_scanned_layout_equals_the_unrolled_one(name, hf_models, tmp_path):
    """Stacked layers: the unrolled layout's parameters, saved tensors and outputs, and transformers' (masked LM)."""
    hf = hf_models[name, "masked_lm"]
    worst = check_encoder_layouts(hf, tmp_path / "hf", tmp_path / "out", with_types=False,
                                  pad_id=hf.config.pad_token_id, first_id=3)
    print(f"PARITY {name} masked_lm scanned hf->flaxzoo {worst:.3g}")


def test_architectures_and_config_translation():
    for family, name in ((distilbert.FAMILY, "distilbert"), (roberta.XLM_ROBERTA, "xlm-roberta")):
        for head, suffix in HEADS.items():
            found, cls = family_and_class({"model_type": name, "architectures": [PREFIX[name] + suffix]}, None)
            assert found is family and cls is FLAX[head]
    config = distilbert.FAMILY.config_from_hf(hf_config("distilbert").to_dict())
    assert (config.hidden_size, config.intermediate_size, config.type_vocab_size, config.pooler_activation,
            config.norm_eps, config.activation) == (32, 72, 0, "relu", 1e-12, "relu")
    hf = distilbert.FAMILY.config_to_hf(config)
    assert (hf["dim"], hf["n_layers"], hf["n_heads"], hf["hidden_dim"], hf["sinusoidal_pos_embds"],
            hf["tie_weights_"]) == (32, 2, 4, 72, False, True)
    xlmr = roberta.XLM_ROBERTA.config_from_hf(hf_config("xlm-roberta").to_dict())
    assert (xlmr.model_type, xlmr.position_offset, xlmr.type_vocab_size) == ("xlm-roberta", 2, 1)


def test_distilbert_takes_no_token_types(hf_models, tmp_path):
    hf_models["distilbert", "base"].save_pretrained(tmp_path)
    model = from_pretrained(tmp_path)
    assert model.pooler is None  # DistilBertModel has none
    ids = np.full((1, 4), 5)
    with pytest.raises(ValueError, match="token_type_ids given but this model has no token-type embeddings"):
        model(ids, None, np.zeros_like(ids))


@pytest.mark.parametrize("name,field,value,message", [
    ("distilbert", "sinusoidal_pos_embds", True, r"config\.json: sinusoidal_pos_embds=True is not supported"),
    ("distilbert", "tie_weights_", False, r"config\.json: tie_weights_=False with tie_word_embeddings=True"),
    ("distilbert", "activation", "quick_gelu", r"config\.json: activation='quick_gelu' is not supported"),
    ("xlm-roberta", "position_embedding_type", "relative_key",
     r"config\.json: position_embedding_type='relative_key' is not supported"),
])
def test_unsupported_config_values_are_refused(name, field, value, message, hf_models, tmp_path):
    hf_models[name, "base"].save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {field: value}))
    with pytest.raises(ValueError, match=message) as caught:
        from_pretrained(tmp_path)
    assert "\n" not in str(caught.value)
