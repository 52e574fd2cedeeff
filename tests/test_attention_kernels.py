"""The Pallas flash-attention kernels (models/layers/attention_kernels.py) in interpret mode on CPU against
``jax.nn.dot_product_attention``'s XLA path given the dense ``[batch, 1, q, k]`` mask the segments and causality
make: forward and the gradients wrt query, key and value (of a random-weighted sum of the output), all within
``TOLERANCE`` max abs error in float32 at "highest" matmul precision (the GPU kernel's gradients within
``GPU_FLASH_GRAD_TOLERANCE``). Cases: packed grouped-query rows (several
documents, padding at the end of a row, a fully padded row), causal and bidirectional, a length that is not a
multiple of the blocks (padded inside), no segments; for splash also BERT's mask (query segments all ones, key
segments the 0/1 mask, one row with no real key: uniform attention) and cross-length causal attention with
left-padded keys. And the predicates' answers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxzoo.models.layers.attention_kernels import (gpu_flash_attention, gpu_flash_supported, splash_attention,
                                             splash_supported)

TOLERANCE = 1e-5  # max abs error, float32; measured: forward <= 3.1e-6, gradients <= 6.7e-6 but GPU dv
# The GPU kernel recomputes the probabilities in its backward pass as exp2(q·k·log2(e)/√d - lse₂): on the one
# 256-token document (|dv| up to 7.8) its dv is 1.5e-5 off float64 where XLA's float32 is 4e-6 off (2 ppm of |dv|).
GPU_FLASH_GRAD_TOLERANCE = 2.5e-5
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32


def random_inputs(seed: int, batch: int, q_len: int, k_len: int):
    rng = np.random.default_rng(seed)
    query = rng.standard_normal((batch, q_len, HEADS, HEAD_DIM)) * 1.5  # a peaked softmax: errors show
    key = rng.standard_normal((batch, k_len, KV_HEADS, HEAD_DIM)) * 1.5
    value = rng.standard_normal((batch, k_len, KV_HEADS, HEAD_DIM))
    return tuple(jnp.asarray(x, jnp.float32) for x in (query, key, value))


def packed_segments(seq: int) -> jax.Array:
    """``[3, seq]``: three documents then padding; two documents filling the row; a fully padded row."""
    third = seq // 3
    rows = [[1] * third + [2] * third + [3] * (third // 2), [1] * (seq // 2) + [2] * (seq - seq // 2), []]
    return jnp.asarray([row + [0] * (seq - len(row)) for row in rows], jnp.int32)


def reference(query, key, value, q_segments, kv_segments, causal):
    q_len, k_len = query.shape[1], key.shape[1]
    if q_segments is None:
        q_segments = jnp.ones(query.shape[:2], jnp.int32)
        kv_segments = jnp.ones(key.shape[:2], jnp.int32)
    mask = q_segments[:, :, None] == kv_segments[:, None, :]
    if causal:
        mask &= jnp.tril(jnp.ones((q_len, k_len), bool), k_len - q_len)
    return jax.nn.dot_product_attention(query, key, value, mask=mask[:, None], implementation="xla")


def assert_matches_reference(kernel, inputs, q_segments, kv_segments, causal, grad_tolerance=TOLERANCE):
    """``kernel(query, key, value, q_segments, kv_segments)``'s output (within ``TOLERANCE``) and (q, k, v)
    gradients (within ``grad_tolerance``) against the reference's."""
    weights = jnp.asarray(np.random.default_rng(7).standard_normal(inputs[0].shape), jnp.float32)

    def forward_and_grads(fn):
        def run(query, key, value, q_segments, kv_segments):
            out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, q_segments, kv_segments), query, key, value)
            return out, vjp(weights)
        return jax.jit(run)(*inputs, q_segments, kv_segments)

    with jax.default_matmul_precision("highest"):
        out, grads = forward_and_grads(kernel)
        expected, expected_grads = forward_and_grads(
            lambda q, k, v, qs, ks: reference(q, k, v, qs, ks, causal))
    errors = {name: float(jnp.max(jnp.abs(a - b)))
              for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), (expected, *expected_grads))}
    assert errors["out"] < TOLERANCE, errors
    assert max(errors["dq"], errors["dk"], errors["dv"]) < grad_tolerance, errors


