"""flaxzoo.models.io against transformers (PyTorch): logits parity both ways, sharded / bf16 / pickle checkpoints, errors.

Every model is tiny (64 wide, 2 layers, vocabulary 1000) with its parameters perturbed away from the initialisers'
zeros and ones, so biases and norm scales are exercised too.
"""

import json
import re
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from family_parity import tiered
from flax import nnx
from safetensors.numpy import load_file, save_file

from flaxzoo import models
from flaxzoo.models import (BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification, BertModel,
                    GPTForCausalLM, GPTModel, get_preset)
from flaxzoo.models.io import from_pretrained, save_pretrained

VOCAB, SEQ, PAD_FROM = 1000, 12, 8
ROBERTA_PAD = 1  # RobertaConfig's pad_token_id: positions start at 2
ATOL = 1e-4

transformers.logging.set_verbosity_error()


# ----------------------------------------------------------------------------------------------------------- helpers

def hf_model(kind: str) -> torch.nn.Module:
    """A transformers model with random, perturbed weights, in eval mode."""
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64)
    if kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2,
            layer_norm_epsilon=1e-5))
    elif kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            **common, num_key_value_heads=2, intermediate_size=128, rms_norm_eps=1e-5,
            rope_theta=50_000.0))
    elif kind == "llama_tied":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            **common, num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True, attention_bias=True,
            mlp_bias=True))
    elif kind == "bert_mlm":
        model = transformers.BertForMaskedLM(transformers.BertConfig(**common, intermediate_size=128))
    elif kind == "bert_cls":
        model = transformers.BertForSequenceClassification(transformers.BertConfig(
            **common, intermediate_size=128, num_labels=3, hidden_act="gelu_new"))
    elif kind == "bert_base":
        model = transformers.BertModel(transformers.BertConfig(**common, intermediate_size=128))
    elif kind == "bert_tok":
        model = transformers.BertForTokenClassification(transformers.BertConfig(
            **common, intermediate_size=128, num_labels=5))
    elif kind.startswith("roberta"):  # like roberta-base: one token type, 2 + 64 positions
        config = transformers.RobertaConfig(**(common | {"max_position_embeddings": 66}), intermediate_size=128,
                                            type_vocab_size=1, num_labels=3)
        model = {"roberta_mlm": transformers.RobertaForMaskedLM,
                 "roberta_cls": transformers.RobertaForSequenceClassification,
                 "roberta_tok": transformers.RobertaForTokenClassification,
                 "roberta_base": transformers.RobertaModel}[kind](config)
    else:
        raise ValueError(kind)
    return perturbed(model)


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with seeded noise added to every parameter, in eval mode."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():  # tied tables appear once
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    return model.eval()


def perturb(model: nnx.Module, seed: int = 0) -> nnx.Module:
    """Add noise to every flaxzoo parameter (biases start at zero, norm scales at one); eval mode."""
    rng = np.random.RandomState(seed)  # host-side noise: nothing to compile
    state = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda x: jnp.asarray(np.asarray(x) + 0.05 * rng.standard_normal(x.shape), x.dtype),
                                   state))
    model.eval()
    return model


def inputs(padded: bool, token_types: bool = False, pad_id: int = 0):
    """Two rows of ids (none of them 0, 1 or 2); with ``padded`` the second is right-padded (mask 0, id ``pad_id``)
    from position PAD_FROM."""
    rng = np.random.RandomState(0)
    ids = rng.randint(3, VOCAB, (2, SEQ)).astype(np.int64)
    mask = np.ones((2, SEQ), np.int64)
    if padded:
        mask[1, PAD_FROM:] = 0
        ids[1, PAD_FROM:] = pad_id
    types = None
    if token_types:
        types = np.zeros((2, SEQ), np.int64)
        types[:, 5:] = 1
    return ids, (mask if padded else None), types


@nnx.jit
def flax_forward(model, ids, mask, types):
    return model(ids, mask, types)


def run_flax(model, ids, mask, types):
    as_jax = lambda x: None if x is None else jnp.asarray(x, jnp.int32)  # noqa: E731
    return flax_forward(model, as_jax(ids), as_jax(mask), as_jax(types))


def run_hf(model, ids, mask, types):
    as_torch = lambda x: None if x is None else torch.from_numpy(x)  # noqa: E731
    kwargs = {"attention_mask": as_torch(mask)}
    if types is not None:
        kwargs["token_type_ids"] = as_torch(types)
    with torch.no_grad():
        return model(input_ids=as_torch(ids), **kwargs)


