"""BART-layout encoder-decoders (BART, mBART) against transformers, both ways: logits on batches whose sources and
targets are both padded, unrolled and scanned, on configs of several depths (encoder and decoder apart), head counts,
widths, with and without ``scale_embedding``; left-padded sources (transformers numbers every slot: flaxzoo's
``slot_positions``); ``BartModel``'s decoder states; ``BartForSequenceClassification``'s logits; greedy and beam
generation token for token; parameter counts. The quick tier runs each test's first case (beam search only in the
slow tier).

transformers' BART configs carry generation defaults that flaxzoo's ``generate`` does not apply (it applies none of a
config's): ``forced_eos_token_id`` (EOS forced at the last step), ``forced_bos_token_id``, ``no_repeat_ngram_size``,
``num_beams``, ``length_penalty``, ``early_stopping``, ``min_length`` / ``max_length`` (the published checkpoints' task
settings). The tests set each of them explicitly on transformers' side.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from family_parity import assert_same_beams, beam_settings, frequent_token
from flaxzoo.models.architectures.encoder_decoder.model import (Seq2SeqForConditionalGeneration,
                                                                Seq2SeqForSequenceClassification, Seq2SeqModel)
from flaxzoo.models.families import family_of, get_preset
from flaxzoo.models.inference.generate import generate
from flaxzoo.models.io import from_pretrained, save_pretrained
from flaxzoo.models.modeling import param_count

transformers.logging.set_verbosity_error()

IDS = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
           forced_bos_token_id=None, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
# Each case: transformers config class, its fields. Depths differ between encoder and decoder (both ways), and so
# do widths, head counts and scale_embedding between cases.
CASES = {
    "bart": (transformers.BartConfig, dict(vocab_size=97, d_model=32, encoder_layers=3, decoder_layers=2,
                                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
                                           decoder_ffn_dim=48, max_position_embeddings=64, scale_embedding=False)),
    "bart-scaled": (transformers.BartConfig, dict(vocab_size=89, d_model=24, encoder_layers=2, decoder_layers=3,
                                                  encoder_attention_heads=3, decoder_attention_heads=3,
                                                  encoder_ffn_dim=40, decoder_ffn_dim=40, max_position_embeddings=48,
                                                  scale_embedding=True, activation_function="gelu")),
    "mbart": (transformers.MBartConfig, dict(vocab_size=101, d_model=16, encoder_layers=3, decoder_layers=2,
                                             encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=36,
                                             decoder_ffn_dim=36, max_position_embeddings=64, scale_embedding=True)),
}
PREFIX = {"bart": "Bart", "bart-scaled": "Bart", "mbart": "MBart"}
PAD, EOS = 1, 2
ATOL = 1e-4


def build(case: str, head: str, seed: int = 0, **changes) -> torch.nn.Module:
    """A transformers model of ``case`` with weights whose outputs vary with the input and the position (its own
    init at these sizes gives near-constant predictions); ``final_logits_bias`` random too."""
    config_cls, fields = CASES[case]
    torch.manual_seed(seed)
    model = getattr(transformers, f"{PREFIX[case]}{head}")(config_cls(**(fields | IDS | changes)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0.0, p.shape[-1] ** -0.5 * (2.0 if "shared" in name else 1.0))
            elif name.endswith("bias"):
                p.normal_(0.0, 0.2)
            else:
                p.normal_(1.0, 0.2)
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_(0.0, 0.5)
    return model.eval()


def padded_batch(vocab: int, rows: int, length: int, seed: int, *, left: bool = False, eos: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Right- (or left-) padded ids and mask: row i keeps ``length - 2i`` tokens (at least 2); ``eos``: each row's
    last real token is EOS."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, size=(rows, length)).astype(np.int64)
    mask = np.zeros((rows, length), np.int64)
    for i in range(rows):
        keep = max(length - 2 * i, 2)
        if left:
            mask[i, length - keep:] = 1
        else:
            mask[i, :keep] = 1
        if eos:
            ids[i, (length - 1) if left else keep - 1] = EOS
    return np.where(mask == 1, ids, PAD), mask


def hf_outputs(model, ids, mask, target=None, target_mask=None) -> np.ndarray:
    kwargs = {} if target is None else dict(decoder_input_ids=torch.tensor(target),
                                            decoder_attention_mask=torch.tensor(target_mask))
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), **kwargs)
    return (out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits).numpy()


def real_max_difference(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    return float(np.abs(np.asarray(a) - b)[mask.astype(bool)].max())


@pytest.mark.slow_variants
@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_conditional_generation_both_ways(case, scan, tmp_path):
    hf = build(case, "ForConditionalGeneration")
    hf.save_pretrained(tmp_path / "hf")
    vocab = CASES[case][1]["vocab_size"]
    ids, mask = padded_batch(vocab, 3, 19, seed=1)
    target, target_mask = padded_batch(vocab, 3, 11, seed=2)
    expected = hf_outputs(hf, ids, mask, target, target_mask)
    model = from_pretrained(tmp_path / "hf", scan_layers=scan)
    assert isinstance(model, Seq2SeqForConditionalGeneration)
    loaded = real_max_difference(model(ids, mask, target, target_mask), expected, target_mask)
    assert loaded < ATOL, f"hf -> flaxzoo logits differ by {loaded:.2e}"
    save_pretrained(model, tmp_path / "out")
    back = getattr(transformers, f"{PREFIX[case]}ForConditionalGeneration").from_pretrained(tmp_path / "out").eval()
    saved = real_max_difference(hf_outputs(back, ids, mask, target, target_mask), expected, target_mask)
    assert saved < ATOL, f"flaxzoo -> hf logits differ by {saved:.2e}"
    print(f"\n  {case} {'scanned' if scan else 'unrolled'}: max |logit difference| load {loaded:.2e}, "
          f"save {saved:.2e}")


@pytest.mark.slow_variants
@pytest.mark.parametrize("case", ["bart", "mbart"])
def test_left_padded_sources(case, tmp_path):
    """transformers numbers a left-padded source's slots (its first real token at slot p gets position p + 2):
    ``slot_positions`` gives the same logits."""
    hf = build(case, "ForConditionalGeneration", seed=3)
    hf.save_pretrained(tmp_path / "hf")
    vocab = CASES[case][1]["vocab_size"]
    ids, mask = padded_batch(vocab, 3, 15, seed=4, left=True)
    target, target_mask = padded_batch(vocab, 3, 9, seed=5)
    expected = hf_outputs(hf, ids, mask, target, target_mask)
    model = from_pretrained(tmp_path / "hf")
    assert model.config.slot_positions
    difference = real_max_difference(model(ids, mask, target, target_mask), expected, target_mask)
    assert difference < ATOL, f"left-padded sources: logits differ by {difference:.2e}"


@pytest.mark.slow_variants
@pytest.mark.parametrize("case", ["bart-scaled", "mbart"])
def test_base_model_decoder_states(case, tmp_path):
    hf = build(case, "Model", seed=6)
    hf.save_pretrained(tmp_path / "hf")
    vocab = CASES[case][1]["vocab_size"]
    ids, mask = padded_batch(vocab, 2, 13, seed=7)
    target, target_mask = padded_batch(vocab, 2, 7, seed=8)
    expected = hf_outputs(hf, ids, mask, target, target_mask)
    model = from_pretrained(tmp_path / "hf")
    assert isinstance(model, Seq2SeqModel) and type(model) is Seq2SeqModel
    difference = real_max_difference(model(ids, mask, target, target_mask).hidden, expected, target_mask)
    assert difference < ATOL, f"decoder states differ by {difference:.2e}"
    save_pretrained(model, tmp_path / "out")
    back = getattr(transformers, f"{PREFIX[case]}Model").from_pretrained(tmp_path / "out").eval()
    assert real_max_difference(hf_outputs(back, ids, mask, target, target_mask), expected, target_mask) < ATOL


@pytest.mark.slow_variants
@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("case", ["bart", "mbart"])
def test_sequence_classification(case, scan, tmp_path):
    """The decoder's state at each row's last EOS (decoder inputs: the source shifted right, transformers' rule for
    each family), through dense + tanh + out_proj; both ways."""
    hf = build(case, "ForSequenceClassification", seed=9, num_labels=3)
    hf.save_pretrained(tmp_path / "hf")
    vocab = CASES[case][1]["vocab_size"]
    ids, mask = padded_batch(vocab, 3, 12, seed=10, eos=True)
    expected = hf_outputs(hf, ids, mask)
    model = from_pretrained(tmp_path / "hf", scan_layers=scan)
    assert isinstance(model, Seq2SeqForSequenceClassification)
    got = np.asarray(model(ids, mask))
    assert got.shape == (3, 3)
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)
    save_pretrained(model, tmp_path / "out")
    back = getattr(transformers, f"{PREFIX[case]}ForSequenceClassification").from_pretrained(tmp_path / "out")
    np.testing.assert_allclose(hf_outputs(back.eval(), ids, mask), expected, rtol=0, atol=ATOL)


def test_classifier_reads_each_rows_last_eos_and_refuses_a_row_without_one(tmp_path):
    """Rows with different EOS counts (transformers refuses the batch): each row as transformers classifies it
    alone; a row without EOS is a ValueError."""
    hf = build("bart", "ForSequenceClassification", seed=11, num_labels=2)
    hf.save_pretrained(tmp_path / "hf")
    ids, mask = padded_batch(97, 2, 10, seed=12, eos=True)
    ids[0, 3] = EOS  # row 0 holds two EOS tokens, row 1 one
    model = from_pretrained(tmp_path / "hf")
    got = np.asarray(model(ids, mask))
    for row in range(2):
        np.testing.assert_allclose(got[row], hf_outputs(hf, ids[row:row + 1], mask[row:row + 1])[0], atol=ATOL)
    ids[1, ids[1] == EOS] = 5
    with pytest.raises(ValueError, match=r"input_ids row 1 holds no eos_token_id=2"):
        model(ids, mask)


def hf_generate(model, ids, mask, new_tokens: int, **kwargs) -> np.ndarray:
    """transformers' ``generate`` with the BART configs' generation defaults switched off (module docstring)."""
    kwargs.setdefault("min_new_tokens", new_tokens)
    with torch.no_grad():
        return model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                              max_new_tokens=new_tokens, forced_bos_token_id=None, forced_eos_token_id=None,
                              no_repeat_ngram_size=0, do_sample=False, **kwargs).numpy()


@pytest.mark.slow_variants
@pytest.mark.parametrize("case", ["bart", "mbart"])
def test_greedy_generation_equals_transformers(case, tmp_path):
    """24 new tokens for a padded batch of sources (no stop: transformers' ``min_new_tokens`` keeps EOS out, and
    flaxzoo is given no stop id); the decoder's learned positions continue through the cache."""
    hf = build(case, "ForConditionalGeneration", seed=5)
    hf.save_pretrained(tmp_path / "hf")
    ids, mask = padded_batch(CASES[case][1]["vocab_size"], 3, 14, seed=6)
    expected = hf_generate(hf, ids, mask, 24, num_beams=1)
    model = from_pretrained(tmp_path / "hf", scan_layers=case == "mbart")
    got = np.asarray(generate(model, ids, 24, attention_mask=mask))
    np.testing.assert_array_equal(got, expected)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["bart", "mbart"])
