"""T5-layout encoder-decoders (T5 v1.0, v1.1 / Flan-T5, mT5, umT5) against transformers, both ways, on batches whose
sources and targets are both padded, unrolled and scanned, on configs of several depths (encoder and decoder apart),
head sizes, bucket counts, tied and untied heads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from family_parity import assert_same_beams, beam_settings, frequent_token, tiered
from flaxzoo.models.architectures.encoder_decoder.model import (Seq2SeqEncoderModel, Seq2SeqForConditionalGeneration,
                                                                Seq2SeqModel)
from flaxzoo.models.config import FieldError
from flaxzoo.models.families import PRESETS, get_preset
from flaxzoo.models.inference.generate import generate
from flaxzoo.models.io import from_pretrained, save_pretrained
from flaxzoo.models.modeling import param_count

# Each case: transformers config class, its fields. Depths differ between encoder and decoder; d_kv is not
# d_model / heads; bucket counts and distances differ; v1.0 ties and scales, v1.1 / mT5 / umT5 do not.
CASES = {
    "t5-v1.0": (transformers.T5Config, dict(vocab_size=97, d_model=24, d_kv=10, d_ff=40, num_layers=3,
                                             num_decoder_layers=2, num_heads=3, relative_attention_num_buckets=8,
                                             relative_attention_max_distance=20, feed_forward_proj="relu")),
    "t5-v1.1": (transformers.T5Config, dict(vocab_size=89, d_model=32, d_kv=8, d_ff=48, num_layers=2,
                                             num_decoder_layers=3, num_heads=4, relative_attention_num_buckets=16,
                                             relative_attention_max_distance=12, feed_forward_proj="gated-gelu",
                                             tie_word_embeddings=False)),
    "mt5": (transformers.MT5Config, dict(vocab_size=101, d_model=16, d_kv=6, d_ff=36, num_layers=2,
                                         num_decoder_layers=2, num_heads=2, relative_attention_num_buckets=12,
                                         relative_attention_max_distance=16, feed_forward_proj="gated-gelu",
                                         tie_word_embeddings=False)),
    "umt5": (transformers.UMT5Config, dict(vocab_size=83, d_model=20, d_kv=5, d_ff=30, num_layers=2,
                                           num_decoder_layers=3, num_heads=4, relative_attention_num_buckets=10,
                                           relative_attention_max_distance=14, feed_forward_proj="gated-gelu",
                                           tie_word_embeddings=False)),
}
PREFIX = {"t5-v1.0": "T5", "t5-v1.1": "T5", "mt5": "MT5", "umt5": "UMT5"}
ATOL = 1e-4


def build(case: str, head: str, seed: int = 0, **changes) -> torch.nn.Module:
    config_cls, fields = CASES[case]
    torch.manual_seed(seed)
    config = config_cls(**(fields | changes), dropout_rate=0.0, decoder_start_token_id=0)
    model = getattr(transformers, f"{PREFIX[case]}{head}")(config)
    if not (fields | changes).get("tie_word_embeddings", True) and hasattr(model, "lm_head"):
        # transformers 5 ties the head to the token table at construction whatever the config says: untie it, as a
        # Flan-T5 checkpoint's own lm_head.weight does when loaded
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
    with torch.no_grad():  # weights whose outputs vary with the input and the position: T5's init at these sizes
        for name, p in model.named_parameters():  # gives near-constant predictions, and leaves the bias tables small
            if "relative_attention_bias" in name:
                p.normal_(0.0, 1.0)
            elif p.ndim == 2:
                p.normal_(0.0, p.shape[-1] ** -0.5 * (2.0 if name in ("shared.weight", "lm_head.weight") else 1.0))
            else:
                p.normal_(1.0, 0.2)
    return model.eval()


def padded_batch(vocab: int, rows: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ids and mask: row i keeps ``length - 2i`` tokens (at least 1)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, vocab, size=(rows, length)).astype(np.int64)
    mask = np.zeros((rows, length), np.int64)
    for i in range(rows):
        mask[i, :max(length - 2 * i, 1)] = 1
    return np.where(mask == 1, ids, 0), mask


def hf_logits(model, ids, mask, target, target_mask) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    decoder_input_ids=torch.tensor(target), decoder_attention_mask=torch.tensor(target_mask))
    return out.logits.numpy()


def real_max_difference(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    return float(np.abs(a - b)[mask.astype(bool)].max())


LAYOUTS = [(case, scan) for case in sorted(CASES) for scan in (False, True)]


@pytest.mark.parametrize("case, scan", tiered(LAYOUTS, [("t5-v1.0", False), ("umt5", True)]))
def test_conditional_generation_both_ways(case, scan, tmp_path):
    hf = build(case, "ForConditionalGeneration")
    hf.save_pretrained(tmp_path / "hf")
    vocab = CASES[case][1]["vocab_size"]
    ids, mask = padded_batch(vocab, 3, 19, seed=1)
    target, target_mask = padded_batch(vocab, 3, 11, seed=2)
    expected = hf_logits(hf, ids, mask, target, target_mask)
    model = from_pretrained(tmp_path / "hf", scan_layers=scan)
    assert isinstance(model, Seq2SeqForConditionalGeneration)
    got = np.asarray(model(ids, mask, target, target_mask))
    loaded = real_max_difference(got, expected, target_mask)
    assert loaded < ATOL, f"hf -> flaxzoo logits differ by {loaded:.2e}"
    save_pretrained(model, tmp_path / "out")
    back = getattr(transformers, f"{PREFIX[case]}ForConditionalGeneration").from_pretrained(tmp_path / "out").eval()
    saved = real_max_difference(hf_logits(back, ids, mask, target, target_mask), expected, target_mask)
    assert saved < ATOL, f"flaxzoo -> hf logits differ by {saved:.2e}"


def test_an_untied_head_saved_by_transformers_5_loads_untied(tmp_path):
    """transformers 5 writes ``tie_word_embeddings=true`` into a v1.1 model's ``config.json`` and the head's own
    tensor beside it: flaxzoo reads the head's tying from the tensors (and a tied one from their absence)."""
    untied = build("t5-v1.1", "ForConditionalGeneration")
    untied.save_pretrained(tmp_path / "untied")
    assert json.loads((tmp_path / "untied" / "config.json").read_text())["tie_word_embeddings"] is True
    assert not from_pretrained(tmp_path / "untied").config.tie_word_embeddings
    assert from_pretrained(tmp_path / "untied").lm_head.kernel is not None
    tied = build("t5-v1.0", "ForConditionalGeneration")
    tied.save_pretrained(tmp_path / "tied")
    assert from_pretrained(tmp_path / "tied").config.tie_word_embeddings


