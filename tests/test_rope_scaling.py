"""RoPE scaling against transformers' own frequency functions (``ROPE_INIT_FUNCTIONS``) and rotary modules."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

from flaxzoo.models.layers.rope_scaling import (
    dynamic_ntk_inv_freq,
    longrope_inv_freq,
    normalize_rope_scaling,
    rope_angles_scaled,
    rope_frequencies,
    rope_inv_freq,
)

transformers.logging.set_verbosity_error()
RNG = np.random.default_rng(0)
LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}
QWEN25_YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}  # config.json spelling


def longrope(half: int, **extra) -> dict:
    """Phi-3-mini-128k-like LongRoPE: random factors (short near 1, long 1..60) for ``half`` frequencies."""
    return {"rope_type": "longrope", "short_factor": list(1.0 + 0.1 * RNG.random(half)),
            "long_factor": list(1.0 + 59.0 * RNG.random(half)), "original_max_position_embeddings": 4096, **extra}


# (head_dim, partial_rotary_factor, theta, max_position_embeddings, rope dict, seq_len)
CASES = {
    "default": (64, 1.0, 10000.0, 2048, {"rope_type": "default"}, None),
    "default-llama3-theta": (128, 1.0, 500000.0, 8192, {"rope_type": "default"}, None),
    "default-partial-neox": (64, 0.25, 10000.0, 2048, {"rope_type": "default"}, None),
    "linear-2": (64, 1.0, 10000.0, 4096, {"rope_type": "linear", "factor": 2.0}, None),
    "linear-gemma3": (128, 1.0, 1000000.0, 131072, {"type": "linear", "factor": 8}, None),
    "linear-partial": (64, 0.25, 10000.0, 4096, {"rope_type": "linear", "factor": 4.0}, None),
    "llama3-3.1-8b": (128, 1.0, 500000.0, 131072, LLAMA31, None),
    "llama3-3.2-1b": (64, 1.0, 500000.0, 131072, {**LLAMA31, "factor": 32.0}, None),
    "llama3-other": (96, 1.0, 10000.0, 16384, {**LLAMA31, "factor": 4, "low_freq_factor": 2.0,
                                               "high_freq_factor": 8.0, "original_max_position_embeddings": 2048},
                     None),
    "llama3-partial": (64, 0.25, 500000.0, 131072, LLAMA31, None),
    "yarn-qwen2.5": (128, 1.0, 1000000.0, 131072, QWEN25_YARN, None),
    "yarn-gpt-oss": (64, 1.0, 150000.0, 131072, {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                                  "beta_slow": 1.0, "original_max_position_embeddings": 4096,
                                                  "truncate": False}, None),
    "yarn-mscale": (64, 1.0, 10000.0, 163840, {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
                                                "mscale_all_dim": 0.8, "beta_fast": 16, "beta_slow": 2,
                                                "original_max_position_embeddings": 4096}, None),
    "yarn-attention-factor": (64, 1.0, 10000.0, 8192, {"rope_type": "yarn", "factor": 2.0,
                                                        "attention_factor": 1.25,
                                                        "original_max_position_embeddings": 4096}, None),
    "yarn-partial": (64, 0.25, 10000.0, 16384, {"rope_type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 4096}, None),
    "longrope-phi3-init": (96, 1.0, 10000.0, 131072, longrope(48), None),
    "longrope-phi3-short": (96, 1.0, 10000.0, 131072, longrope(48), 4096),
    "longrope-phi3-long": (96, 1.0, 10000.0, 131072, longrope(48), 4097),
    "longrope-factor-long": (64, 1.0, 10000.0, 65536, longrope(32, factor=16.0), 50000),
    "longrope-attn-short": (64, 1.0, 10000.0, 65536, longrope(32, attention_factor=1.1), 100),
    "longrope-partial-phi4-long": (128, 0.75, 250000.0, 131072, longrope(48), 9000),
    "longrope-partial-phi4-short": (128, 0.75, 250000.0, 131072, longrope(48), 9),
    "dynamic-init": (64, 1.0, 10000.0, 2048, {"rope_type": "dynamic", "factor": 2.0}, None),
    "dynamic-below": (64, 1.0, 10000.0, 2048, {"rope_type": "dynamic", "factor": 2.0}, 1000),
    "dynamic-at": (64, 1.0, 10000.0, 2048, {"rope_type": "dynamic", "factor": 2.0}, 2048),
    "dynamic-above": (64, 1.0, 10000.0, 2048, {"rope_type": "dynamic", "factor": 2.0}, 5000),
    "dynamic-far-above": (128, 1.0, 500000.0, 4096, {"type": "dynamic", "factor": 4}, 60000),
    "dynamic-partial-above": (64, 0.25, 10000.0, 2048, {"rope_type": "dynamic", "factor": 3.0}, 3000),
}


def hf_config(head_dim: int, partial: float, theta: float, max_positions: int, rope: dict):
    params = {**rope, "rope_theta": theta}
    if partial != 1.0:
        params["partial_rotary_factor"] = partial
    return transformers.LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                                    max_position_embeddings=max_positions, rope_parameters=params)


def hf_frequencies(config, seq_len):
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":  # Phi-3's default honours partial_rotary_factor (Llama's ignores it)
        inv_freq, attention = Phi3RotaryEmbedding.compute_default_rope_parameters(config)
    else:
        inv_freq, attention = ROPE_INIT_FUNCTIONS[rope_type](config, device=None, seq_len=seq_len)
    return inv_freq.numpy(), attention


@pytest.mark.parametrize("case", list(CASES))
def test_frequencies_match_transformers(case):
    head_dim, partial, theta, max_positions, rope, seq_len = CASES[case]
    rotary_dim = int(head_dim * partial)
    expected_inv, expected_attention = hf_frequencies(hf_config(*CASES[case][:5]), seq_len)
    assert expected_inv.shape == (rotary_dim // 2,)

    inv_freq, attention = rope_frequencies(rotary_dim, theta, rope, max_positions, seq_len=seq_len)
    assert inv_freq.dtype == np.float32 and inv_freq.shape == (rotary_dim // 2,)
    np.testing.assert_allclose(inv_freq, expected_inv, rtol=1e-6, atol=0)
    assert attention == expected_attention

    # the traceable path (seq_len a traced scalar) gives the same frequencies
    scaling = normalize_rope_scaling(rope, max_position_embeddings=max_positions, rotary_dim=rotary_dim)
    traced = jax.jit(lambda n: rope_inv_freq(rotary_dim, theta, scaling, max_positions, n)[0])(jnp.int32(seq_len or 1))
    np.testing.assert_allclose(np.asarray(traced), expected_inv, rtol=1e-6, atol=0)
    assert rope_inv_freq(rotary_dim, theta, scaling, max_positions, seq_len)[1] == expected_attention


@pytest.mark.parametrize("seq_len", [1, 2048, 2049, 8000, 300000])
def test_dynamic_ntk_traced_matches_transformers(seq_len):
    config = hf_config(128, 1.0, 500000.0, 2048, {"rope_type": "dynamic", "factor": 8.0})
    expected, _ = hf_frequencies(config, seq_len)
    fn = jax.jit(lambda n: dynamic_ntk_inv_freq(128, 500000.0, 8.0, 2048, n))
    ours = np.asarray(fn(jnp.int32(seq_len)))
    np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=0)
    if seq_len <= 2048:  # unstretched: exactly the default frequencies
        np.testing.assert_array_equal(ours, rope_frequencies(128, 500000.0, None, 2048)[0])


def test_longrope_traced_selection():
    rope = longrope(32)
    config = hf_config(64, 1.0, 10000.0, 131072, rope)
    fn = jax.jit(lambda n: longrope_inv_freq(64, 10000.0, normalize_rope_scaling(rope, max_position_embeddings=131072),
                                             131072, n))
    for seq_len in (1, 4096, 4097, 131072):
        np.testing.assert_allclose(np.asarray(fn(jnp.int32(seq_len))), hf_frequencies(config, seq_len)[0], rtol=1e-6)


def hf_cos_sin(module_cls, config, positions):
    module = module_cls(config)  # fresh: dynamic RoPE keeps state between calls
    x = torch.zeros(1, dtype=torch.float32)
    cos, sin = module(x, torch.as_tensor(positions, dtype=torch.int64))
    return cos.numpy(), sin.numpy()


def our_cos_sin(positions, rotary_dim, theta, rope, max_positions):
    angles, attention = jax.jit(rope_angles_scaled, static_argnums=(1, 2, 3, 4))(
        jnp.asarray(positions), rotary_dim, theta, normalize_rope_scaling(rope, max_position_embeddings=max_positions),
        max_positions)
    assert angles.shape == (*positions.shape, rotary_dim // 2) and angles.dtype == jnp.float32
    angles = np.concatenate([np.asarray(angles)] * 2, axis=-1)  # rotate-half layout of the reference
    return np.cos(angles) * np.float32(attention), np.sin(angles) * np.float32(attention), angles, attention


@pytest.mark.parametrize("name, module_cls, head_dim, theta, max_positions, rope, top", [
    ("yarn-qwen2.5", LlamaRotaryEmbedding, 128, 1e6, 131072, QWEN25_YARN,
     40000),
    ("yarn-mscale", LlamaRotaryEmbedding, 64, 1e4, 163840,
     CASES["yarn-mscale"][4], 5000),
    ("longrope-long", Phi3RotaryEmbedding, 96, 1e4, 131072, longrope(48), 6000),
    ("longrope-short", Phi3RotaryEmbedding, 96, 1e4, 131072, longrope(48), 4000),
    ("dynamic-above", LlamaRotaryEmbedding, 64, 1e4, 2048,
     {"rope_type": "dynamic", "factor": 2.0}, 5000),
])
def test_cos_sin_match_rotary_module(name, module_cls, head_dim, theta, max_positions, rope, top):
    """cos/sin from ``rope_angles_scaled`` x attention factor = the module's output (seq_len = max(positions) + 1)."""
    positions = np.sort(RNG.integers(0, top, size=(2, 24)), axis=-1)
    positions[0, -1] = top - 1
    config = hf_config(head_dim, 1.0, theta, max_positions, rope)
    expected_cos, expected_sin = hf_cos_sin(module_cls, config, positions)
    cos, sin, angles, attention = our_cos_sin(positions, head_dim, theta, rope, max_positions)
    # Both sides' frequencies are float32, a few ulps apart (the test above bounds them by 1e-6 relative); at an
    # angle of a radians that moves cos and sin by up to ~a * 4e-7 (0.016 at 40000), the rest is rounding.
    bound = attention * (np.abs(angles) * 5e-7 + 2e-6)
    assert np.all(np.abs(cos - expected_cos) <= bound), np.max(np.abs(cos - expected_cos) / bound)
    assert np.all(np.abs(sin - expected_sin) <= bound), np.max(np.abs(sin - expected_sin) / bound)