def test_beam_search_equals_transformers(case, tmp_path):
    """Beam search on a padded batch of sources (beam counts, length penalties and early-stopping rules: every
    setting on one case, one on the other; a stop id the model emits) equals transformers' ``generate``, start id
    included."""
    hf = build(case, "ForConditionalGeneration", seed=5)
    hf.save_pretrained(tmp_path / "hf")
    ids, mask = padded_batch(CASES[case][1]["vocab_size"], 3, 14, seed=6)
    stop = frequent_token(hf_generate(hf, ids, mask, 20, num_beams=1)[:, 1:])
    model = from_pretrained(tmp_path / "hf")
    for beams, penalty, early in beam_settings(case, ["bart", "mbart"], "bart"):
        theirs = hf_generate(hf, ids, mask, 20, num_beams=beams, length_penalty=penalty, early_stopping=early,
                             eos_token_id=stop, pad_token_id=PAD, min_new_tokens=0)
        ours = np.asarray(generate(model, ids, 20, attention_mask=mask, num_beams=beams, length_penalty=penalty,
                                   early_stopping=early, eos_token_id=stop))
        assert (ours[:, 0] == EOS).all() and (theirs[:, 0] == EOS).all()
        assert_same_beams(ours[:, 1:], theirs[:, 1:], stop, fill=PAD)