def assert_logits_close(flax_logits, hf_logits, mask, per_token: bool = True):
    """Compare real-token positions (LM logits) or every row (classification)."""
    flax_logits, hf_logits = np.asarray(flax_logits), hf_logits.detach().numpy()
    assert flax_logits.shape == hf_logits.shape
    if per_token and mask is not None:
        real = mask.astype(bool)
        flax_logits, hf_logits = flax_logits[real], hf_logits[real]
    assert np.isfinite(flax_logits).all()
    np.testing.assert_allclose(flax_logits, hf_logits, rtol=0, atol=ATOL)
    assert np.abs(hf_logits).max() > 0.05  # the comparison is not between two near-zero tensors


def copy_checkpoint(source, target):
    """A copy of a checkpoint directory and its tensors (numpy), to be edited."""
    shutil.copytree(source, target)
    return target, load_file(target / "model.safetensors")


def write_config(directory, config):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


KINDS = ["gpt2", "llama", "llama_tied", "bert_mlm", "bert_cls", "bert_tok", "roberta_mlm", "roberta_cls",
         "roberta_tok"]
# The quick tier's parity each way: one model per family and the token-classification head (the sequence classifier
# is compared with transformers in test_classify.py's quick tier); the other heads and the tied Llama are slow.
QUICK_KINDS = ("gpt2", "llama", "bert_mlm", "bert_tok", "roberta_mlm")
FLAX_CLASS = {"gpt2": GPTForCausalLM, "llama": GPTForCausalLM, "llama_tied": GPTForCausalLM,
              "bert_mlm": BertForMaskedLM, "bert_cls": BertForSequenceClassification,
              "bert_tok": BertForTokenClassification, "roberta_mlm": BertForMaskedLM,
              "roberta_cls": BertForSequenceClassification, "roberta_tok": BertForTokenClassification}
AUTO_CLASS = {"gpt2": transformers.AutoModelForCausalLM, "llama": transformers.AutoModelForCausalLM,
              "llama_tied": transformers.AutoModelForCausalLM, "bert_mlm": transformers.AutoModelForMaskedLM,
              "bert_cls": transformers.AutoModelForSequenceClassification,
              "bert_tok": transformers.AutoModelForTokenClassification,
              "roberta_mlm": transformers.AutoModelForMaskedLM,
              "roberta_cls": transformers.AutoModelForSequenceClassification,
              "roberta_tok": transformers.AutoModelForTokenClassification}


def kind_inputs(kind: str, padded: bool):
    """``inputs`` for a kind: token types for BERT's classifiers, RoBERTa's pad id in its padding."""
    return inputs(padded, token_types=kind in ("bert_cls", "bert_tok"),
                  pad_id=ROBERTA_PAD if kind.startswith("roberta") else 0)


def per_token(kind: str) -> bool:
    return not kind.endswith("_cls")


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    """``get(kind)`` → (transformers model, its saved directory, the flaxzoo model loaded from it), built once."""
    cache = {}

    def get(kind):
        if kind not in cache:
            model = hf_model(kind)
            directory = tmp_path_factory.mktemp(kind)
            model.save_pretrained(directory)
            cache[kind] = model, directory, from_pretrained(directory)
        return cache[kind]

    return get


# --------------------------------------------------------------------------------------------- transformers → flaxzoo

@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("kind", tiered(KINDS, QUICK_KINDS))
def test_transformers_checkpoint_gives_same_logits(hf_checkpoint, kind, padded):
    hf, _, model = hf_checkpoint(kind)
    assert isinstance(model, FLAX_CLASS[kind])
    ids, mask, types = kind_inputs(kind, padded)
    assert_logits_close(run_flax(model, ids, mask, types), run_hf(hf, ids, mask, types).logits, mask,
                        per_token=per_token(kind))


def test_config_fields_are_mapped(hf_checkpoint):
    roberta = hf_checkpoint("roberta_cls")[2].config
    assert (roberta.model_type, roberta.position_offset, roberta.type_vocab_size, roberta.max_position_embeddings) == \
        ("roberta", 2, 1, 66)
    assert (roberta.pad_token_id, roberta.bos_token_id, roberta.eos_token_id, roberta.num_labels) == (1, 0, 2, 3)
    gpt2 = hf_checkpoint("gpt2")[2].config
    assert (gpt2.model_type, gpt2.activation, gpt2.intermediate_size, gpt2.max_position_embeddings) == \
        ("gpt2", "gelu_tanh", 256, 64)
    assert (gpt2.bos_token_id, gpt2.eos_token_id, gpt2.tie_word_embeddings) == (1, 2, True)
    llama = hf_checkpoint("llama")[2].config
    assert (llama.num_heads, llama.num_kv_heads, llama.head_dim, llama.rope_theta, llama.norm_eps) == \
        (4, 2, 16, 50_000.0, 1e-5)
    assert (llama.position, llama.norm, llama.mlp_gated, llama.tie_word_embeddings) == ("rope", "rmsnorm", True, False)
    tied = hf_checkpoint("llama_tied")[2].config
    assert (tied.tie_word_embeddings, tied.attention_bias, tied.mlp_bias) == (True, True, True)
    bert = hf_checkpoint("bert_cls")[2].config
    assert (bert.num_labels, bert.activation, bert.type_vocab_size, bert.norm_eps, bert.pad_token_id) == \
        (3, "gelu_tanh", 2, 1e-12, 0)
    assert (bert.causal, bert.norm_placement, bert.embedding_norm) == (False, "post", True)