def test_seq_len_is_max_position_plus_one_per_call():
    rope = {"rope_type": "dynamic", "factor": 2.0}
    scaling = normalize_rope_scaling(rope, max_position_embeddings=2048)
    positions = jnp.asarray([[0, 1, 2], [3000, 3001, 4999]])
    angles, _ = rope_angles_scaled(positions, 64, 1e4, scaling, 2048)
    inv_freq, _ = rope_frequencies(64, 1e4, scaling, 2048, seq_len=5000)
    np.testing.assert_allclose(np.asarray(angles), np.asarray(positions, np.float32)[..., None] * inv_freq, rtol=1e-6)
    # an explicit seq_len overrides it (e.g. the KV-cache length, to keep one set of frequencies)
    angles, _ = rope_angles_scaled(positions[:1], 64, 1e4, scaling, 2048, seq_len=5000)
    np.testing.assert_allclose(np.asarray(angles), np.asarray(positions[:1], np.float32)[..., None] * inv_freq,
                               rtol=1e-6)


# --------------------------------------------------------------------------------------------------- normalising


def test_normalize_hub_and_v5_spellings():
    hub = normalize_rope_scaling(QWEN25_YARN, max_position_embeddings=131072)
    v5 = normalize_rope_scaling({"rope_type": "yarn", "rope_theta": 1e6, "factor": 4, "partial_rotary_factor": 1.0,
                                 "original_max_position_embeddings": 32768, "beta_fast": None},
                                max_position_embeddings=131072)
    assert hub == v5 == (("factor", 4.0), ("original_max_position_embeddings", 32768), ("rope_type", "yarn"))
    assert normalize_rope_scaling(hub, max_position_embeddings=131072) == hub  # idempotent