@pytest.mark.parametrize("case", tiered(["t5-v1.0", "umt5"], ["umt5"]))
def test_encoder_model_and_base_model(case, tmp_path):
    """``T5EncoderModel`` (its own checkpoint, and the encoder of a full one) and ``T5Model``'s decoder states."""
    hf = build(case, "EncoderModel")
    hf.save_pretrained(tmp_path / "enc")
    vocab = CASES[case][1]["vocab_size"]
    ids, mask = padded_batch(vocab, 2, 13, seed=3)
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    model = from_pretrained(tmp_path / "enc")
    assert isinstance(model, Seq2SeqEncoderModel)
    got = np.asarray(model(ids, mask).hidden)
    assert real_max_difference(got, expected, mask) < ATOL

    full = build(case, "Model")
    full.save_pretrained(tmp_path / "base")
    target, target_mask = padded_batch(vocab, 2, 7, seed=4)
    with torch.no_grad():
        expected = full(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                        decoder_input_ids=torch.tensor(target),
                        decoder_attention_mask=torch.tensor(target_mask)).last_hidden_state.numpy()
    base = from_pretrained(tmp_path / "base")
    assert isinstance(base, Seq2SeqModel)
    got = np.asarray(base(ids, mask, target, target_mask).hidden)
    assert real_max_difference(got, expected, target_mask) < ATOL


def hf_generate(model, ids, mask, new_tokens: int, **kwargs) -> np.ndarray:
    kwargs.setdefault("eos_token_id", None)  # no stop and no token suppressed: flaxzoo is given no stop id either
    kwargs.setdefault("pad_token_id", 0)
    with torch.no_grad():
        return model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                              max_new_tokens=new_tokens, **kwargs).numpy()


@pytest.mark.parametrize("case", tiered(["t5-v1.1", "umt5", "t5-v1.0"], ["t5-v1.1"]))
def test_greedy_generation_equals_transformers(case, tmp_path):
    """24 new tokens for a padded batch of sources (no stop id on either side), the cross-attention keys and values
    computed once. The decoder is never deeper
    than the encoder here: transformers sizes its generation cache by the encoder's depth."""
    fields = CASES[case][1]
    hf = build(case, "ForConditionalGeneration", seed=5,
               num_decoder_layers=min(fields["num_layers"], fields["num_decoder_layers"]))
    hf.save_pretrained(tmp_path / "hf")
    vocab = CASES[case][1]["vocab_size"]
    ids, mask = padded_batch(vocab, 3, 14, seed=6)
    expected = hf_generate(hf, ids, mask, 24, do_sample=False, num_beams=1)
    model = from_pretrained(tmp_path / "hf", scan_layers=case == "umt5")
    got = np.asarray(generate(model, ids, 24, attention_mask=mask))
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("case", tiered(["t5-v1.1", "umt5"], ["umt5"]))
def test_beam_search_equals_transformers(case, tmp_path):
    """Beam search on a padded batch of sources (beam counts, length penalties and early-stopping rules: every
    setting on one case, one on the other; a stop id the model emits) equals transformers' ``generate``, start id
    included."""
    fields = CASES[case][1]
    hf = build(case, "ForConditionalGeneration", seed=5,
               num_decoder_layers=min(fields["num_layers"], fields["num_decoder_layers"]))
    hf.save_pretrained(tmp_path / "hf")
    ids, mask = padded_batch(fields["vocab_size"], 3, 14, seed=6)
    stop = frequent_token(hf_generate(hf, ids, mask, 20, do_sample=False, num_beams=1)[:, 1:])
    model = from_pretrained(tmp_path / "hf")
    for beams, penalty, early in beam_settings(case, ["t5-v1.1", "umt5"], "umt5"):
        theirs = hf_generate(hf, ids, mask, 20, do_sample=False, num_beams=beams, length_penalty=penalty,
                             early_stopping=early, eos_token_id=stop)
        ours = np.asarray(generate(model, ids, 20, attention_mask=mask, num_beams=beams, length_penalty=penalty,
                                   early_stopping=early, eos_token_id=stop))
        assert (ours[:, 0] == 0).all() and (theirs[:, 0] == 0).all()
        assert_same_beams(ours[:, 1:], theirs[:, 1:], stop, fill=0)


