"""Cross-attention (``Attention`` with ``memory_kv``, ``models/layers/attention.py``) against transformers' T5
``EncDecAttention``: a decoder config (causal) whose queries read a right-padded encoder output through the layout's
segments, unscaled as T5's (``query_scale=1.0``), with heads narrower than the model (``d_kv · heads != d_model``);
the keys and values projected once serve several calls."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from transformers.models.t5.modeling_t5 import T5Attention

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.attention import Attention, KVCache
from flaxzoo.models.layers.masking import AttentionLayout

D_MODEL, HEADS, D_KV = 24, 3, 5


def t5_pair(seed: int) -> tuple[T5Attention, Attention]:
    """A random T5 cross-attention and a flaxzoo ``Attention`` holding its weights."""
    torch.manual_seed(seed)
    reference = T5Attention(transformers.T5Config(d_model=D_MODEL, d_kv=D_KV, num_heads=HEADS, is_decoder=True,
                                                  dropout_rate=0.0), has_relative_attention_bias=False).eval()
    config = TransformerConfig(vocab_size=32, hidden_size=D_MODEL, num_layers=2, num_heads=HEADS, head_dim=D_KV,
                               intermediate_size=48, causal=True, attention_bias=False, query_scale=1.0,
                               position="none", dropout=0.0, attention_dropout=0.0)
    layer = Attention(config, rngs=nnx.Rngs(0))
    weight = lambda name: getattr(reference, name).weight.detach().numpy()  # noqa: E731  torch: [out, in]
    for name in ("q", "k", "v"):
        target = {"q": layer.query, "k": layer.key, "v": layer.value}[name]
        target.kernel.set_value(jnp.asarray(weight(name).T.reshape(D_MODEL, HEADS, D_KV)))
    layer.out.kernel.set_value(jnp.asarray(weight("o").T.reshape(HEADS, D_KV, D_MODEL)))
    layer.eval()
    return reference, layer


@pytest.mark.parametrize("target_len,source_len,seed", [(7, 11, 0), (1, 9, 1), (12, 4, 2)])
def test_cross_attention_equals_t5(target_len, source_len, seed):
    reference, layer = t5_pair(seed)
    rng = np.random.default_rng(seed)
    decoder = rng.standard_normal((2, target_len, D_MODEL)).astype(np.float32)
    encoder = rng.standard_normal((2, source_len, D_MODEL)).astype(np.float32)
    source_mask = np.ones((2, source_len), np.int32)
    source_mask[1, max(source_len - 3, 1):] = 0  # the second source right-padded
    additive = torch.as_tensor(((1 - source_mask)[:, None, None, :] * np.finfo(np.float32).min).astype(np.float32))
    with torch.no_grad():
        expected = reference(torch.as_tensor(decoder), mask=additive, key_value_states=torch.as_tensor(encoder))[0]

    layout = AttentionLayout(query_positions=jnp.zeros((2, target_len), jnp.int32),
                             key_positions=jnp.zeros((2, source_len), jnp.int32),
                             query_segments=jnp.ones((2, target_len), jnp.int32),
                             key_segments=jnp.asarray(source_mask))
    memory_kv = layer.keys_values(jnp.asarray(encoder))
    out, cache, weights = layer(jnp.asarray(decoder), layout, memory_kv=memory_kv, return_weights=True)
    assert cache is None
    np.testing.assert_allclose(np.asarray(out), expected.numpy(), atol=1e-5, rtol=1e-5)
    assert np.all(np.asarray(weights)[1, :, :, max(source_len - 3, 1):] == 0)  # padding never read
    # the fused path (no weights asked) and one query at a time over the same projected memory agree
    fused, _, _ = layer(jnp.asarray(decoder), layout, memory_kv=memory_kv)
    np.testing.assert_allclose(np.asarray(fused), np.asarray(out), atol=1e-5, rtol=1e-5)
    last = AttentionLayout(query_positions=layout.query_positions[:, -1:], key_positions=layout.key_positions,
                           query_segments=layout.query_segments[:, -1:], key_segments=layout.key_segments)
    step, _, _ = layer(jnp.asarray(decoder[:, -1:]), last, memory_kv=memory_kv)
    np.testing.assert_allclose(np.asarray(step), np.asarray(out)[:, -1:], atol=1e-5, rtol=1e-5)


def test_packed_pairs_read_only_their_own_source():
    """Two (source, target) pairs packed in one row: each target token reads its own pair's source tokens."""
    _, layer = t5_pair(3)
    rng = np.random.default_rng(3)
    source = jnp.asarray(rng.standard_normal((1, 6, D_MODEL)).astype(np.float32))
    target = jnp.asarray(rng.standard_normal((1, 5, D_MODEL)).astype(np.float32))
    source_segments, target_segments = jnp.asarray([[1, 1, 1, 2, 2, 0]]), jnp.asarray([[1, 1, 2, 2, 2]])
    packed = AttentionLayout(query_positions=jnp.zeros((1, 5), jnp.int32), key_positions=jnp.zeros((1, 6), jnp.int32),
                             query_segments=target_segments, key_segments=source_segments)
    out, _, _ = layer(target, packed, memory_kv=layer.keys_values(source))
    for pair, (sources, targets) in {1: (slice(0, 3), slice(0, 2)), 2: (slice(3, 5), slice(2, 5))}.items():
        alone = AttentionLayout(query_positions=jnp.zeros((1, targets.stop - targets.start), jnp.int32),
                                key_positions=jnp.zeros((1, sources.stop - sources.start), jnp.int32))
        single, _, _ = layer(target[:, targets], alone, memory_kv=layer.keys_values(source[:, sources]))
        np.testing.assert_allclose(np.asarray(out[:, targets]), np.asarray(single), atol=1e-5, rtol=1e-5)


def test_a_cache_with_memory_is_refused():
    _, layer = t5_pair(4)
    memory_kv = layer.keys_values(jnp.zeros((1, 3, D_MODEL)))
    layout = AttentionLayout(query_positions=jnp.zeros((1, 1), jnp.int32), key_positions=jnp.zeros((1, 3), jnp.int32))
    cache = KVCache(jnp.zeros((HEADS, 4, D_KV)), jnp.zeros((HEADS, 4, D_KV)))
    with pytest.raises(ValueError, match="cross-attention \\(memory_kv\\) takes no KV cache"):
        layer(jnp.zeros((1, 1, D_MODEL)), layout, memory_kv=memory_kv, cache=cache)