def test_normalize_is_hashable_for_frozen_config():
    @dataclasses.dataclass(frozen=True)
    class Config:
        rope_scaling: tuple | None

    scaling = normalize_rope_scaling(longrope(8), max_position_embeddings=131072, rotary_dim=16)
    assert isinstance(dict(scaling)["long_factor"], tuple) and len(dict(scaling)["long_factor"]) == 8
    assert [key for key, _ in scaling] == sorted(key for key, _ in scaling)
    hash(Config(scaling))
    assert jax.jit(lambda p, s: rope_angles_scaled(p, 16, 1e4, s, 131072)[0], static_argnums=1)(
        jnp.zeros((1, 2), jnp.int32), scaling).shape == (1, 2, 8)


@pytest.mark.parametrize("raw", [None, {}, {"rope_type": "default"}, {"type": "default", "rope_theta": 1e4}])
def test_normalize_default_is_none(raw):
    assert normalize_rope_scaling(raw, max_position_embeddings=2048) is None


def test_normalize_top_level_original_max_takes_priority_as_phi3():
    rope = {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48}
    scaling = normalize_rope_scaling(rope, max_position_embeddings=131072, original_max_position_embeddings=4096)
    assert dict(scaling)["original_max_position_embeddings"] == 4096
    config = transformers.Phi3Config(hidden_size=192, num_attention_heads=2, max_position_embeddings=131072,
                                     original_max_position_embeddings=4096, rope_theta=1e4, rope_scaling=dict(rope))
    for seq_len in (None, 5000):
        inv_freq, attention = ROPE_INIT_FUNCTIONS["longrope"](config, device=None, seq_len=seq_len)
        ours, our_attention = rope_frequencies(96, 1e4, scaling, 131072, seq_len=seq_len)
        np.testing.assert_allclose(ours, inv_freq.numpy(), rtol=1e-6)
        assert our_attention == attention  # from factor = max / original = 32


