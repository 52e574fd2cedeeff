"""Model-level properties checked against independent references: causality (by gradients), padding invariance,
the explicit attention-weights path, grouped-query attention against numpy, a numpy GPT-2 forward pass, parameter
counts against transformers' numbers, and the error messages for bad input."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxzoo import models
from flaxzoo.models import (BertForMaskedLM, BertForSequenceClassification, BertModel, GPTForCausalLM, GPTModel,
                    TransformerConfig, get_preset)
from flaxzoo.models.layers.attention import Attention
from flaxzoo.models.layers.linear import compute_copy, next_key
from flaxzoo.models.layers.masking import AttentionLayout

DECODERS = {
    "gpt2": dict(name="gpt2-tiny"),
    "llama": dict(name="llama-tiny"),  # RMSNorm, SwiGLU, RoPE, 4 heads / 2 KV heads, untied head
    "alibi": dict(name="gpt2-tiny", position="alibi"),
    "sinusoidal": dict(name="gpt2-tiny", position="sinusoidal"),
    "llama-interleaved-mqa": dict(name="llama-tiny", rope_layout="interleaved", num_kv_heads=1),
    "gpt2-mqa": dict(name="gpt2-tiny", num_kv_heads=1),  # multi-query attention with biases
}


def decoder_config(kind: str, **overrides) -> TransformerConfig:
    spec = dict(DECODERS[kind])
    name = spec.pop("name")
    return get_preset(name, **{**spec, **overrides})


@functools.lru_cache(maxsize=None)
def cached_model(config: TransformerConfig, cls=None, seed: int = 0) -> nnx.Module:
    """One initialised model per (config, class, seed) for the whole module (tests only read them): compiling an
    initialiser costs seconds on a CPU, so the tests share a handful of models and take sub-modules from them
    (every class keeps its ``TransformerStack`` at ``backbone``)."""
    return models.create_model(config, cls, seed=seed)


def scaled(model: nnx.Module, factor: float) -> nnx.Module:
    """A copy with every matrix (kernels, tables) multiplied by ``factor``: a wider init, so that attention is far
    from uniform and activations reach the non-linear range, without compiling another initialiser."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(lambda x: x * factor if x.ndim >= 2 else x, state))


@functools.lru_cache(maxsize=None)
def cached_forward(config: TransformerConfig, cls=None, seed: int = 0):
    return jitted(cached_model(config, cls, seed))