def test_base_class_from_head_checkpoint(hf_checkpoint):
    """cls=BertModel / GPTModel on a head checkpoint: the head is skipped; the pooler only if it was saved."""
    hf, directory, _ = hf_checkpoint("bert_mlm")
    encoder = from_pretrained(directory, cls=BertModel)
    assert isinstance(encoder, BertModel) and encoder.pooler is None
    ids, mask, _ = inputs(True)
    out = run_flax(encoder, ids, mask, None)
    ref = run_hf(hf.bert, ids, mask, None).last_hidden_state
    assert out.pooler_output is None
    assert_logits_close(out.last_hidden_state, ref, mask)

    hf, directory, _ = hf_checkpoint("gpt2")
    decoder = from_pretrained(directory, cls="GPTModel")
    assert isinstance(decoder, GPTModel)
    assert_logits_close(run_flax(decoder, ids, mask, None).hidden,
                        run_hf(hf.transformer, ids, mask, None).last_hidden_state, mask)


@pytest.mark.slow_variants
@pytest.mark.parametrize("kind", ["bert_base", "roberta_base"])
def test_bare_bert_model_checkpoint_round_trip(tmp_path, kind):
    """A BertModel / RobertaModel checkpoint has no ``bert.`` prefix (like all-MiniLM-L6-v2) and a pooler."""
    hf = hf_model(kind)
    hf.save_pretrained(tmp_path / "hf")
    assert "embeddings.word_embeddings.weight" in load_file(tmp_path / "hf" / "model.safetensors")
    model = from_pretrained(tmp_path / "hf")
    assert isinstance(model, BertModel) and model.pooler is not None
    ids, mask, types = kind_inputs("bert_tok" if kind == "bert_base" else kind, True)
    out, ref = run_flax(model, ids, mask, types), run_hf(hf, ids, mask, types)
    assert_logits_close(out.last_hidden_state, ref.last_hidden_state, mask)
    assert_logits_close(out.pooler_output, ref.pooler_output, None)

    save_pretrained(model, tmp_path / "fz")
    back, info = transformers.AutoModel.from_pretrained(tmp_path / "fz", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert_logits_close(out.pooler_output, run_hf(back.eval(), ids, mask, types).pooler_output, None)


# --------------------------------------------------------------------------------------------- flaxzoo → transformers

def flax_config(kind: str) -> models.TransformerConfig:
    return {
        "gpt2": get_preset("gpt2-tiny", max_position_embeddings=64),
        "llama": get_preset("llama-tiny", rope_theta=50_000.0),
        "llama_tied": get_preset("llama-tiny", tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
        "bert_mlm": get_preset("bert-tiny", activation="gelu_tanh"),
        "bert_cls": get_preset("bert-tiny", num_labels=3),
        "bert_tok": get_preset("bert-tiny", num_labels=5),
        **{kind: get_preset("bert-tiny", model_type="roberta", pad_token_id=ROBERTA_PAD, bos_token_id=0,
                            eos_token_id=2, position_offset=ROBERTA_PAD + 1, type_vocab_size=1,
                            max_position_embeddings=66, num_labels=3)
           for kind in ("roberta_mlm", "roberta_cls", "roberta_tok")},
    }[kind]


@pytest.fixture(scope="module")
def flax_checkpoint(tmp_path_factory):
    """``get(kind)`` → (flaxzoo model, transformers model loaded from its save_pretrained, loading info)."""
    cache = {}

    def get(kind):
        if kind not in cache:
            model = perturb(models.create_model(flax_config(kind), FLAX_CLASS[kind], seed=3))
            directory = save_pretrained(model, tmp_path_factory.mktemp(f"fz_{kind}"))
            hf, info = AUTO_CLASS[kind].from_pretrained(directory, output_loading_info=True)
            cache[kind] = model, hf.eval(), info
        return cache[kind]

    return get


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("kind", tiered(KINDS, QUICK_KINDS))
def test_saved_model_loads_in_transformers_with_same_logits(flax_checkpoint, kind, padded):
    model, hf, info = flax_checkpoint(kind)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ids, mask, types = kind_inputs(kind, padded)
    assert_logits_close(run_flax(model, ids, mask, types), run_hf(hf, ids, mask, types).logits, mask,
                        per_token=per_token(kind))


def test_saved_config_is_what_transformers_expects(flax_checkpoint):
    _, hf, _ = flax_checkpoint("llama")
    rope_theta = getattr(hf.config, "rope_parameters", None) or {"rope_theta": hf.config.rope_theta}  # v5 / v4
    assert hf.config.num_key_value_heads == 2 and rope_theta["rope_theta"] == 50_000.0
    assert hf.config.tie_word_embeddings is False
    _, hf, _ = flax_checkpoint("bert_cls")
    assert hf.config.num_labels == 3 and hf.config.architectures == ["BertForSequenceClassification"]
    _, hf, _ = flax_checkpoint("gpt2")
    assert hf.config.activation_function == "gelu_new" and hf.config.n_inner == 256


def test_interleaved_rope_is_saved_in_half_layout(tmp_path):
    model = perturb(models.create_model(get_preset("llama-tiny", rope_layout="interleaved"), seed=5))
    save_pretrained(model, tmp_path)
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids, mask, _ = inputs(True)
    logits = run_flax(model, ids, mask, None)
    assert_logits_close(logits, run_hf(hf.eval(), ids, mask, None).logits, mask)
    back = from_pretrained(tmp_path)
    assert back.config.rope_layout == "half"
    np.testing.assert_allclose(np.asarray(run_flax(back, ids, mask, None))[mask.astype(bool)],
                               np.asarray(logits)[mask.astype(bool)], atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["gpt2", "bert_mlm"])
def test_untied_output_layer_both_ways(tmp_path, kind):
    """tie_word_embeddings=False: GPT-2's lm_head.weight; BERT's cls.predictions.decoder.{weight,bias}."""
    torch.manual_seed(0)
    if kind == "gpt2":
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=64, n_layer=1, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2,
            tie_word_embeddings=False))
    else:
        hf = transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=64, tie_word_embeddings=False))
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    hf.eval().save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf")
    assert model.config.tie_word_embeddings is False
    ids, mask, _ = inputs(True)
    logits = run_flax(model, ids, mask, None)
    assert_logits_close(logits, run_hf(hf, ids, mask, None).logits, mask)
    save_pretrained(model, tmp_path / "fz")
    back, info = AUTO_CLASS[kind].from_pretrained(tmp_path / "fz", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert_logits_close(logits, run_hf(back.eval(), ids, mask, None).logits, mask)


@pytest.mark.parametrize("feature, config", [
    ("position='alibi'", get_preset("gpt2-tiny", position="alibi")),
    ("position='sinusoidal'", get_preset("gpt2-tiny", position="sinusoidal")),
    ("norm_placement='post'", get_preset("gpt2-tiny", norm_placement="post")),
    ("num_kv_heads=2", get_preset("gpt2-tiny", num_kv_heads=2)),
    ("position='alibi'", get_preset("llama-tiny", position="alibi")),
    ("position_offset=2 (Hugging Face bert needs 0)", get_preset("bert-tiny", position_offset=2)),
    ("position_offset=0 with pad_token_id=1 (Hugging Face roberta needs position_offset = pad_token_id + 1)",
     get_preset("bert-tiny", model_type="roberta", pad_token_id=1)),
])
def test_save_refuses_what_transformers_cannot_express(tmp_path, feature, config):
    model = models.abstract_model(config)  # saving stops before any weight is read
    with pytest.raises(ValueError, match=re.escape(feature)):
        save_pretrained(model, tmp_path)
    assert not (tmp_path / "config.json").exists()


# ----------------------------------------------------------------------------------------------- stacked layers

def param_paths(model) -> set:
    return {p for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.mark.slow_variants
@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert_mlm", "roberta_cls"])
def test_stacked_layers_both_ways(hf_checkpoint, tmp_path, kind):
    """scan_layers=True: the same per-layer checkpoint builds the scanned model (same logits), which saves back to
    per-layer Hugging Face tensors transformers reloads to the same logits."""
    hf, directory, per_layer = hf_checkpoint(kind)
    model = from_pretrained(directory, scan_layers=True)
    assert model.config.scan_layers and not per_layer.config.scan_layers
    assert param_paths(model) == param_paths(models.abstract_model(model.config, type(model)))
    ids, mask, types = kind_inputs(kind, True)
    logits = run_flax(model, ids, mask, types)
    assert_logits_close(logits, run_hf(hf, ids, mask, types).logits, mask, per_token=per_token(kind))
    save_pretrained(model, tmp_path)
    assert load_file(tmp_path / "model.safetensors").keys() == load_file(directory / "model.safetensors").keys()
    back, info = AUTO_CLASS[kind].from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert_logits_close(logits, run_hf(back.eval(), ids, mask, types).logits, mask, per_token=per_token(kind))


# ------------------------------------------------------------------- transformers' default configs, special ids

DEFAULT_CONFIGS = {  # what transformers builds with its defaults, only the sizes shrunk
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2,
                                                                         n_head=4)),
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)),
    "bert": lambda: transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)),
    "roberta": lambda: transformers.RobertaForMaskedLM(transformers.RobertaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)),
}