def splash(causal):
    return lambda q, k, v, qs, ks: splash_attention(q, k, v, q_segments=qs, kv_segments=ks, causal=causal,
                                                    interpret=True)


def gpu_flash(causal):
    return lambda q, k, v, segments, _: gpu_flash_attention(q, k, v, segment_ids=segments, causal=causal,
                                                            interpret=True)


KERNELS = {"splash": (splash, TOLERANCE), "gpu_flash": (gpu_flash, GPU_FLASH_GRAD_TOLERANCE)}


@pytest.mark.parametrize("kernel", KERNELS)
# One case per kernel in the quick tier; bidirectional and the padded length in the slow tier.
@pytest.mark.parametrize("seq, causal", [(256, True), pytest.param(256, False, marks=pytest.mark.slow),
                                         pytest.param(200, True, marks=pytest.mark.slow)])
def test_packed_rows(kernel, seq, causal):
    segments = packed_segments(seq)
    inputs = random_inputs(seq, segments.shape[0], seq, seq)
    make, grad_tolerance = KERNELS[kernel]
    assert_matches_reference(make(causal), inputs, segments, segments, causal, grad_tolerance)


@pytest.mark.parametrize("kernel", KERNELS)
def test_no_segments_padded_length(kernel):
    inputs = random_inputs(1, 2, 200, 200)
    make, grad_tolerance = KERNELS[kernel]
    assert_matches_reference(make(False), inputs, None, None, False, grad_tolerance)


def test_splash_bert_mask():
    """Every query in segment 1, keys 0/1: padding queries read the real keys; row 1 has none (uniform)."""
    mask = np.ones((3, 256), np.int32)
    mask[0, 180:] = 0
    mask[1] = 0
    inputs = random_inputs(2, 3, 256, 256)
    assert_matches_reference(splash(False), inputs, jnp.ones((3, 256), jnp.int32), jnp.asarray(mask), False)


def test_splash_cross_causal_left_padded():
    """200 queries over 256 keys (bottom-right causal) whose first 100 are padding: the first 44 queries see no
    key (uniform); the query length is padded inside the kernel."""
    kv_segments = np.ones((2, 256), np.int32)
    kv_segments[0, :100] = 0
    inputs = random_inputs(3, 2, 200, 256)
    assert_matches_reference(splash(True), inputs, jnp.ones((2, 200), jnp.int32), jnp.asarray(kv_segments), True)


def test_predicates():
    query, key, gqa_key = (2, 256, 4, 64), (2, 256, 4, 64), (2, 256, 2, 64)
    assert splash_supported(query, gqa_key, jnp.bfloat16, causal=True, platform="tpu")[0]
    assert splash_supported(query, (2, 512, 2, 64), jnp.float32, causal=True, platform="tpu")[0]
    ok, reason = splash_supported(query, key, jnp.float32, causal=False, platform="cpu")
    assert not ok and "TPU" in reason
    assert splash_supported(query, key, jnp.float32, causal=False, platform="cpu", interpret=True)[0]
    assert not splash_supported(query, (2, 128, 4, 64), jnp.float32, causal=True, platform="tpu")[0]
    assert not splash_supported(query, key, jnp.float16, causal=False, platform="tpu")[0]
    assert not splash_supported(query, (2, 256, 3, 64), jnp.float32, causal=False, platform="tpu")[0]

    assert gpu_flash_supported(query, gqa_key, jnp.float16, causal=True, shared_segments=True, platform="gpu")[0]
    for q_shape, k_shape, shared in [(query, (2, 128, 4, 64), True), (query, key, False),
                                     ((2, 256, 4, 8), (2, 256, 4, 8), True)]:
        ok, reason = gpu_flash_supported(q_shape, k_shape, jnp.float16, causal=True, shared_segments=shared,
                                         platform="gpu")
        assert not ok and reason
    with pytest.raises(ValueError, match="query length"):
        gpu_flash_attention(jnp.zeros((1, 128, 4, 32)), jnp.zeros((1, 64, 4, 32)), jnp.zeros((1, 64, 4, 32)),
                            causal=False, interpret=True)


