"""ModernBERT against transformers: every head both ways (transformers → flaxzoo ``from_pretrained``, flaxzoo
``save_pretrained`` → transformers; the scanned layout proven equal to the unrolled one), on right-padded batches of
16 tokens with a local window of ``local_attention`` 4 (keys within 2 slots), layers global, local, local, so the
windows change the outputs; the two classifier poolings; and unpadding by packing (``flaxzoo.models.inference.packing``):
several sentences packed into rows with ``segment_ids`` give transformers' outputs for each sentence alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from flaxzoo.models.families import family_and_class
from flaxzoo.models.families.modernbert import (ModernBertForMaskedLM, ModernBertForQuestionAnswering,
                                                ModernBertForSequenceClassification,
                                                ModernBertForTokenClassification, ModernBertModel)
from flaxzoo.models.io import from_pretrained
from flaxzoo.models.inference.packing import pack_padded, unpack
from tests.encoder_parity import ATOL, check_both_ways, check_encoder_layouts, right_padded
from tests.family_parity import perturbed, tiered

SIZES = dict(vocab_size=120, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
             local_attention=4, global_attn_every_n_layers=3, max_position_embeddings=64, pad_token_id=0,
             bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
SEQ = 16
# head → (transformers class, Auto class, extra config: the biased variants cover the bias tensors' names)
HEADS = {
    "base": (transformers.ModernBertModel, transformers.AutoModel, {}),
    "masked_lm": (transformers.ModernBertForMaskedLM, transformers.AutoModelForMaskedLM, {}),
    "classifier_cls": (transformers.ModernBertForSequenceClassification,
                       transformers.AutoModelForSequenceClassification, dict(num_labels=3)),
    "classifier_mean": (transformers.ModernBertForSequenceClassification,
                        transformers.AutoModelForSequenceClassification,
                        dict(num_labels=3, classifier_pooling="mean", classifier_bias=True)),
    "token_classifier": (transformers.ModernBertForTokenClassification,
                         transformers.AutoModelForTokenClassification,
                         dict(num_labels=5, norm_bias=True, attention_bias=True, mlp_bias=True)),
    "question_answering": (transformers.ModernBertForQuestionAnswering,
                           transformers.AutoModelForQuestionAnswering, {}),
}
FLAX_CLASSES = {"base": ModernBertModel, "masked_lm": ModernBertForMaskedLM,
                "classifier_cls": ModernBertForSequenceClassification,
                "classifier_mean": ModernBertForSequenceClassification,
                "token_classifier": ModernBertForTokenClassification,
                "question_answering": ModernBertForQuestionAnswering}


def build(head: str, **changes) -> torch.nn.Module:
    cls, _, extra = HEADS[head]
    torch.manual_seed(0)
    return cls(transformers.ModernBertConfig(**(SIZES | extra | changes)))


@pytest.mark.parametrize("head", tiered(HEADS, ("masked_lm",)))
def test_head_both_ways(head, tmp_path):
    hf = build(head)
    loaded, saved = check_both_ways(hf, tmp_path / "hf", tmp_path / "out", auto=HEADS[head][1],
                                    with_types=False, seq=SEQ)
    print(f"modernbert/{head}: hf→flaxzoo {loaded:.2e}, flaxzoo→hf {saved:.2e}")


@pytest.mark.slow
def test_scanned_layout_equals_the_unrolled_one(tmp_path):
    """The global / local / local pattern under a scan (the window traced per layer, per-layer RoPE θ): the unrolled
    layout's parameters, saved tensors and outputs, and transformers' (biased token classifier: every tensor kind)."""
    worst = check_encoder_layouts(build("token_classifier"), tmp_path / "hf", tmp_path / "out", with_types=False,
                                  seq=SEQ)
    print(f"modernbert/token_classifier scanned: hf→flaxzoo {worst:.2e}")


def hf_logits(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.from_numpy(ids), attention_mask=None if mask is None else torch.from_numpy(mask))
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()


def test_the_windows_matter():
    """The batches above are longer than the window: a model whose local layers attend globally (same weights) gives
    other outputs, so the parity tests see the windows."""
    windowed = perturbed(build("masked_lm"))
    wide = build("masked_lm", local_attention=64)
    wide.load_state_dict(windowed.state_dict())
    ids, mask = right_padded(SIZES["vocab_size"], seq=SEQ)
    difference = np.abs(hf_logits(windowed, ids, mask) - hf_logits(wide.eval(), ids, mask))[mask.astype(bool)]
    assert difference.max() > 0.05


def test_config_round_trip_and_classes(tmp_path):
    hf = perturbed(build("classifier_mean"))
    hf.save_pretrained(tmp_path)
    model = from_pretrained(tmp_path)
    config = model.config
    assert config.sliding_window == SIZES["local_attention"] // 2 + 1 and not config.causal
    assert config.layer_types == ("full_attention", "sliding_attention", "sliding_attention")
    assert (config.classifier_pooling, config.head_bias, config.norm_bias) == ("mean", True, False)
    assert config.rope_theta == 160_000.0 and config.rope_local_theta == 10_000.0
    assert type(model) is ModernBertForSequenceClassification
    for head, cls in FLAX_CLASSES.items():
        architecture = HEADS[head][0].__name__
        assert family_and_class({"model_type": "modernbert", "architectures": [architecture]}, None)[1] is cls
    with pytest.raises(ValueError, match="token_type_ids holds non-zero"):
        model(np.ones((1, 4), np.int32), None, np.ones((1, 4), np.int32))
    family = family_and_class({"model_type": "modernbert"}, None)[0]
    one_rate = family.config_from_hf(hf.config.to_dict() | {"embedding_dropout": 0.1, "mlp_dropout": 0.1})
    assert one_rate.dropout == 0.1
    with pytest.raises(ValueError, match=r"embedding_dropout=0.1, mlp_dropout=0.2.*expected the non-zero ones equal"):
        family.config_from_hf(hf.config.to_dict() | {"embedding_dropout": 0.1, "mlp_dropout": 0.2})


def test_packed_sentences_give_each_sentence_alone(tmp_path):
    """Five sentences (3 to 15 tokens, padded to 16) packed into rows of 24 slots with segment_ids: each sentence's
    MLM logits are transformers' for that sentence alone, unpadded (attention, positions and windows stay inside
    each sentence)."""
    hf = perturbed(build("masked_lm"))
    hf.save_pretrained(tmp_path)
    model = from_pretrained(tmp_path)
    rng = np.random.RandomState(3)
    lengths = [15, 3, 9, 12, 6]
    ids = np.zeros((len(lengths), SEQ), np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n], mask[row, :n] = rng.randint(3, SIZES["vocab_size"], n), 1
    packed = pack_padded(ids, mask, length=24)
    assert packed.input_ids.shape[0] < len(lengths)  # several sentences share a row
    assert packed.segment_ids.max() >= 2
    logits = unpack(np.asarray(model(packed.input_ids, segment_ids=packed.segment_ids)), packed)
    worst = 0.0
    for row, n in enumerate(lengths):
        alone = hf_logits(hf, ids[row:row + 1, :n])[0]
        worst = max(worst, float(np.abs(logits[row, :n] - alone).max()))
        assert np.all(logits[row, n:] == 0)
    print(f"modernbert packed (5 sentences in {packed.input_ids.shape[0]} rows): max |Δ| {worst:.2e}")
    assert worst <= ATOL


def test_pack_padded_refuses_and_round_trips():
    ids = np.arange(1, 13).reshape(3, 4)
    mask = np.array([[1, 1, 0, 0], [0, 1, 1, 1], [1, 0, 0, 0]])  # right- and left-padded rows
    packed = pack_padded(ids, mask, length=4)
    assert packed.segment_ids.tolist() == [[1, 1, 2, 0], [1, 1, 1, 0]]
    assert unpack(packed.input_ids, packed).tolist() == (ids * mask).tolist()
    with pytest.raises(ValueError, match="does not fit rows of length=2"):
        pack_padded(ids, mask, length=2)
    with pytest.raises(ValueError, match="expected only 0 and 1"):
        pack_padded(ids, mask * 2)