@pytest.mark.slow_variants
@pytest.mark.parametrize("family", sorted(DEFAULT_CONFIGS))
def test_transformers_default_configs_both_ways(tmp_path, family):
    """GPT-2's defaults keep bos/eos 50256 with a 1000-token vocabulary: they are dropped with a warning each."""
    torch.manual_seed(0)
    hf = perturbed(DEFAULT_CONFIGS[family]())
    hf.save_pretrained(tmp_path / "hf")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = from_pretrained(tmp_path / "hf")
    messages = sorted(str(w.message) for w in caught if "outside the vocabulary" in str(w.message))
    if family == "gpt2":
        assert messages == [f"config.json: {field}=50256: id(s) [50256] outside the vocabulary [0, 1000) dropped "
                            f"(only generation uses them); keeping {field}=None"
                            for field in ("bos_token_id", "eos_token_id")]
        assert (model.config.bos_token_id, model.config.eos_token_id) == (None, None)
    else:
        assert not messages
    rates = (0.0, 0.0) if family == "llama" else (0.1, 0.1)
    assert (model.config.dropout, model.config.attention_dropout) == rates
    ids, mask, _ = inputs(True, pad_id=ROBERTA_PAD if family == "roberta" else 0)
    logits = run_flax(model, ids, mask, None)
    assert_logits_close(logits, run_hf(hf, ids, mask, None).logits, mask)
    save_pretrained(model, tmp_path / "fz")
    back, info = type(hf).from_pretrained(tmp_path / "fz", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert_logits_close(logits, run_hf(back.eval(), ids, mask, None).logits, mask)


def test_several_eos_ids_and_bad_special_ids(tmp_path):
    """An EOS list keeps its in-range ids (a warning names the others); one id is written as an int, several as a
    list; a value that is no id is an error."""
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=16, bos_token_id=1000, pad_token_id=3,
        eos_token_id=[5, 2000, 7]))
    hf.save_pretrained(tmp_path / "hf")
    with pytest.warns(UserWarning) as caught:
        model = from_pretrained(tmp_path / "hf")
    assert sorted(str(w.message) for w in caught) == [
        "config.json: bos_token_id=1000: id(s) [1000] outside the vocabulary [0, 1000) dropped (only generation uses "
        "them); keeping bos_token_id=None",
        "config.json: eos_token_id=[5, 2000, 7]: id(s) [2000] outside the vocabulary [0, 1000) dropped (only "
        "generation uses them); keeping eos_token_id=[5, 7]"]
    assert (model.config.pad_token_id, model.config.bos_token_id, model.config.eos_token_id) == (3, None, (5, 7))
    saved = json.loads((save_pretrained(model, tmp_path / "several") / "config.json").read_text())
    assert (saved["eos_token_id"], saved["bos_token_id"], saved["pad_token_id"]) == ([5, 7], None, 3)
    model.config = model.config.replace(eos_token_id=(7,))
    assert json.loads((save_pretrained(model, tmp_path / "one") / "config.json").read_text())["eos_token_id"] == 7

    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    for field, value, expected in [("bos_token_id", [1, 2], "a token id or null"),
                                   ("eos_token_id", "2", "a token id, a list of ids or null"),
                                   ("pad_token_id", True, "a token id or null")]:
        write_config(tmp_path / "hf", config | {"bos_token_id": 1, field: value})
        with pytest.raises(ValueError, match=re.escape(f"config.json: {field}={value!r}: expected {expected}")):
            from_pretrained(tmp_path / "hf")