# ----------------------------------------------------------------------------------- whole models, and under a mesh
MODEL_CHECK = r'''
import json, sys
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from flaxzoo.models import BertForMaskedLM, GPTForCausalLM, get_preset
from flaxzoo.models.layers.partitioning import placed
from flaxzoo.train import sharding

jax.config.update("jax_default_matmul_precision", "highest")
impl, mesh_shapes = sys.argv[1], json.loads(sys.argv[2])  # the kernel alone (null) and under each mesh
placements = {json.dumps(shape): sharding.activation_placement(sharding.make_mesh(shape)) if shape else None
              for shape in mesh_shapes}
rng = np.random.default_rng(0)
segments = np.zeros((8, 160), np.int32)
for row in range(7):  # packed documents of random lengths, padding at the end; row 7 all padding
    cuts = np.sort(rng.choice(np.arange(8, 150), size=row % 3 + 1, replace=False))
    segments[row, :cuts[-1]] = np.searchsorted(cuts, np.arange(cuts[-1]), side="right") + 1
ids = jnp.asarray(rng.integers(0, 1000, (8, 160)), jnp.int32)
out = {key: {} for key in placements}
for name, cls, preset in (("gpt", GPTForCausalLM, "llama-tiny"), ("bert", BertForMaskedLM, "bert-tiny")):
    def loss(params, placement):
        model = nnx.merge(graphdef, params, rest)
        with placed(placement):
            if name == "gpt":
                logits = model(ids, segment_ids=jnp.asarray(segments))
            else:
                mask = jnp.asarray(segments > 0, jnp.int32)
                logits = model(ids, mask, segment_ids=jnp.asarray(segments))
        return jnp.mean(jnp.where(jnp.asarray(segments > 0)[..., None], logits, 0.0) ** 2)
    reference_model = cls(get_preset(preset, attention_impl="softmax", max_position_embeddings=256), rngs=nnx.Rngs(1))
    kernel_model = cls(get_preset(preset, attention_impl=impl, max_position_embeddings=256), rngs=nnx.Rngs(1))
    graphdef, params, rest = nnx.split(reference_model, nnx.Param, ...)
    l0, g0 = jax.jit(jax.value_and_grad(lambda p: loss(p, None)))(params)  # once, without a mesh
    graphdef, params, rest = nnx.split(kernel_model, nnx.Param, ...)
    for key, placement in placements.items():
        l1, g1 = jax.jit(jax.value_and_grad(lambda p: loss(p, placement)))(params)
        out[key][name] = {"loss": abs(float(l0) - float(l1)), "grad": max(
            float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)))}
print(json.dumps(out))
'''


@pytest.mark.slow
@pytest.mark.parametrize("impl, mesh", [("splash", [2, 2, 2]), ("gpu_flash", [4, 2, 1])])
def test_models_with_a_kernel_equal_the_softmax_kernel(impl, mesh):
    """A Llama-layout decoder and a BERT encoder on packed rows (and a fully padded one) with ``attention_impl`` set
    to a kernel, alone and under an 8-device mesh (the kernel in a ``shard_map``: batch over data x fsdp, heads over
    tensor), against the closed-form softmax kernel without a mesh: the loss and every parameter's gradient. Its
    own process per kernel (8 simulated CPU devices), the softmax reference computed once for both."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    repo = pathlib.Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(repo), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"}
    proc = subprocess.run([sys.executable, "-c", MODEL_CHECK, impl, json.dumps([None, mesh])], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(report) == sorted(json.dumps(shape) for shape in (None, mesh))
    tolerance = GPU_FLASH_GRAD_TOLERANCE if impl == "gpu_flash" else TOLERANCE
    for shape, errors in report.items():
        assert sorted(errors) == ["bert", "gpt"], shape
        for model, error in errors.items():
            assert error["loss"] < 1e-5 and error["grad"] < tolerance, (shape, model, error)
