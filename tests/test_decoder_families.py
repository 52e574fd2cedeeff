"""The Llama-layout decoder families (Qwen2 / 2.5, Qwen3, Mistral, Llama 3 RoPE) against transformers: logits both ways
on left-padded batches (the scanned layout proven equal to the unrolled one), and 24 greedy tokens past the sliding
window (``tests/family_parity.py``). Each case turns on its family's mechanisms: q/k/v biases without an output bias,
sliding windows on some or all layers, YaRN and llama3 RoPE scaling, QK-norm with an explicit head_dim."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
import transformers

from family_parity import (SMALL, check_greedy_generation, check_loads_with_same_logits,
                           check_saves_with_same_logits, check_scanned_layout, checkpoint_fixture, tiered)



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


checkpoint = checkpoint_fixture(FAMILY_CASES)


QUICK = ("qwen2", "qwen3", "mistral", "llama3")  # one case per family in the quick tier (``-m "not slow"``)


@pytest.mark.parametrize("case", tiered(FAMILY_CASES, QUICK))
def test_transformers_checkpoint_gives_same_logits(checkpoint, case):
    check_loads_with_same_logits(*checkpoint(case))


@pytest.mark.parametrize("case", tiered(FAMILY_CASES, QUICK))
def test_saved_model_loads_in_transformers_with_same_logits(checkpoint, case, tmp_path):
    check_saves_with_same_logits(*checkpoint(case), tmp_path / "saved")


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(FAMILY_CASES))
def test_scanned_layout_equals_the_unrolled_one(checkpoint, case, tmp_path):
    """Stacked parameters, saved tensors and logits of ``scan_layers=True`` equal the unrolled layout's (the one
    both directions above run), and its logits are transformers'."""
    check_scanned_layout(*checkpoint(case), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(FAMILY_CASES))
def test_greedy_generation_equals_transformers_past_the_window(checkpoint, case):
    check_greedy_generation(*checkpoint(case))