def test_dropout_rates_map_both_ways(tmp_path):
    """Residual ↔ hidden_dropout_prob / resid_pdrop (+ embd_pdrop), attention ↔ attention_probs_dropout_prob /
    attn_pdrop / Llama's attention_dropout; Llama has no residual dropout, and saving one says so."""
    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    cases = [
        (transformers.BertModel(transformers.BertConfig(**small, hidden_dropout_prob=0.2,
                                                        attention_probs_dropout_prob=0.3)),
         (0.2, 0.3), {"hidden_dropout_prob": 0.2, "attention_probs_dropout_prob": 0.3, "classifier_dropout": None}),
        (transformers.GPT2Model(transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2,
                                                        n_positions=16, bos_token_id=0, eos_token_id=0,
                                                        resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.3)),
         (0.2, 0.3), {"resid_pdrop": 0.2, "embd_pdrop": 0.2, "attn_pdrop": 0.3}),
        (transformers.LlamaModel(transformers.LlamaConfig(**small, attention_dropout=0.3)),
         (0.0, 0.3), {"attention_dropout": 0.3}),
    ]
    for i, (hf, rates, fields) in enumerate(cases):
        hf.save_pretrained(tmp_path / f"hf{i}")
        model = from_pretrained(tmp_path / f"hf{i}")
        assert (model.config.dropout, model.config.attention_dropout) == rates
        saved = json.loads((save_pretrained(model, tmp_path / f"fz{i}") / "config.json").read_text())
        assert {k: saved[k] for k in fields} == fields
    model.config = model.config.replace(dropout=0.1)
    with pytest.warns(UserWarning, match=r"dropout=0\.1 is not written: Hugging Face llama has no residual dropout"):
        save_pretrained(model, tmp_path / "llama_dropout")