T5_CONFIGS = {"t5": transformers.T5Config, "mt5": transformers.MT5Config, "umt5": transformers.UMT5Config}


@pytest.mark.slow
def test_preset_parameter_counts_equal_transformers():
    """The published sizes of every T5-layout preset (T5, Flan-T5, mT5, umT5), transformers' models built on the meta
    device (no memory) from the preset's values, flaxzoo's abstractly. transformers counts a shared tensor once
    (``shared`` is the encoder's and the decoder's token table). Its T5 / mT5 / umT5 configs force
    ``tie_word_embeddings=True`` (``tie_word_embeddings=False`` only turns the decoder output's scaling off), so a
    model built from a config ties ``lm_head`` to ``shared`` even for an untied checkpoint (Flan-T5, mT5, umT5), whose
    published head is its own ``[vocab, d_model]`` matrix (transformers unties it when such a checkpoint loads): for
    an untied preset the head is counted once more whenever transformers' ``lm_head`` is ``shared``."""
    presets = {name: config for name, config in PRESETS.items()
               if config.model_type in T5_CONFIGS and "tiny" not in name}
    assert {"t5-small", "flan-t5-base", "mt5-small", "umt5-small"} <= set(presets)
    for name, config in presets.items():
        fields = dict(vocab_size=config.vocab_size, d_model=config.hidden_size, d_kv=config.head_dim,
                      d_ff=config.intermediate_size, num_layers=config.num_layers,
                      num_decoder_layers=config.num_decoder_layers, num_heads=config.num_heads,
                      relative_attention_num_buckets=config.position_bias_buckets,
                      relative_attention_max_distance=config.position_bias_max_distance,
                      feed_forward_proj="gated-gelu" if config.mlp_gated else "relu",
                      tie_word_embeddings=config.tie_word_embeddings)
        prefix = {"t5": "T5", "mt5": "MT5", "umt5": "UMT5"}[config.model_type]
        with torch.device("meta"):
            hf = getattr(transformers, f"{prefix}ForConditionalGeneration")(T5_CONFIGS[config.model_type](**fields))
        theirs = sum(p.numel() for p in hf.parameters())
        if not config.tie_word_embeddings and hf.lm_head.weight is hf.shared.weight:
            theirs += hf.lm_head.weight.numel()
        assert param_count(config, Seq2SeqForConditionalGeneration) == theirs, name


@pytest.mark.parametrize("changes, field", [
    (dict(num_decoder_layers=0), "num_decoder_layers"),
    (dict(position_bias_buckets=2), "position_bias_buckets"),
    (dict(position_bias_buckets=32, position_bias_max_distance=10), "position_bias_buckets"),
    (dict(position_bias_buckets=None, position_bias_per_layer=True), "position_bias_per_layer"),
    (dict(attention_impl="splash"), "attention_impl"),
    (dict(scale_decoder_output=1), "scale_decoder_output"),
    (dict(decoder_start_token_id=5000), "decoder_start_token_id"),
])
def test_encoder_decoder_fields_are_checked_by_name(changes, field):
    with pytest.raises(FieldError, match=field):
        get_preset("t5-tiny", **changes)


def test_bad_calls_are_refused_by_name():
    model = Seq2SeqForConditionalGeneration(get_preset("t5-tiny"), rngs=nnx.Rngs(0))
    ids = np.array([[5, 6, 7]])
    with pytest.raises(ValueError, match=r"decoder_input_ids is None"):
        model(ids, None, None)
    with pytest.raises(ValueError, match=r"decoder_input_ids has 2 rows and the source 1"):
        model(ids, None, np.array([[0], [0]]))
    with pytest.raises(ValueError, match=r"need the source's segment_ids"):
        model(ids, None, np.array([[0, 4]]), decoder_segment_ids=np.array([[1, 1]]))
    with pytest.raises(ValueError, match=r"source row 1 has no real tokens"):
        generate(model, np.array([[5, 6], [7, 8]]), 4, attention_mask=np.array([[1, 1], [0, 0]]))
    with pytest.raises(ValueError, match=r"needs an encoder-decoder config"):
        Seq2SeqForConditionalGeneration(get_preset("llama-tiny"), rngs=nnx.Rngs(0))
