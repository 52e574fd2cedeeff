"""The decoder families against transformers (PyTorch): logits both ways on left-padded batches in both layer
layouts, and greedy generation token for token past the sliding window.

Every model is tiny (2-4 layers, vocabulary 512) with its parameters perturbed away from the initialisers, and each
case turns on the mechanisms its family has (biases, QK-norm, sliding windows, soft-capping, RoPE scaling ...).
``FAMILY_CASES`` maps a case name to the transformers model it builds; a family's folder adds its cases there.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from flaxzoo import models
from flaxzoo.models.hub import from_pretrained, save_pretrained

VOCAB, ATOL = 512, 1e-4
transformers.logging.set_verbosity_error()

SMALL = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _qwen2() -> torch.nn.Module:
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **SMALL, num_hidden_layers=3, use_sliding_window=True, sliding_window=8, max_window_layers=1,
        rope_theta=20_000.0, tie_word_embeddings=False))


def _qwen2_yarn() -> torch.nn.Module:
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **SMALL, num_hidden_layers=2, tie_word_embeddings=True,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}))


def _qwen3() -> torch.nn.Module:
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **SMALL, num_hidden_layers=2, head_dim=24, attention_bias=True, tie_word_embeddings=True,
        rope_theta=1_000_000.0))


def _mistral() -> torch.nn.Module:
    return transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL, num_hidden_layers=2, sliding_window=6))


def _llama3() -> torch.nn.Module:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **SMALL, num_hidden_layers=2, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 16}))


FAMILY_CASES: dict[str, Callable[[], torch.nn.Module]] = {
    "qwen2": _qwen2, "qwen2_yarn": _qwen2_yarn, "qwen3": _qwen3, "mistral": _mistral, "llama3": _llama3,
}


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    return model.eval()


def left_padded(seq: int = 12, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two rows of ids; the second left-padded by 4 (id 0, mask 0)."""
    ids = np.random.RandomState(seed).randint(3, VOCAB, (2, seq)).astype(np.int64)
    mask = np.ones((2, seq), np.int64)
    ids[1, :4], mask[1, :4] = 0, 0
    return ids, mask


@nnx.jit
def _forward(model, ids, mask):
    return model(ids, mask)


def hf_logits(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()


def assert_real_close(ours, theirs, mask) -> None:
    real = mask.astype(bool)
    ours, theirs = np.asarray(ours)[real], theirs[real]
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL)
    assert np.abs(theirs).max() > 0.05


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """``get(case)`` → (transformers model, its directory), built once per case."""
    cache = {}

    def get(case):
        if case not in cache:
            torch.manual_seed(0)
            model = perturbed(FAMILY_CASES[case]())
            directory = tmp_path_factory.mktemp(case)
            model.save_pretrained(directory)
            cache[case] = model, directory
        return cache[case]

    return get


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("case", sorted(FAMILY_CASES))
def test_transformers_checkpoint_gives_same_logits(checkpoint, case, scan):
    hf, directory = checkpoint(case)
    model = from_pretrained(directory, scan_layers=scan)
    assert model.config.model_type == hf.config.model_type
    ids, mask = left_padded()
    assert_real_close(_forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)),
                      hf_logits(hf, ids, mask), mask)


@pytest.mark.parametrize("case", sorted(FAMILY_CASES))
def test_saved_model_loads_in_transformers_with_same_logits(checkpoint, case, tmp_path):
    hf, directory = checkpoint(case)
    model = from_pretrained(directory)
    saved = save_pretrained(model, tmp_path / "saved")
    again = transformers.AutoModelForCausalLM.from_pretrained(saved).eval()
    assert type(again) is type(hf)
    ids, mask = left_padded(seed=1)
    assert_real_close(_forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)),
                      hf_logits(again, ids, mask), mask)
    for key in ("sliding_window", "head_dim", "rope_parameters", "layer_types"):
        if getattr(hf.config, key, None) is not None:
            assert getattr(again.config, key) == getattr(hf.config, key), key


@pytest.mark.parametrize("case", sorted(FAMILY_CASES))
def test_greedy_generation_equals_transformers_past_the_window(checkpoint, case):
    """24 greedy tokens after a left-padded batch of prompts (the windows are 6-8: well past them)."""
    hf, directory = checkpoint(case)
    model = from_pretrained(directory)
    ids, mask = left_padded(seq=10, seed=2)
    new = 24
    with torch.no_grad():
        theirs = hf.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                             max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0).numpy()
    ours = np.asarray(models.generate(model, ids, new, attention_mask=mask))
    np.testing.assert_array_equal(ours[:, ids.shape[1]:], theirs[:, ids.shape[1]:])