# --------------------------------------------------------------------------------------------------------- errors

BAD = [
    ({"rope_type": "mrope", "mrope_section": [8, 12, 12]}, "'mrope'"),
    ({"type": "su", "short_factor": [1.0], "long_factor": [1.0]}, "'su'"),
    ({"rope_type": "linear"}, "'factor'"),
    ({"rope_type": "yarn", "original_max_position_embeddings": 4096}, "'factor'"),
    ({"rope_type": "linear", "factor": 0}, "'factor' = 0"),
    ({"rope_type": "dynamic", "factor": -2.0}, "'factor' = -2.0"),
    ({"rope_type": "linear", "factor": "8"}, "'factor' = '8'"),
    ({"rope_type": "linear", "factor": True}, "'factor' = True"),
    ({"rope_type": "linear", "factor": float("nan")}, "'factor' = nan"),
    ({k: v for k, v in LLAMA31.items() if k != "low_freq_factor"}, "'low_freq_factor'"),
    ({k: v for k, v in LLAMA31.items() if k != "high_freq_factor"}, "'high_freq_factor'"),
    ({k: v for k, v in LLAMA31.items() if k != "original_max_position_embeddings"},
     "'original_max_position_embeddings'"),
    ({**LLAMA31, "high_freq_factor": 1.0}, "'high_freq_factor' = 1.0"),
    ({**LLAMA31, "original_max_position_embeddings": 81.92}, "81.92"),
    ({"rope_type": "linear", "factr": 2.0}, "'factr' = 2.0"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "low_freq_factor": 1.0},
     "'low_freq_factor' = 1.0"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "beta_fast": 0},
     "'beta_fast' = 0"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "truncate": "no"},
     "'truncate' = 'no'"),
    ({"rope_type": "linear", "type": "dynamic", "factor": 2.0}, "'dynamic'"),
    ({**longrope(32), "short_factor": [1.0] * 16}, "'short_factor' has 16 entries: expected rotary_dim // 2 = 32"),
    ({**longrope(32), "long_factor": [1.0] * 33}, "'long_factor' has 33 entries"),
    ({**longrope(32), "long_factor": [1.0] * 31 + [-1.0]}, "'long_factor[31]' = -1.0"),
]


@pytest.mark.parametrize("raw, message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_scaling_raises_naming_the_value(raw, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        normalize_rope_scaling(raw, max_position_embeddings=131072, rotary_dim=64)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        rope_frequencies(64, 10000.0, raw, 131072)


def test_longrope_length_checked_without_rotary_dim_at_normalise_time():
    scaling = normalize_rope_scaling(longrope(32), max_position_embeddings=131072)  # no rotary_dim: not checked yet
    with pytest.raises(ValueError, match="'long_factor' has 32 entries: expected rotary_dim // 2 = 48"):
        rope_frequencies(96, 10000.0, scaling, 131072)


@pytest.mark.parametrize("rotary_dim", [0, 7, -4, 16.0])
def test_bad_rotary_dim(rotary_dim):
    with pytest.raises(ValueError, match=f"rotary_dim = {rotary_dim!r}"):
        rope_frequencies(rotary_dim, 10000.0, None, 2048)


def test_bad_theta_and_max_positions():
    with pytest.raises(ValueError, match="'theta' = -1.0"):
        rope_frequencies(64, -1.0, None, 2048)
    with pytest.raises(ValueError, match="'max_position_embeddings' = 0"):
        normalize_rope_scaling({"rope_type": "linear", "factor": 2.0}, max_position_embeddings=0)