def test_bad_load_options_are_named(hf_checkpoint):
    _, directory, _ = hf_checkpoint("bert_cls")
    with pytest.raises(ValueError, match=r"scan_layers='yes': expected True, False or None"):
        from_pretrained(directory, scan_layers="yes")
    with pytest.raises(ValueError, match=r"num_labels=0: expected a positive integer"):
        from_pretrained(directory, num_labels=0)
    with pytest.raises(ValueError, match=r"classifier\.weight: expected shape \(4, 64\), found \(3, 64\)"):
        from_pretrained(directory, num_labels=4)


# ----------------------------------------------------------------------------------------- other checkpoint formats

def test_sharded_checkpoint(hf_checkpoint, tmp_path):
    hf, _, reference = hf_checkpoint("gpt2")
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists() and not (tmp_path / "model.safetensors").exists()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    model = from_pretrained(tmp_path)
    ids, mask, _ = inputs(True)
    assert_logits_close(run_flax(model, ids, mask, None), run_hf(hf, ids, mask, None).logits, mask)


def test_bfloat16_checkpoint(tmp_path):
    """safetensors' numpy API has no bfloat16: hub reads those tensors itself."""
    hf_model("llama").to(torch.bfloat16).save_pretrained(tmp_path)
    rounded = hf_model("llama")  # the same bf16-rounded weights in float32 (RoPE frequencies left in float32)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    model = from_pretrained(tmp_path)
    assert model.backbone.embeddings.tokens.embedding[...].dtype == jnp.float32
    ids, mask, _ = inputs(True)
    assert_logits_close(run_flax(model, ids, mask, None), run_hf(rounded, ids, mask, None).logits, mask)
    half = from_pretrained(tmp_path, dtype="bfloat16")
    assert half.backbone.embeddings.tokens.embedding[...].dtype == jnp.bfloat16


def test_pickle_checkpoint_needs_opt_in(hf_checkpoint, tmp_path):
    hf, directory, _ = hf_checkpoint("gpt2")
    shutil.copy(directory / "config.json", tmp_path / "config.json")
    state = dict(hf.state_dict())  # holds the tied lm_head.weight too
    for i in range(2):  # buffers that old GPT-2 checkpoints carry
        state[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64)
        state[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin.*pickle.*allow_pickle=True"):
        from_pretrained(tmp_path)
    model = from_pretrained(tmp_path, allow_pickle=True)
    ids, mask, _ = inputs(True)
    assert_logits_close(run_flax(model, ids, mask, None), run_hf(hf, ids, mask, None).logits, mask)


def test_legacy_bert_pretraining_checkpoint(hf_checkpoint, tmp_path):
    """Like bert-base-uncased: TF-era gamma/beta names, a position_ids buffer, the pooler and next-sentence head of
    pre-training, the tied decoder stored twice, and no model_type in config.json."""
    hf, directory, _ = hf_checkpoint("bert_mlm")
    target, tensors = copy_checkpoint(directory, tmp_path / "ckpt")
    tensors = {name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): t
               for name, t in tensors.items()}
    tensors["bert.embeddings.position_ids"] = np.arange(64, dtype=np.int64)[None]
    tensors["bert.pooler.dense.weight"] = np.zeros((64, 64), np.float32)
    tensors["bert.pooler.dense.bias"] = np.zeros((64,), np.float32)
    tensors["cls.seq_relationship.weight"] = np.zeros((2, 64), np.float32)
    tensors["cls.seq_relationship.bias"] = np.zeros((2,), np.float32)
    tensors["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"]
    tensors["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"]
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    del config["model_type"]
    write_config(target, config)
    model = from_pretrained(target)
    ids, mask, _ = inputs(True)
    assert_logits_close(run_flax(model, ids, mask, None), run_hf(hf, ids, mask, None).logits, mask)


