"""DeBERTa-v2 / v3 (``deberta-v2``: disentangled relative attention) against transformers, both ways, on right-padded
batches longer than the relative span (so that log buckets and the clipped distances matter; the scanned layout
proven equal to the unrolled one per version);
the attention backends that run its additive bias; and the config values flaxzoo refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from flaxzoo.models import BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification
from flaxzoo.models import BertForTokenClassification, BertModel, TransformerConfig, get_preset
from flaxzoo.models.config import FieldError
from flaxzoo.models.families import family_and_class, family_of
from flaxzoo.models.io import from_pretrained
from flaxzoo.models.layers.attention_core import attention_backend, choose_backend
from flaxzoo.models.layers.relative_attention import log_bucket_position
from tests.encoder_parity import (ATOL, check_both_ways, check_encoder_layouts, flax_outputs, hf_outputs,
                                  max_difference, right_padded)
from tests.family_parity import perturbed

SIZES = dict(vocab_size=300, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=80,
             max_position_embeddings=64)
# v3: no absolute positions or token types, 16 log buckets up to distance 64, shared keys, normed table.
V3 = dict(SIZES, relative_attention=True, position_buckets=16, max_relative_positions=-1, share_att_key=True,
          norm_rel_ebd="layer_norm", pos_att_type=["p2c", "c2p"], position_biased_input=False, type_vocab_size=0,
          pooler_hidden_act="gelu")
# v2: absolute positions and token types, exact distances clipped at 8, own positional projections, tanh pooler.
V2 = dict(SIZES, relative_attention=True, max_relative_positions=8, pos_att_type="c2p|p2c", type_vocab_size=2,
          pooler_hidden_act="tanh", hidden_act="gelu_new")
CONFIGS = {"v3": V3, "v2": V2}
HEADS = {
    "DebertaV2Model": transformers.AutoModel,
    "DebertaV2ForMaskedLM": transformers.AutoModelForMaskedLM,
    "DebertaV2ForSequenceClassification": transformers.AutoModelForSequenceClassification,
    "DebertaV2ForTokenClassification": transformers.AutoModelForTokenClassification,
    "DebertaV2ForQuestionAnswering": transformers.AutoModelForQuestionAnswering,
}
SEQ = 24  # longer than the v2 span (8) and the v3 buckets' exact range (8)


def build(version: str, head: str, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    return getattr(transformers, head)(transformers.DebertaV2Config(**CONFIGS[version], **extra))


QUICK = (("v3", "DebertaV2ForMaskedLM"),)  # the quick tier's case (``-m "not slow"``)
CASES = [pytest.param(version, head, id=f"{version}-{head}", marks=() if (version, head) in QUICK else pytest.mark.slow)
         for version in sorted(CONFIGS) for head in sorted(HEADS)]


@pytest.mark.parametrize("version,head", CASES)
def test_heads_both_ways(version, head, tmp_path):
    loaded, saved = check_both_ways(build(version, head), tmp_path / "hf", tmp_path / "out", auto=HEADS[head],
                                    with_types=version == "v2", seq=SEQ)
    print(f"deberta-v2 {version} {head}: hf->flaxzoo {loaded:.2e}, flaxzoo->hf {saved:.2e}")


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(CONFIGS))
def test_scanned_layout_equals_the_unrolled_one(version, tmp_path):
    """The relative attention (its table, shared or own positional projections) under a scan: the unrolled layout's
    parameters, saved tensors and outputs, and transformers' outputs."""
    worst = check_encoder_layouts(build(version, "DebertaV2ForMaskedLM"), tmp_path / "hf", tmp_path / "out",
                                  with_types=version == "v2", seq=SEQ)
    print(f"deberta-v2 {version} masked LM scanned: hf->flaxzoo {worst:.2e}")


def test_non_legacy_mlm_head_reads_as_the_legacy_one(tmp_path):
    """``legacy=false``'s ``lm_predictions.lm_head.*`` load into the same head; flaxzoo writes the legacy names."""
    hf = build("v3", "DebertaV2ForMaskedLM", legacy=False)
    assert any(name.startswith("lm_predictions.") for name in hf.state_dict())
    check_both_ways(hf, tmp_path / "hf", tmp_path / "out", auto=transformers.AutoModelForMaskedLM, scan=False,
                    with_types=False, seq=SEQ)


def test_architectures_and_config():
    family = family_of("deberta-v2")
    for architecture, cls in (("DebertaV2Model", BertModel), ("DebertaV2ForMaskedLM", BertForMaskedLM),
                              ("DebertaV2ForSequenceClassification", BertForSequenceClassification),
                              ("DebertaV2ForTokenClassification", BertForTokenClassification),
                              ("DebertaV2ForQuestionAnswering", BertForQuestionAnswering)):
        assert family_and_class({"model_type": "deberta-v2", "architectures": [architecture]}, None)[1] is cls
    config = family.config_from_hf(transformers.DebertaV2Config(**V3).to_dict())
    assert (config.position, config.type_vocab_size, config.relative_span, config.relative_max_distance) == \
        ("none", 0, 16, 64)
    assert config.relative_attention_types == ("p2c", "c2p") and config.relative_scale_factor == 3
    assert config.share_att_key and config.relative_embedding_norm and config.pooler_activation == "gelu"
    v2 = family.config_from_hf(transformers.DebertaV2Config(**V2).to_dict())
    assert (v2.position, v2.relative_span, v2.position_buckets, v2.share_att_key) == ("learned", 8, None, False)


