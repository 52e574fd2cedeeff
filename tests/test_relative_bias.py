"""T5's relative position bias (``models/layers/relative_bias.py``) against transformers' ``T5Attention``: the buckets
of every distance in a wide range, bidirectional (encoder) and causal (decoder), and the bias a random table gives,
with queries offset as in cached decoding."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from transformers.models.t5.modeling_t5 import T5Attention

from flaxzoo.models.layers.relative_bias import RelativePositionBias, relative_bucket

# (num_buckets, max_distance): T5's own (32, 128), umT5-small's layout, odd counts, a max_distance just above the
# exact range, and one far beyond any distance tested
SETTINGS = [(32, 128), (8, 20), (7, 9), (33, 50), (6, 4), (64, 1000)]


@pytest.mark.parametrize("bidirectional", [True, False], ids=["encoder", "decoder"])
@pytest.mark.parametrize("num_buckets,max_distance", SETTINGS)
def test_buckets_equal_transformers(num_buckets, max_distance, bidirectional):
    if (num_buckets // 2 if bidirectional else num_buckets) // 2 >= max_distance:
        pytest.skip("no logarithmic range: the layer refuses it (tested below)")
    distances = np.arange(-700, 701)[None, :] + np.zeros((2, 1), np.int64)  # two rows, as a batch
    ours = np.asarray(relative_bucket(jnp.asarray(distances), bidirectional=bidirectional, num_buckets=num_buckets,
                                      max_distance=max_distance))
    reference = T5Attention._relative_position_bucket(torch.as_tensor(distances), bidirectional=bidirectional,
                                                      num_buckets=num_buckets, max_distance=max_distance).numpy()
    np.testing.assert_array_equal(ours, reference)
    if max_distance < 700:  # the farthest distances reach the last bucket of each half
        assert ours.max() == ((num_buckets // 2) * 2 - 1 if bidirectional else num_buckets - 1)


@pytest.mark.parametrize("decoder", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("query_length,key_length,past", [(9, 9, 0), (1, 13, 12), (3, 40, 37)])
def test_bias_equals_compute_bias(decoder, query_length, key_length, past):
    config = transformers.T5Config(d_model=16, d_kv=4, num_heads=3, relative_attention_num_buckets=10,
                                   relative_attention_max_distance=24, is_decoder=decoder)
    torch.manual_seed(0)
    reference = T5Attention(config, has_relative_attention_bias=True)
    with torch.no_grad():
        reference.relative_attention_bias.weight.normal_()
        expected = reference.compute_bias(query_length, key_length, past_seen_tokens=past).numpy()

    layer = RelativePositionBias(10, 24, 3, bidirectional=not decoder, rngs=nnx.Rngs(0))
    layer.embedding.set_value(jnp.asarray(reference.relative_attention_bias.weight.detach().numpy()))
    batch = 2
    queries = jnp.broadcast_to(jnp.arange(query_length) + past, (batch, query_length))
    keys = jnp.broadcast_to(jnp.arange(key_length), (batch, key_length))
    got = np.asarray(layer(queries, keys))
    assert got.shape == (batch, 3, query_length, key_length)
    np.testing.assert_array_equal(got, np.broadcast_to(expected, got.shape))


def test_rows_with_other_positions_get_their_own_bias():
    """A left-padded row's positions start later: its bias is the table at its own distances."""
    layer = RelativePositionBias(16, 32, 2, bidirectional=True, rngs=nnx.Rngs(1))
    positions = jnp.asarray([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]])
    bias = np.asarray(layer(positions, positions))
    table = np.asarray(layer.embedding.get_value())
    buckets = np.asarray(relative_bucket(positions[1][None, :] - positions[1][:, None], bidirectional=True,
                                         num_buckets=16, max_distance=32))
    np.testing.assert_array_equal(bias[1], np.transpose(table[buckets], (2, 0, 1)))
    assert not np.array_equal(bias[0], bias[1])


@pytest.mark.parametrize("num_buckets,max_distance,bidirectional,words", [
    (3, 128, True, "num_buckets=3, max_distance=128 (bidirectional): expected at least 4 buckets"),
    (1, 128, False, "num_buckets=1, max_distance=128 (causal): expected at least 2 buckets"),
    (32, 8, True, "max_distance above the 8 distance(s)"),
])
def test_settings_without_a_logarithmic_range_are_refused(num_buckets, max_distance, bidirectional, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        RelativePositionBias(num_buckets, max_distance, 2, bidirectional=bidirectional, rngs=nnx.Rngs(0))