def jitted(model: nnx.Module, method=None):
    """``model(*args, **kwargs)`` (or ``method(model, ...)``) compiled once per input shape, state as an argument."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, *args, **kwargs):
        m = nnx.merge(graphdef, state)
        return m(*args, **kwargs) if method is None else method(m, *args, **kwargs)

    return lambda *args, **kwargs: run(state, *args, **kwargs)


def np_(x) -> np.ndarray:
    return np.asarray(x, np.float64)


# ------------------------------------------------------------------------------------------------------ causality


def causal_lm_logits(model: GPTForCausalLM, embeds: jax.Array, attention_mask=None) -> jax.Array:
    """Logits from input embeddings fed in place of the token lookup (``TransformerStack``'s ``inputs_embeds``)."""
    hidden = model.backbone(None, attention_mask, inputs_embeds=embeds).hidden
    return model.lm_head(hidden, model.backbone.embeddings.tokens)


def position_jacobian_norms(model, seq: int, attention_mask=None, *, encoder: bool = False) -> np.ndarray:
    """``J[t, t'] = ‖∂ (r · out[t]) / ∂ x[t']‖`` where ``x`` is the embedding input at each position and ``r`` a fixed
    random read-out of position t's output (logits for decoders, hidden states for encoders)."""
    config = model.config
    graphdef, state = nnx.split(model)
    embeds = jax.random.normal(jax.random.key(1), (1, seq, config.hidden_size))

    def readout(state, embeds):
        m = nnx.merge(graphdef, state)
        if encoder:
            out = m.backbone(None, attention_mask, inputs_embeds=embeds).hidden
        else:
            out = causal_lm_logits(m, embeds, attention_mask)
        r = jax.random.normal(jax.random.key(2), (out.shape[-1],))
        return out[0] @ r  # [seq]

    jacobian = jax.jit(jax.jacrev(readout, argnums=1))(state, embeds)  # [seq, 1, seq, hidden]
    return np.linalg.norm(np.asarray(jacobian)[:, 0], axis=-1)


@pytest.mark.slow_variants
@pytest.mark.parametrize("kind, with_mask", [("gpt2", False), ("llama", False), ("alibi", False), ("sinusoidal", False),
                                             ("llama", True)])
def test_decoder_is_causal(kind, with_mask):
    """With no mask the fused kernel's ``is_causal`` does the masking; with an all-ones mask, the explicit mask."""
    model = cached_model(decoder_config(kind))
    seq = 6
    mask = jnp.ones((1, seq), jnp.int32) if with_mask else None
    norms = position_jacobian_norms(model, seq, mask)
    future = np.triu(np.ones((seq, seq), bool), k=1)  # t' > t
    assert (norms[future] == 0.0).all(), f"position t depends on a later position:\n{norms}"
    # Every position depends on itself and on every earlier one.
    assert (norms[~future] > 1e-6).all(), f"a past position has no influence:\n{norms}"


def test_encoder_is_bidirectional():
    """The same probe on BERT sees the future: the causality test above is able to fail."""
    model = cached_model(get_preset("bert-tiny"), BertForSequenceClassification)
    norms = position_jacobian_norms(model, 5, encoder=True)
    assert (norms > 1e-6).all(), norms


def test_inputs_embeds_equals_token_lookup():
    config = decoder_config("gpt2")
    model = cached_model(config)
    ids = jnp.asarray([[5, 17, 900, 3]])
    table = model.backbone.embeddings.tokens.embedding[...]
    from_embeds = jitted(model, lambda m, embeds: causal_lm_logits(m, embeds))(table[ids])
    np.testing.assert_allclose(np_(from_embeds), np_(cached_forward(config)(ids)), atol=1e-6)
    with pytest.raises(ValueError, match="exactly one of input_ids"):
        model.backbone(ids, inputs_embeds=table[ids])


# -------------------------------------------------------------------------------------------------------- padding

PAD = 7  # any id: padded positions must not matter, whatever token they hold


@pytest.mark.slow_variants
@pytest.mark.parametrize("kind", ["gpt2", "llama", "alibi", "sinusoidal", "llama-interleaved-mqa", "gpt2-mqa"])
def test_decoder_padding_leaves_real_positions_unchanged(kind):
    config = decoder_config(kind)
    forward = cached_forward(config)
    rng = np.random.default_rng(0)
    long, short, pad = 9, 5, 4  # a batch of a 9-token and a 5-token prompt, padded to 9 (and to 13)
    ids_long, ids_short = rng.integers(0, config.vocab_size, (1, long)), rng.integers(0, config.vocab_size, (1, short))
    alone_long, alone_short = np_(forward(jnp.asarray(ids_long))), np_(forward(jnp.asarray(ids_short)))
    padding = np.full((1, long - short), PAD)
    extra = np.full((1, pad), PAD)
    batches = {
        "right": (np.concatenate([np.concatenate([ids_long, extra], 1),
                                  np.concatenate([ids_short, padding, extra], 1)]),
                  np.array([[1] * long + [0] * pad, [1] * short + [0] * (long - short + pad)])),
        "left": (np.concatenate([np.concatenate([extra, ids_long], 1),
                                 np.concatenate([extra, padding, ids_short], 1)]),
                 np.array([[0] * pad + [1] * long, [0] * (long - short + pad) + [1] * short])),
    }
    for side, (ids, mask) in batches.items():
        logits = np_(forward(jnp.asarray(ids), jnp.asarray(mask)))
        for row, alone in ((0, alone_long), (1, alone_short)):
            real = logits[row][mask[row].astype(bool)]
            np.testing.assert_allclose(real, alone[0], atol=1e-5, rtol=0, err_msg=f"{side} padding, row {row}")


@pytest.mark.slow_variants
@pytest.mark.parametrize("cls", [BertForMaskedLM, BertForSequenceClassification, BertModel])
def test_bert_right_padding_leaves_real_positions_unchanged(cls):
    config = get_preset("bert-tiny")
    forward = cached_forward(config, cls)  # BertModel: with its pooler
    rng = np.random.default_rng(0)
    ids_a, ids_b = rng.integers(0, config.vocab_size, (1, 8)), rng.integers(0, config.vocab_size, (1, 5))
    types_a = np.array([[0, 0, 0, 0, 1, 1, 1, 1]])
    types_b = np.array([[0, 0, 0, 1, 1]])
    ids = np.concatenate([np.concatenate([ids_a, np.full((1, 3), PAD)], 1),
                          np.concatenate([ids_b, np.full((1, 6), PAD)], 1)])
    types = np.concatenate([np.concatenate([types_a, np.zeros((1, 3), int)], 1),
                            np.concatenate([types_b, np.ones((1, 6), int)], 1)])
    mask = np.array([[1] * 8 + [0] * 3, [1] * 5 + [0] * 6])

    def out(*args):
        result = forward(*map(jnp.asarray, args))
        return (np_(result.last_hidden_state), np_(result.pooler_output)) if cls is BertModel else (np_(result),)

    batched = out(ids, mask, types)
    for row, (ids_row, types_row) in enumerate(((ids_a, types_a), (ids_b, types_b))):
        alone = out(ids_row, np.ones_like(ids_row), types_row)
        length = ids_row.shape[1]
        for got, want in zip(batched, alone):
            got = got[row, :length] if got.ndim == 3 else got[row]
            np.testing.assert_allclose(got, want[0], atol=1e-5, rtol=0, err_msg=f"{cls.__name__} row {row}")


def test_padding_mask_is_not_ignored():
    """Without the mask, the pad tokens do change the real positions (so the tests above can fail)."""
    config = get_preset("bert-tiny")
    forward = cached_forward(config, BertForMaskedLM)
    ids = jnp.asarray([[11, 12, 13, PAD, PAD]])
    masked = np_(forward(ids, jnp.asarray([[1, 1, 1, 0, 0]])))
    unmasked = np_(forward(ids))
    assert np.abs(masked[0, :3] - unmasked[0, :3]).max() > 1e-4


def test_sinusoidal_model_adds_the_vaswani_table():
    """Vaswani et al. (2017): the token embeddings times √d_model (§3.4), plus the waves (§3.5)."""
    config = decoder_config("sinusoidal")
    assert config.embedding_multiplier == math.sqrt(config.hidden_size)
    embeddings = cached_model(config).backbone.embeddings
    ids, positions = jnp.asarray([[4, 8, 15, 16, 23]]), jnp.asarray([[0, 1, 2, 40, 41]])
    got = np_(jitted(embeddings)(ids, positions))
    d = config.hidden_size
    table = np.array([[math.sin(p / 10000 ** (2 * (j // 2) / d)) if j % 2 == 0 else
                       math.cos(p / 10000 ** (2 * (j // 2) / d)) for j in range(d)] for p in (0, 1, 2, 40, 41)])
    expected = np_(embeddings.tokens.embedding[...])[np.asarray(ids[0])] * math.sqrt(d) + table
    np.testing.assert_allclose(got[0], expected, atol=1e-6, rtol=0)


def test_embedding_multiplier_defaults_to_the_positions_scheme():
    """None: √(embedding width) with sinusoidal positions, 1.0 otherwise; an explicit value is kept, and a default
    one follows a later change of the positions or the width (``replace``)."""
    learned = get_preset("bert-tiny")
    assert learned.embedding_multiplier == 1.0
    waves = learned.replace(position="sinusoidal")
    assert waves.embedding_multiplier == math.sqrt(64)
    assert waves.replace(hidden_size=128, intermediate_size=256).embedding_multiplier == math.sqrt(128)
    assert waves.replace(embedding_size=32).embedding_multiplier == math.sqrt(32)  # the tables' width
    assert waves.replace(position="learned").embedding_multiplier == 1.0
    kept = learned.replace(position="sinusoidal", embedding_multiplier=1.0)  # the unscaled sum, asked for
    assert kept.embedding_multiplier == 1.0 and kept.replace(hidden_size=128).embedding_multiplier == 1.0
    assert TransformerConfig.from_dict(kept.to_dict()).embedding_multiplier == 1.0
    gemma = get_preset("gemma-3-270m")
    assert gemma.embedding_multiplier == math.sqrt(640) and gemma.replace(num_layers=2).embedding_multiplier == \
        math.sqrt(640)
    with pytest.raises(ValueError, match=r"embedding_multiplier=-1\.0: expected a positive number"):
        learned.replace(embedding_multiplier=-1.0)


# ------------------------------------------------------------------------------------------ attention-weights path


@pytest.mark.slow_variants
@pytest.mark.parametrize("kind", ["gpt2", "llama", "alibi", "bert"])
def test_attention_weights_path_matches_fused_path(kind):
    if kind == "bert":
        config, cls = get_preset("bert-tiny"), BertModel
        model = cached_model(config, BertModel)
    else:
        config, cls = decoder_config(kind), GPTModel
        model = cached_model(config, GPTModel)
    assert isinstance(model, cls)
    hidden_of = (lambda out: out.last_hidden_state) if cls is BertModel else (lambda out: out.hidden)
    weights_of = lambda out: out.attention_weights  # noqa: E731
    fused = jitted(model)
    explicit = jitted(model, lambda m, *a: m(*a, return_attention_weights=True))
    ids = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (2, 7)))
    # No mask (decoders: the fused kernel's is_causal) and a padding mask (one full row, one padded row).
    masks = {"none": None} if kind in ("gpt2", "alibi") else {}
    if kind == "bert":
        masks["right-padded"] = jnp.asarray([[1] * 7, [1] * 4 + [0] * 3])
    else:
        masks["left-padded"] = jnp.asarray([[1] * 7, [0] * 3 + [1] * 4])
    for name, mask in masks.items():
        args = (ids,) if mask is None else (ids, mask)
        out_fused, out_explicit = fused(*args), explicit(*args)
        assert weights_of(out_fused) is None
        np.testing.assert_allclose(np_(hidden_of(out_explicit)), np_(hidden_of(out_fused)), atol=1e-5, rtol=0,
                                   err_msg=name)
        weights = weights_of(out_explicit)
        assert len(weights) == config.num_layers
        for w in map(np_, weights):
            assert w.shape == (2, config.num_heads, 7, 7)
            key_valid = np.ones((2, 7), bool) if mask is None else np.asarray(mask, bool)
            # Only real queries' rows are meaningful: a left-pad query of a decoder has no real key to attend to
            # (its output is ignored). Rows sum to 1, pad keys get exactly zero weight, future keys too.
            real = np.broadcast_to(key_valid[:, None, :, None], w.shape)
            pad_key = np.broadcast_to(~key_valid[:, None, None, :], w.shape)
            np.testing.assert_allclose(w.sum(-1)[real[..., 0]], 1.0, atol=1e-5, rtol=0)
            assert (w[real & pad_key] == 0).all()
            if config.causal:
                future = np.broadcast_to(np.triu(np.ones((7, 7), bool), k=1), w.shape)
                assert (w[real & future] == 0).all()
                assert (w[real & ~future & ~pad_key] > 0).all()
            else:
                assert (w[real & ~pad_key] > 0).all()


# ----------------------------------------------------------------------------------------------------- GQA / MQA


def numpy_rope_half_or_interleaved(x: np.ndarray, positions: np.ndarray, theta: float, layout: str) -> np.ndarray:
    """Rotary embedding of ``x: [seq, heads, d]`` at ``positions: [seq]`` as complex rotations of the layout's pairs."""
    d = x.shape[-1]
    rotation = np.exp(1j * positions[:, None, None] * theta ** (-2.0 * np.arange(d // 2) / d))
    if layout == "half":
        z = (x[..., : d // 2] + 1j * x[..., d // 2:]) * rotation
        return np.concatenate([z.real, z.imag], -1)
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * rotation
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def numpy_attention(attention: Attention, x: np.ndarray, config: TransformerConfig, causal: bool) -> np.ndarray:
    """One attention layer in numpy from the module's own weights: ``x: [seq, hidden]`` → ``[seq, hidden]``.

    Key/value head ``j`` serves query heads ``j·g … j·g + g - 1`` (g = heads / kv_heads), as in Ainslie et al. (2023)
    and transformers' ``repeat_kv``."""
    def dense(module, inputs, contract):
        y = np.tensordot(inputs, np_(module.kernel[...]), axes=contract)
        return y if module.bias is None else y + np_(module.bias[...])

    q, k, v = (dense(m, x, 1) for m in (attention.query, attention.key, attention.value))  # [seq, heads, d]
    seq = x.shape[0]
    if config.position == "rope":
        q = numpy_rope_half_or_interleaved(q, np.arange(seq), config.rope_theta, config.rope_layout)
        k = numpy_rope_half_or_interleaved(k, np.arange(seq), config.rope_theta, config.rope_layout)
    groups = config.num_heads // config.num_kv_heads
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(config.head_dim)
    if causal:
        scores = np.where(np.tril(np.ones((seq, seq), bool)), scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    weights = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
    context = np.einsum("hqk,khd->qhd", weights, v)
    return dense(attention.out, context, 2)


@pytest.mark.parametrize("kind, kv_heads", [("llama", 2), ("llama-interleaved-mqa", 1), ("gpt2-mqa", 1), ("gpt2", 4)])
def test_grouped_query_attention_matches_numpy(kind, kv_heads):
    config = decoder_config(kind)
    assert config.num_kv_heads == kv_heads
    # Wider weights so that attention is far from uniform and a wrong head grouping or rotation shows.
    model = scaled(cached_model(config), 15.0)
    attention = model.backbone.layers[1].attention
    assert attention.key.kernel.shape == (config.hidden_size, kv_heads, config.head_dim)
    x = np.random.default_rng(0).standard_normal((2, 6, config.hidden_size)).astype(np.float32)
    run = jitted(attention, lambda m, x, positions: m(x, AttentionLayout(positions, positions))[0])
    got = np_(run(jnp.asarray(x), jnp.broadcast_to(jnp.arange(6), (2, 6))))
    for b in range(2):
        np.testing.assert_allclose(got[b], numpy_attention(attention, np_(x[b]), config, causal=True), atol=1e-5,
                                   rtol=0)
    # (Whole models with 1 and 2 KV heads run in the padding tests: "llama-interleaved-mqa", "gpt2-mqa", "llama".)


# --------------------------------------------------------------------------------- a numpy GPT-2 forward pass


def test_gpt2_matches_numpy_forward():
    """A whole GPT-2 layout model (2 layers) written in numpy: LayerNorm, GELU-tanh, learned positions, tied head."""
    config = get_preset("gpt2-tiny")
    model = scaled(cached_model(config), 5.0)
    ids = np.array([[3, 141, 59, 26, 535, 89, 79]])
    got = np_(jitted(model)(jnp.asarray(ids)))

    d = model.backbone
    p = lambda v: np_(v[...])  # noqa: E731

    def layer_norm(x, norm):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + config.norm_eps) * p(norm.scale) + p(norm.bias)

    def gelu_tanh(x):  # Hendrycks & Gimpel (2016), the tanh approximation GPT-2 uses
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    wte = p(d.embeddings.tokens.embedding)
    x = wte[ids[0]] + p(d.embeddings.positions.embedding)[: ids.shape[1]]
    for layer in d.layers:
        x = x + numpy_attention(layer.attention, layer_norm(x, layer.attention_norm), config, causal=True)
        h = layer_norm(x, layer.mlp_norm)
        h = gelu_tanh(h @ p(layer.mlp.up.kernel) + p(layer.mlp.up.bias))
        x = x + h @ p(layer.mlp.down.kernel) + p(layer.mlp.down.bias)
    x = layer_norm(x, d.final_norm)
    expected = x @ wte.T  # tied head
    assert np.abs(expected).max() > 1.0  # not a near-zero comparison
    np.testing.assert_allclose(got[0], expected, atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------------------- param_count


@pytest.mark.slow_variants
@pytest.mark.parametrize("name, cls, expected", [
    ("gpt2", None, 124_439_808),                    # transformers' GPT2LMHeadModel (tied head counted once)
    ("bert-base-uncased", BertModel, 109_482_240),  # transformers' BertModel with pooler
    ("smollm2-135m", None, 134_515_008),            # transformers' LlamaForCausalLM, tied
])
def test_param_count_matches_transformers(name, cls, expected):
    assert models.param_count(get_preset(name), cls) == expected


@pytest.mark.slow_variants
@pytest.mark.parametrize("name, cls", [("gpt2-tiny", None), ("llama-tiny", None), ("bert-tiny", BertForMaskedLM),
                                        ("bert-tiny", BertForSequenceClassification)])
def test_param_count_equals_materialised_params(name, cls):
    config = get_preset(name)
    model = cached_model(config, cls)
    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert models.param_count(config, cls) == sum(leaf.size for leaf in leaves)


def test_untied_head_adds_a_table():
    tied = models.param_count(get_preset("llama-tiny", tie_word_embeddings=True))
    untied = models.param_count(get_preset("llama-tiny", tie_word_embeddings=False))
    assert untied - tied == 64 * 1000


# ------------------------------------------------------------------------------------------------------ bad input


@pytest.fixture(scope="module")
def gpt2_tiny():
    return cached_model(get_preset("gpt2-tiny"))


@pytest.fixture(scope="module")
def bert_tiny():
    return cached_model(get_preset("bert-tiny"), BertForMaskedLM)


def test_token_id_equal_to_vocab_size(gpt2_tiny, bert_tiny):
    for model in (gpt2_tiny, bert_tiny):
        with pytest.raises(ValueError, match=r"input_ids contains 1000: expected token ids in \[0, 1000\) \(vocab_size=1000\)"):
            model(jnp.asarray([[1, 2, 1000]]))


def test_negative_token_id(gpt2_tiny):
    with pytest.raises(ValueError, match=r"input_ids contains -1: expected token ids in \[0, 1000\) \(vocab_size=1000\)"):
        gpt2_tiny(jnp.asarray([[1, -1, 2]]))


def test_sequence_longer_than_learned_positions(gpt2_tiny, bert_tiny):
    for model in (gpt2_tiny, bert_tiny):
        with pytest.raises(ValueError, match=r"sequence length 129 exceeds max_position_embeddings=128"):
            model(jnp.zeros((1, 129), jnp.int32))


def test_attention_mask_wrong_shape(gpt2_tiny, bert_tiny):
    for model in (gpt2_tiny, bert_tiny):
        with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 5\): expected \(1, 4\)"):
            model(jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 5), jnp.int32))


def test_attention_mask_not_binary(gpt2_tiny):
    with pytest.raises(ValueError, match=r"attention_mask holds values \[0, 1, 2\]: expected only 0 and 1"):
        gpt2_tiny(jnp.zeros((1, 4), jnp.int32), jnp.asarray([[1, 2, 1, 0]]))


def test_token_type_ids_without_token_types(gpt2_tiny):
    with pytest.raises(ValueError, match=r"token_type_ids given but .* no token-type embeddings \(type_vocab_size=0\)"):
        gpt2_tiny(jnp.zeros((1, 4), jnp.int32), token_type_ids=jnp.zeros((1, 4), jnp.int32))


def test_token_type_id_out_of_range(bert_tiny):
    with pytest.raises(ValueError, match=r"token_type_ids contains 2: expected values in \[0, 2\)"):
        bert_tiny(jnp.zeros((1, 4), jnp.int32), token_type_ids=jnp.asarray([[0, 1, 2, 0]]))


@pytest.mark.parametrize("overrides, message", [
    (dict(hidden_size=65), r"hidden_size=65 is not divisible by num_heads=4"),
    (dict(num_kv_heads=3), r"num_kv_heads=3 does not divide num_heads=4"),
    (dict(position="foo"), r"position='foo': expected one of \('learned', 'sinusoidal', 'rope', 'alibi', 'none'\)"),
    (dict(rope_layout="pairs"), r"rope_layout='pairs': expected one of"),
    (dict(num_heads=0), r"num_heads=0: expected a positive integer"),
    (dict(eos_token_id=1000), r"eos_token_id=1000: expected a token id in \[0, 1000\)"),
])
def test_bad_config(overrides, message):
    with pytest.raises(ValueError, match=message):
        get_preset("gpt2-tiny", **overrides)


def test_bad_config_direct():
    base = dict(vocab_size=100, num_layers=1, intermediate_size=32)
    with pytest.raises(ValueError, match=r"hidden_size=50 is not divisible by num_heads=4"):
        TransformerConfig(hidden_size=50, num_heads=4, **base)
    with pytest.raises(ValueError, match=r"num_kv_heads=4 does not divide num_heads=6"):
        TransformerConfig(hidden_size=48, num_heads=6, num_kv_heads=4, **base)
    with pytest.raises(ValueError, match=r"position='rotary': expected one of"):
        TransformerConfig(hidden_size=48, num_heads=6, position="rotary", **base)


def test_unknown_preset():
    with pytest.raises(ValueError, match=r"unknown preset 'gpt5'; expected one of \[.*'gpt2-tiny'"):
        get_preset("gpt5")


def test_wrong_family_for_class():
    with pytest.raises(ValueError, match="causal=True"):
        BertModel(get_preset("gpt2-tiny"), rngs=nnx.Rngs(0))


def test_replace_derives_heads_again():
    """Overriding ``num_heads`` / ``hidden_size`` re-derives the defaulted ``head_dim`` and ``num_kv_heads``."""
    config = get_preset("gpt2-tiny", num_heads=8)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (8, 8, 8)
    config = get_preset("gpt2-tiny", hidden_size=128)
    assert (config.num_kv_heads, config.head_dim) == (4, 32)
    # Explicit values stay: GQA heads of SmolLM2, and a head_dim that is not hidden_size // num_heads.
    config = get_preset("smollm2-135m", num_heads=18)
    assert (config.num_kv_heads, config.head_dim) == (3, 32)
    config = get_preset("gpt2-tiny", head_dim=32).replace(hidden_size=128)
    assert config.head_dim == 32
    model = models.abstract_model(get_preset("gpt2-tiny", num_heads=8))
    assert model.backbone.layers[0].attention.key.kernel.shape == (64, 8, 8)


def test_next_key_draws_the_keys_and_counts_of_the_flax_stream():
    """``next_key(rngs.params)`` is ``rngs.params()``: the same keys in turn and the same count after, eagerly and
    inside ``jit`` (where the parameters of a model built under ``jit`` / ``eval_shape`` draw theirs)."""
    def draws(take, seed):
        rngs = nnx.Rngs(seed)
        keys = [jax.random.key_data(take(rngs.params)) for _ in range(4)]
        return jnp.stack(keys), rngs.params.count.get_value()

    for seed in (0, 7):
        ours, theirs = draws(next_key, seed), draws(lambda stream: stream(), seed)
        jitted = jax.jit(lambda: draws(next_key, seed))()
        for got in (ours, jitted):
            np.testing.assert_array_equal(got[0], theirs[0])
            assert int(got[1]) == int(theirs[1]) == 4
    assert len({tuple(np.asarray(k)) for k in draws(next_key, 0)[0]}) == 4  # four different keys


def test_compute_copy_rounds_as_the_cast_does():
    """``compute_copy`` (the weights' bfloat16 copy, rounded by ``reduce_precision`` so that XLA keeps the cast inside
    the layer scan) gives the bits of ``astype`` for every kind of float32: ties, both halves of every rounding,
    subnormals, the largest finite values (which round to infinity), infinities and NaN; other pairs are plain
    casts. Checked on the float32 bit patterns themselves, against ml_dtypes' cast through numpy."""
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 2**16, size=4096, dtype=np.uint32) << 16) | 0x8000  # exactly halfway: round to even
    specials = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-39, 3.3895e38, 3.4028235e38, -3.4028235e38, np.inf, -np.inf,
                         np.nan, 1.0, 1.00390625, 1.005859375], np.float32).view(np.uint32)
    values = np.concatenate([bits, ties, specials]).view(np.float32)
    got = np.asarray(jax.jit(compute_copy, static_argnums=1)(jnp.asarray(values), jnp.bfloat16))
    want = values.astype(jnp.bfloat16)
    assert got.dtype == want.dtype
    finite = ~np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(got.view(np.uint16)[finite], want.view(np.uint16)[finite])
    assert np.isnan(got.astype(np.float32)[~finite]).all()
    half = np.asarray(compute_copy(jnp.asarray(values[:1000]), jnp.float16))
    np.testing.assert_array_equal(half, values[:1000].astype(np.float16))
    # and the gradient the cast has: the bfloat16 cotangent, widened
    weights = jnp.asarray(rng.normal(size=(64,)), jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=(64,)), jnp.float32)
    grads = [jax.grad(lambda w: jnp.sum(cast(w).astype(jnp.float32) * cotangent))(weights)
             for cast in (lambda w: compute_copy(w, jnp.bfloat16), lambda w: w.astype(jnp.bfloat16))]
    np.testing.assert_array_equal(np.asarray(grads[0]), np.asarray(grads[1]))
    assert np.abs(np.asarray(grads[0])).min() > 0