# ------------------------------------------------------------------------------------------------------------ errors

def test_wrong_shape_names_tensor_and_shapes(hf_checkpoint, tmp_path):
    _, directory, _ = hf_checkpoint("gpt2")
    target, tensors = copy_checkpoint(directory, tmp_path / "ckpt")
    tensors["transformer.h.1.mlp.c_fc.weight"] = np.zeros((64, 200), np.float32)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"transformer\.h\.1\.mlp\.c_fc\.weight: expected shape \(64, 256\), "
                                         r"found \(64, 200\)"):
        from_pretrained(target)


def test_missing_and_unexpected_tensors_are_listed(hf_checkpoint, tmp_path):
    _, directory, _ = hf_checkpoint("llama")
    target, tensors = copy_checkpoint(directory, tmp_path / "missing")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    del tensors["lm_head.weight"]
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing tensors: lm_head\.weight, model\.layers\.1\.mlp\.up_proj\.weight"):
        from_pretrained(target)

    target, tensors = copy_checkpoint(directory, tmp_path / "unexpected")
    tensors["model.layers.0.self_attn.extra.weight"] = np.zeros((4,), np.float32)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"unexpected tensors: model\.layers\.0\.self_attn\.extra\.weight"):
        from_pretrained(target)


def new_head(model, cls, seed):
    """The head parameters ``create_model`` gives ``cls`` at ``seed`` (what a missing head must be initialised to)."""
    fresh = models.create_model(model.config, cls, seed=seed)
    return {name: np.asarray(getattr(fresh.pooler if name == "pooler" else fresh.classifier, "kernel")[...])
            for name in ("pooler", "classifier")}


def test_encoder_checkpoint_loads_as_classifier(hf_checkpoint, tmp_path):
    """The fine-tuning start: an MLM checkpoint (no pooler, no classifier) as BertForSequenceClassification. The
    missing head is initialised as create_model would (seeded), listed in one warning; the MLM head is skipped; the
    encoder is the checkpoint's."""
    hf, directory, _ = hf_checkpoint("bert_mlm")
    with pytest.warns(UserWarning, match=r"lacks 4 tensor\(s\), initialised with the model's initialisers \(seed=3\): "
                                         r"bert\.pooler\.dense\.bias, bert\.pooler\.dense\.weight, classifier\.bias, "
                                         r"classifier\.weight") as caught:
        model = from_pretrained(directory, cls=BertForSequenceClassification, num_labels=5, seed=3)
    lacking = [w for w in caught if "lacks" in str(w.message)]
    assert len(lacking) == 1 and lacking[0].filename == __file__, "the warning points at the caller's line"
    assert isinstance(model, BertForSequenceClassification) and model.config.num_labels == 5
    expected = new_head(model, BertForSequenceClassification, seed=3)
    np.testing.assert_array_equal(np.asarray(model.classifier.kernel[...]), expected["classifier"])
    np.testing.assert_array_equal(np.asarray(model.pooler.kernel[...]), expected["pooler"])
    assert model.classifier.kernel[...].shape == (64, 5)
    ids, mask, _ = inputs(True)
    assert_logits_close(run_flax(model.backbone, ids, mask, None).hidden,
                        run_hf(hf.bert, ids, mask, None).last_hidden_state, mask)

    # A bare BertModel checkpoint has the pooler: only the classifier is new, and the pooler is the checkpoint's.
    bare = hf_model("bert_base")
    bare.save_pretrained(tmp_path / "bare")
    with pytest.warns(UserWarning, match=r"lacks 2 tensor\(s\).*: classifier\.bias, classifier\.weight;"):
        model = from_pretrained(tmp_path / "bare", cls="BertForSequenceClassification")
    assert_logits_close(np.tanh(np.asarray(model.pooler(run_flax(model.backbone, ids, mask, None).hidden[:, 0]))),
                        run_hf(bare, ids, mask, None).pooler_output, None)

    # Everything else stays strict: an unknown tensor, a mis-shaped one, a class of another family.
    target, tensors = copy_checkpoint(directory, tmp_path / "extra")
    tensors["bert.encoder.layer.0.attention.extra.weight"] = np.zeros((4,), np.float32)
    tensors["bert.embeddings.word_embeddings.weight"] = tensors["bert.embeddings.word_embeddings.weight"][:, :32]
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"unexpected tensors: bert\.encoder\.layer\.0\.attention\.extra\.weight"):
        from_pretrained(target, cls=BertForSequenceClassification)
    del tensors["bert.encoder.layer.0.attention.extra.weight"]
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"bert\.embeddings\.word_embeddings\.weight: expected shape \(1000, 64\), "
                                         r"found \(1000, 32\)"):
        from_pretrained(target, cls=BertForSequenceClassification)
    with pytest.raises(ValueError, match="cls=GPTForCausalLM cannot hold a bert checkpoint"):
        from_pretrained(directory, cls=GPTForCausalLM)