def test_log_buckets_match_transformers():
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position
    distances = np.arange(-600, 601)
    for buckets, max_position in ((256, 512), (16, 64), (8, 24)):
        want = make_log_bucket_position(torch.from_numpy(distances), buckets, max_position).long().numpy()
        got = np.asarray(log_bucket_position(distances, buckets, max_position))
        np.testing.assert_array_equal(got, want)
        assert got.max() > buckets // 2  # the logarithmic range was reached


@pytest.mark.parametrize("impl", ["fused", "softmax"])
def test_fused_and_softmax_cores_run_the_bias(impl, tmp_path):
    """The same weights through ``jax.nn.dot_product_attention`` (XLA, with the bias) and the closed-form kernel:
    transformers' outputs either way."""
    hf = perturbed(build("v3", "DebertaV2ForTokenClassification"))
    hf.save_pretrained(tmp_path)
    model = from_pretrained(tmp_path)
    other = type(model)(model.config.replace(attention_impl=impl), rngs=nnx.Rngs(1))
    nnx.update(other, nnx.state(model, nnx.Param))
    other.eval()
    ids, mask = right_padded(300, seq=SEQ)
    assert max_difference(flax_outputs(other, ids, mask, None), hf_outputs(hf, ids, mask, None), mask) <= ATOL


def test_backends_that_take_the_bias():
    config = get_preset("deberta-v3-small")
    backend, reason = attention_backend(config, q_len=128, masked=True, platform="tpu")
    assert backend == "xla" and "bias" in reason and "splash" in reason
    backend, reason = attention_backend(config, q_len=128, masked=True, platform="gpu")
    assert backend == "xla" and "gpu_flash" in reason and "bias" in reason
    config16 = config.replace(dtype="bfloat16")
    backend, reason = attention_backend(config16, q_len=128, masked=False, platform="gpu")
    assert backend == "xla" and "cuDNN does not take an additive bias" in reason
    assert attention_backend(config, q_len=128, masked=True, platform="cpu")[0] == "softmax"
    # the same calls without relative attention take the kernels
    plain = config.replace(relative_attention=False, relative_attention_types=(), position_buckets=None,
                           share_att_key=False, relative_embedding_norm=False)
    assert attention_backend(plain, q_len=128, masked=True, platform="tpu")[0] == "splash"
    assert attention_backend(plain.replace(dtype="bfloat16"), q_len=128, platform="gpu")[0] == "cudnn"
    for kernel in ("splash", "gpu_flash"):
        with pytest.raises(FieldError, match=f"attention_impl='{kernel}' takes no additive bias"):
            config.replace(attention_impl=kernel)
        assert choose_backend(kernel, dtype="float32", head_dim=64, heads=12, kv_heads=12, q_len=128, k_len=128,
                              masked=True, biased=True, is_causal=False, dropout=False, platform="tpu")[0] != kernel


@pytest.mark.parametrize("field, value, message", [
    ("conv_kernel_size", 3, "conv_kernel_size=3"),
    ("embedding_size", 32, "embedding_size=32"),
    ("norm_rel_ebd", "layer_norm|bias", "norm_rel_ebd="),
    ("pos_att_type", ["c2p", "p2p"], "pos_att_type="),
    ("pooler_hidden_size", 24, "pooler_hidden_size=24"),
])
def test_refused_config_values(field, value, message):
    hf = transformers.DebertaV2Config(**V3).to_dict() | {field: value}
    with pytest.raises(ValueError, match=message):
        family_of("deberta-v2").config_from_hf(hf)


def test_config_validation():
    base = dict(vocab_size=64, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64, causal=False,
                model_type="deberta-v2", max_position_embeddings=64)
    with pytest.raises(FieldError, match="needs relative_attention=True"):
        TransformerConfig(**base, relative_attention_types=("c2p",))
    with pytest.raises(FieldError, match="relative_attention_types="):
        TransformerConfig(**base, relative_attention=True, relative_attention_types=("c2p", "c2p"))
    with pytest.raises(FieldError, match="only encoders"):
        TransformerConfig(**(base | dict(causal=True)), relative_attention=True)
    with pytest.raises(FieldError, match="position_buckets=128"):
        TransformerConfig(**base, relative_attention=True, position_buckets=128)
    with pytest.raises(FieldError, match="query_scale=0.5 with relative_attention=True"):
        TransformerConfig(**base, relative_attention=True, query_scale=0.5)
    config = TransformerConfig(**base, relative_attention=True, relative_attention_types=["c2p"])
    assert config.relative_attention_types == ("c2p",) and config.relative_span == 64
