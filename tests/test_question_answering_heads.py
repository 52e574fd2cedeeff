"""Question answering (``BertForQuestionAnswering``: span start / end logits) for BERT and RoBERTa against
transformers, both ways, on right-padded sentence pairs (the scanned layout proven equal to the unrolled one)."""

import pytest
import torch
import transformers

from flaxzoo.models import BertForQuestionAnswering
from flaxzoo.models.families import family_and_class
from tests.encoder_parity import check_both_ways, check_encoder_layouts

SIZES = dict(vocab_size=300, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=80,
             max_position_embeddings=64)


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "bert":
        return transformers.BertForQuestionAnswering(transformers.BertConfig(**SIZES, hidden_act="gelu_new"))
    return transformers.RobertaForQuestionAnswering(transformers.RobertaConfig(**SIZES, type_vocab_size=1,
                                                                               pad_token_id=1))


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_span_logits_both_ways(name, tmp_path):
    hf = build(name)
    check_both_ways(hf, tmp_path / "hf", tmp_path / "out", auto=transformers.AutoModelForQuestionAnswering,
                    with_types=name == "bert", pad_id=hf.config.pad_token_id, first_id=3)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_scanned_layout_equals_the_unrolled_one(name, tmp_path):
    """Stacked layers: the unrolled layout's parameters, saved tensors and span logits, and transformers'."""
    hf = build(name)
    check_encoder_layouts(hf, tmp_path / "hf", tmp_path / "out", with_types=name == "bert",
                          pad_id=hf.config.pad_token_id, first_id=3)


def test_architectures_name_the_span_head():
    for architecture, model_type in (("BertForQuestionAnswering", "bert"), ("RobertaForQuestionAnswering", "roberta")):
        _, cls = family_and_class({"model_type": model_type, "architectures": [architecture]}, None)
        assert cls is BertForQuestionAnswering
    assert BertForQuestionAnswering.task == "question_answering"