def test_tied_duplicate_must_match(hf_checkpoint, tmp_path):
    _, directory, _ = hf_checkpoint("gpt2")
    target, tensors = copy_checkpoint(directory, tmp_path / "ckpt")
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"] + 1.0
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lm_head\.weight differs from transformer\.wte\.weight"):
        from_pretrained(target)


def test_unsupported_architecture(tmp_path):
    directory = write_config(tmp_path / "whisper", {"architectures": ["WhisperForConditionalGeneration"],
                                                    "model_type": "whisper"})
    with pytest.raises(ValueError, match=r"unsupported model_type 'whisper'.*WhisperForConditionalGeneration.*"
                                         r"bert: BertModel.*gpt2: GPT2Model, GPT2LMHeadModel.*LlamaForCausalLM"):
        from_pretrained(directory)
    directory = write_config(tmp_path / "mc", {"architectures": ["BertForMultipleChoice"], "model_type": "bert"})
    with pytest.raises(ValueError, match=r"unsupported architecture 'BertForMultipleChoice'.*"
                                         r"BertForSequenceClassification, BertForTokenClassification"):
        from_pretrained(directory)


@pytest.mark.parametrize("kind, change, field", [
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ("gpt2", {"reorder_and_upcast_attn": True}, "reorder_and_upcast_attn"),
    ("gpt2", {"activation_function": "quick_gelu"}, "activation_function"),
    ("bert_mlm", {"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ("bert_mlm", {"is_decoder": True}, "is_decoder"),
    # RoPE scaling types are supported (tests/test_rope_scaling.py); an unknown one, or one missing a key, is named.
    ("llama", {"rope_parameters": {"rope_type": "mrope", "rope_theta": 1e4, "factor": 2.0}}, "'mrope'"),
    ("llama", {"rope_parameters": None, "rope_theta": 1e4, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "original_max_position_embeddings"),
    ("roberta_mlm", {"pad_token_id": None}, r"pad_token_id=None: expected a token id >= 0 \(RoBERTa's positions"),
    ("roberta_mlm", {"hidden_act": "gelu_new"}, r"activation='gelu_tanh': Hugging Face's RobertaForMaskedLM head "
                                                r"always applies exact GELU"),
])
def test_unsupported_config_feature_is_named(hf_checkpoint, tmp_path, kind, change, field):
    _, directory, _ = hf_checkpoint(kind)
    config = json.loads((directory / "config.json").read_text()) | change
    target = write_config(tmp_path / "ckpt", config)
    shutil.copy(directory / "model.safetensors", target / "model.safetensors")
    with pytest.raises(ValueError, match=field):
        from_pretrained(target)


def test_directory_without_weights(hf_checkpoint, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no config\.json.*empty"):
        from_pretrained(tmp_path / "empty")
    _, directory, _ = hf_checkpoint("gpt2")
    target = write_config(tmp_path / "config_only", json.loads((directory / "config.json").read_text()))
    (target / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match=r"holds no model weights.*model\.safetensors.*holds config\.json, notes\.txt"):
        from_pretrained(target)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        from_pretrained(tmp_path / "nowhere")


def test_lazy_export():
    assert models.from_pretrained is from_pretrained and models.save_pretrained is save_pretrained


@pytest.mark.parametrize("kind", ["bert_cls", "roberta_cls", "bert_mlm"])
def test_left_padded_encoder_rows_equal_transformers_at_every_position(hf_checkpoint, kind):
    """Padding queries read the real keys, as BERT's do: even slot 0 of a left-padded row (what the pooler reads)
    and the padding positions' own outputs are Hugging Face's."""
    hf, _, model = hf_checkpoint(kind)
    ids, _, types = kind_inputs(kind, padded=False)
    mask = np.ones_like(ids)
    mask[1, :4] = 0
    ids[1, :4] = ROBERTA_PAD if kind.startswith("roberta") else 0
    flax_logits = np.asarray(run_flax(model, ids, mask, types))
    hf_logits = run_hf(hf, ids, mask, types).logits.detach().numpy()
    np.testing.assert_allclose(flax_logits, hf_logits, rtol=0, atol=ATOL)
