"""Shared checks of a decoder family against transformers (PyTorch), for the family test files: logits both ways on
a left-padded batch in both layer layouts, and greedy generation token for token."""

from __future__ import annotations

from typing import Callable, Mapping

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

# Small sizes every case starts from (each case changes what its family needs).
SMALL = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)


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
def forward(model, ids, mask):
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


def saved_case(model: torch.nn.Module, directory) -> torch.nn.Module:
    """``model`` perturbed (seeded) and saved to ``directory``; returned in eval mode."""
    model = perturbed(model)
    model.save_pretrained(directory)
    return model


def check_loads_with_same_logits(hf: torch.nn.Module, directory, scan: bool) -> nnx.Module:
    """transformers → flaxzoo: ``from_pretrained`` gives transformers' logits on a left-padded batch."""
    model = from_pretrained(directory, scan_layers=scan)
    assert model.config.model_type == hf.config.model_type
    ids, mask = left_padded()
    assert_real_close(forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)),
                      hf_logits(hf, ids, mask), mask)
    return model


def check_saves_with_same_logits(hf: torch.nn.Module, directory, out, scan: bool = False,
                                 keys=("sliding_window", "head_dim", "rope_parameters", "layer_types")):
    """flaxzoo → transformers: the saved directory (of a model with stacked layers with ``scan``) loads as ``hf``'s
    class with flaxzoo's logits, and the config ``keys`` transformers reads equal the original's."""
    model = from_pretrained(directory, scan_layers=scan)
    saved = save_pretrained(model, out)
    again = transformers.AutoModelForCausalLM.from_pretrained(saved).eval()
    assert type(again) is type(hf)
    ids, mask = left_padded(seed=1)
    assert_real_close(forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)),
                      hf_logits(again, ids, mask), mask)
    for key in keys:
        if getattr(hf.config, key, None) is not None:
            assert getattr(again.config, key) == getattr(hf.config, key), key


def check_greedy_generation(hf: torch.nn.Module, directory, new: int = 24) -> None:
    """``new`` greedy tokens after a left-padded batch equal transformers' ``generate``."""
    model = from_pretrained(directory)
    ids, mask = left_padded(seq=10, seed=2)
    with torch.no_grad():
        theirs = hf.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                             max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0).numpy()
    ours = np.asarray(models.generate(model, ids, new, attention_mask=mask))
    np.testing.assert_array_equal(ours[:, ids.shape[1]:], theirs[:, ids.shape[1]:])


def checkpoint_fixture(cases: Mapping[str, Callable[[], torch.nn.Module]]):
    """The module fixture ``checkpoint`` of a family test file: ``checkpoint(case)`` → (transformers model, its saved
    directory), each of ``cases`` built (seeded) and saved once."""
    @pytest.fixture(scope="module", name="checkpoint")
    def checkpoint(tmp_path_factory):
        cache = {}

        def get(case):
            if case not in cache:
                torch.manual_seed(0)
                directory = tmp_path_factory.mktemp(case)
                cache[case] = saved_case(cases[case](), directory), directory
            return cache[case]

        return get

    return checkpoint