HEADS = {"Model": Seq2SeqModel, "ForConditionalGeneration": Seq2SeqForConditionalGeneration,
         "ForSequenceClassification": Seq2SeqForSequenceClassification}


def torch_count(model: torch.nn.Module) -> int:
    """transformers' parameters, plus ``final_logits_bias`` (a buffer there, a parameter here)."""
    bias = getattr(model, "final_logits_bias", None)
    return sum(p.numel() for p in model.parameters()) + (0 if bias is None else bias.numel())


@pytest.mark.slow_variants
@pytest.mark.parametrize("case", sorted(CASES))
def test_parameter_counts_equal_transformers(case):
    for head, cls in HEADS.items():
        hf = build(case, head)
        config = getattr(transformers, f"{PREFIX[case]}Config")(**(CASES[case][1] | IDS)).to_dict()
        ours = family_of(hf.config.model_type).config_from_hf(config)
        assert param_count(ours, cls) == torch_count(hf), head


def hf_config_of(preset: str) -> transformers.PretrainedConfig:
    """The transformers config of a flaxzoo preset (its ``config.json`` as ``save_pretrained`` would write it)."""
    config = get_preset(preset)
    family = family_of(config.model_type)
    fields = family.config_to_hf(config)
    fields.update(pad_token_id=config.pad_token_id, bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                  tie_word_embeddings=config.tie_word_embeddings)
    return transformers.AutoConfig.for_model(config.model_type, **fields)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["bart-base", "bart-large", "mbart-large-cc25"])
def test_preset_parameter_counts_equal_transformers(preset):
    """The published sizes, transformers' models built on the meta device (no memory), flaxzoo's abstractly."""
    hf_config = hf_config_of(preset)
    for head, cls in HEADS.items():
        with torch.device("meta"):
            hf = getattr(transformers, f"{'MBart' if preset.startswith('mbart') else 'Bart'}{head}")(hf_config)
        assert param_count(get_preset(preset), cls) == torch_count(hf), (preset, head)
