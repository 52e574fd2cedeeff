"""``TransformerConfig.pad_vocab_to``: vocabulary tables padded to a multiple (GPT-2's 50,257 rows shard over no mesh
axis), padding ids masked out of the logits, Hugging Face parity unchanged both ways, flaxzoo checkpoints padded,
decoding never emitting a padding id, and the padded table split over an 8-device fsdp axis."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file

from flaxzoo import models
from flaxzoo.models import from_pretrained, get_preset, save_pretrained
from flaxzoo.models.io.checkpoint import read_meta, save_checkpoint
from flaxzoo.models.layers.embeddings import PADDED_LOGIT, check_token_ids
from flaxzoo.models.inference.sampling import sample_logits

transformers.logging.set_verbosity_error()

REPO = pathlib.Path(__file__).resolve().parent.parent
VOCAB, PADDED = 1000, 1024  # pad_vocab_to=128
IDS = np.random.RandomState(0).randint(3, VOCAB, (2, 12)).astype(np.int64)


# ---------------------------------------------------------------------------------------------------------- config

@pytest.mark.parametrize("value", [0, -128, True, 2.0, "128", None])
def test_pad_vocab_to_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match=rf"pad_vocab_to={value!r}: expected a positive integer") as info:
        get_preset("gpt2-tiny", pad_vocab_to=value)
    assert info.value.field == "pad_vocab_to"


@pytest.mark.parametrize("vocab, multiple, padded", [(50257, 1, 50257), (50257, 128, 50304), (50304, 128, 50304),
                                                      (1000, 128, 1024), (7, 64, 64)])
def test_padded_vocab_size(vocab, multiple, padded):
    config = get_preset("gpt2-tiny", vocab_size=vocab, pad_vocab_to=multiple, bos_token_id=0, eos_token_id=0)
    assert config.vocab_size == vocab and config.padded_vocab_size == padded
    assert models.TransformerConfig.from_dict(config.to_dict()) == config


# ---------------------------------------------------------------------------------------------------------- layers

@pytest.mark.slow_variants
@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny", "bert-tiny"])  # tied; untied head; MLM head with bias
def test_padded_tables_start_at_zero_and_padding_logits_are_masked(name):
    config = get_preset(name, pad_vocab_to=128)
    model = models.create_model(config)
    params = nnx.state(model, nnx.Param)
    tables = {p: v.get_value() for p, v in nnx.to_flat_state(params) if "vocab" in (v.get_metadata()["out_sharding"])}
    assert len(tables) == {"gpt2-tiny": 1, "llama-tiny": 2, "bert-tiny": 2}[name]
    for path, table in tables.items():
        axis = 1 if path[-1] == "kernel" else 0
        assert table.shape[axis] == PADDED, path
        assert not np.asarray(jnp.take(table, jnp.arange(VOCAB, PADDED), axis=axis)).any(), path
        if table.ndim == 2:  # the real rows got the normal initialiser
            assert np.asarray(jnp.take(table, jnp.arange(VOCAB), axis=axis)).std() > 0.01
    logits = np.asarray(jax.jit(lambda ids: model(ids))(jnp.asarray(IDS, jnp.int32)))
    assert logits.shape == (*IDS.shape, PADDED)
    assert (logits[..., VOCAB:] == np.float32(PADDED_LOGIT)).all()
    assert np.isfinite(logits).all() and np.abs(logits[..., :VOCAB]).max() < 1e3
    # The same parameters without the padding rows: the real logits are the same numbers.
    from flaxzoo.models.modeling import assemble_model, resize_vocab_values, vocab_axes

    flat = {p: v.get_value() for p, v in nnx.to_flat_state(params)}
    unpadded = assemble_model(config.replace(pad_vocab_to=1), type(model),
                              resize_vocab_values(flat, vocab_axes(params), VOCAB))
    np.testing.assert_allclose(np.asarray(unpadded(IDS)), logits[..., :VOCAB], rtol=0, atol=1e-6)


def test_token_id_checks_reject_padding_ids():
    config = get_preset("gpt2-tiny", pad_vocab_to=128)
    with pytest.raises(ValueError, match=r"contains 1000: expected token ids in \[0, 1000\) \(vocab_size=1000\)"):
        check_token_ids(np.array([[1, 1000]]), config)
    model = models.create_model(config)
    with pytest.raises(ValueError, match=r"contains 1000"):
        models.generate(model, [[1, 1000]], 2)
    # Inside jit, an id in the padding reads NaNs (as any id outside the vocabulary), never a zero row.
    hidden = jax.jit(lambda ids: model.backbone.embeddings.tokens(ids))(jnp.array([[5, 1000, 1023]]))
    assert np.isfinite(np.asarray(hidden[0, 0])).all() and np.isnan(np.asarray(hidden[0, 1:])).all()


def test_decoding_never_emits_a_padding_id():
    """Padding rows made huge: unmasked, every logit of a padding id would win; masked, none is ever picked."""
    config = get_preset("gpt2-tiny", pad_vocab_to=128)
    model = models.create_model(config)
    table = model.backbone.embeddings.tokens.embedding
    table[...] = table[...].at[VOCAB:].set(50.0)
    prompt = IDS[:, :4]
    for kwargs in (dict(), dict(temperature=1.0, seed=0), dict(temperature=100.0, seed=1),
                   dict(temperature=5.0, top_k=VOCAB, seed=2), dict(temperature=5.0, top_p=0.999, seed=3)):
        out = np.asarray(models.generate(model, prompt, 16, **kwargs))
        assert out.shape == (2, 20) and out.max() < VOCAB and out.min() >= 0, kwargs
    logits = jnp.zeros((4096, PADDED)).at[:, VOCAB:].set(PADDED_LOGIT)  # all real ids equally likely
    for temperature, top_k, top_p in ((1.0, 0, 1.0), (1e4, 0, 1.0), (1.0, VOCAB, 1.0), (1.0, 0, 0.9999)):
        drawn = np.asarray(sample_logits(logits, jax.random.key(0), temperature, top_k, top_p))
        assert drawn.max() < VOCAB and len(np.unique(drawn)) > 900


# ----------------------------------------------------------------------------------------- Hugging Face both ways

def hf_model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2))
    elif kind == "bert":
        model = transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=64))
    else:  # an untied output projection
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=64))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    return model.eval()


@pytest.mark.parametrize("kind", ["gpt2", "bert", "llama"])
def test_padded_import_matches_transformers_and_export_drops_the_padding(kind, tmp_path):
    hf = hf_model(kind)
    hf.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf", pad_vocab_to=128)
    assert model.config.vocab_size == VOCAB and model.config.pad_vocab_to == 128
    logits = np.asarray(model(IDS))
    with torch.no_grad():
        reference = hf(input_ids=torch.from_numpy(IDS)).logits.numpy()
    assert logits.shape == (*IDS.shape, PADDED)
    np.testing.assert_allclose(logits[..., :VOCAB], reference, rtol=0, atol=1e-5)
    assert np.abs(reference).max() > 0.05
    assert (logits[..., VOCAB:] == np.float32(PADDED_LOGIT)).all()
    assert model.config.padded_vocab_size == PADDED
    # Export: the same Hugging Face tensors, the real vocabulary in config.json.
    save_pretrained(model, tmp_path / "out")
    original, written = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    common = set(original) & set(written)
    assert {n for n in original if "word_embeddings" in n or "wte" in n or "embed_tokens" in n or "lm_head" in n
            or n.endswith("predictions.bias")} <= common
    for name in common:
        np.testing.assert_array_equal(written[name], original[name], err_msg=name)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["vocab_size"] == VOCAB
    back = transformers.AutoModelForCausalLM if kind != "bert" else transformers.AutoModelForMaskedLM
    reloaded, info = back.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    with torch.no_grad():
        again = reloaded.eval()(input_ids=torch.from_numpy(IDS)).logits.numpy()
    np.testing.assert_allclose(again, reference, rtol=0, atol=1e-5)


def test_flaxzoo_checkpoint_stores_the_padded_tables(tmp_path):
    config = get_preset("llama-tiny", pad_vocab_to=128)  # untied: the table and the head's kernel
    model = models.create_model(config, seed=3)
    step = save_checkpoint(model, tmp_path)
    assert read_meta(step)["config"]["pad_vocab_to"] == 128
    loaded = from_pretrained(tmp_path)
    assert loaded.config == config
    assert loaded.backbone.embeddings.tokens.embedding[...].shape == (PADDED, 64)
    assert loaded.lm_head.kernel[...].shape == (64, PADDED)
    expected = np.asarray(model(IDS))
    np.testing.assert_array_equal(np.asarray(loaded(IDS)), expected)
    # Re-padded on load: trimmed to no padding, or to another multiple; the real logits do not change.
    for multiple, rows in ((1, VOCAB), (256, 1024), (200, 1000)):
        other = from_pretrained(tmp_path, pad_vocab_to=multiple)
        assert other.config.pad_vocab_to == multiple and other.lm_head.kernel[...].shape == (64, rows)
        got = np.asarray(other(IDS))
        assert got.shape[-1] == rows
        np.testing.assert_array_equal(got[..., :VOCAB], expected[..., :VOCAB])


# ---------------------------------------------------------------------------------------------------------- sharding

SHARDING_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax
    from flax import nnx
    from flaxzoo.models.families import get_preset
    from flaxzoo.models.modeling import abstract_model
    from flaxzoo.train import sharding

    assert jax.device_count() == 8, jax.devices()
    mesh = sharding.make_mesh((1, 8, 1))
    report = {}
    for multiple in (1, 128):
        config = get_preset("gpt2", hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                            max_position_embeddings=32, pad_vocab_to=multiple)
        _, params, _ = nnx.split(abstract_model(config), nnx.Param, ...)
        logical = nnx.to_pure_dict(nnx.get_partition_spec(params))
        unsplit = []
        shardings = sharding.param_shardings(logical, nnx.to_pure_dict(params), mesh, unsplit)
        table = shardings["backbone"]["embeddings"]["tokens"]["embedding"]
        shape = params["backbone"]["embeddings"]["tokens"]["embedding"].get_value().shape
        report[multiple] = dict(spec=str(table.spec), shape=list(shape),
                                shard=list(table.shard_shape(shape)), unsplit=unsplit)
    json.dump(report, sys.stdout)
""")


def test_padded_gpt2_vocabulary_splits_over_eight_fsdp_devices():
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"}
    proc = subprocess.run([sys.executable, "-c", SHARDING_SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    report = json.loads(proc.stdout)
    plain, padded = report["1"], report["128"]
    assert plain["shape"] == [50257, 16] and plain["shard"] == [50257, 16] and "fsdp" not in plain["spec"]
    assert any(line.startswith("backbone.embeddings.tokens.embedding (50257, 16)") and "fsdp=8" in line
               for line in plain["unsplit"]), plain["unsplit"]
    assert padded["shape"] == [50304, 16] and padded["shard"] == [50304 // 8, 16] and "fsdp" in padded["spec"]
    assert not any("tokens.embedding" in line for line in padded["unsplit"]), padded["unsplit"]
