"""The decode memory roofline (``flaxzoo.train.tools.roofline``): bytes per new token against numpy's count of the model's
arrays and the cache formula, the stream bandwidth, and the accelerator compile's roofline line."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxzoo import models
from flaxzoo.models.adapters.quantize import quantize_model
from flaxzoo.train.tools import roofline


def state_bytes(model, skip=()) -> int:
    return sum(np.asarray(leaf.get_value()).nbytes for path, leaf in nnx.to_flat_state(nnx.state(model, nnx.Param))
               if not any(name in map(str, path) for name in skip))


def test_weight_bytes_count_lookups_by_the_rows_used():
    config = models.get_preset("gpt2-tiny").replace(num_layers=2)
    model = models.create_model(config, models.GPTForCausalLM, seed=0)
    table = config.max_position_embeddings * config.hidden_size * 4
    for batch in (1, 3):  # tied: the token table is the LM head, read whole; positions: one row per row
        assert roofline.weight_bytes(model, batch) == state_bytes(model) - table + batch * config.hidden_size * 4
    untied = models.create_model(config.replace(tie_word_embeddings=False), models.GPTForCausalLM, seed=0)
    vocab = config.padded_vocab_size * config.hidden_size * 4
    assert roofline.weight_bytes(untied, 2) == state_bytes(untied) - table - vocab + 2 * 2 * config.hidden_size * 4


def test_int8_weights_count_as_stored():
    config = models.get_preset("llama-tiny").replace(num_layers=2)
    model = models.create_model(config, models.GPTForCausalLM, seed=0)
    dense = roofline.weight_bytes(model, 1)
    projections = sum(np.asarray(leaf.get_value()).nbytes
                      for path, leaf in nnx.to_flat_state(nnx.state(model, nnx.Param))
                      if {"attention", "mlp"} & set(map(str, path)) and str(path[-1]) == "kernel")
    quantized = roofline.weight_bytes(quantize_model(model, "int8"), 1)
    assert dense - quantized == pytest.approx(0.75 * projections, rel=0.05)  # 4 bytes → 1, plus the scales


def test_cache_bytes_are_the_formula():
    config = models.get_preset("llama-tiny").replace(num_layers=3, num_kv_heads=2, dtype="bfloat16")
    per_token = 2 * 3 * 2 * config.head_dim * 2
    assert roofline.cache_bytes_per_token(config, 10) == per_token * 11
    model = models.create_model(config, models.GPTForCausalLM, seed=0)
    moved = roofline.decode_bytes_per_token(model, 4, 10)
    assert moved["weights"] == roofline.weight_bytes(model, 4) / 4
    assert moved["total"] == moved["weights"] + 11 * per_token
    with pytest.raises(ValueError, match="batch=0: expected at least one row"):
        roofline.decode_bytes_per_token(model, 0, 10)


def test_stream_bandwidth_is_measured():
    assert roofline.time_memory_bandwidth(64, repeats=2) > 1e8  # any machine moves 100 MB/s
    with pytest.raises(ValueError, match="megabytes=0"):
        roofline.time_memory_bandwidth(0)
    fields = roofline.roofline_fields(models.create_model(models.get_preset("gpt2-tiny"), models.GPTForCausalLM),
                                      1, 16.0, 100.0, 1e10, "given")
    assert fields["bandwidth_fraction"] == pytest.approx(fields["bytes_per_token"] * 100 / 1e10)
    assert fields["roofline_tokens_per_s"] == pytest.approx(1e10 / fields["bytes_per_token"])
    assert jnp.isfinite(fields["bytes_per_token"])
