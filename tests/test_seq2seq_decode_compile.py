"""The encoder-decoder decode loop on XLA CPU, read on its compiled HLO (``_generate_from_source``, the program
``generate`` runs for a ``Seq2SeqForConditionalGeneration``): the ``while`` loop carries each decoder layer's
self-attention keys / values ``[batch · heads, capacity, head_dim]`` and cross-attention keys / values ``[batch ·
heads, src, head_dim]`` (projected and laid out once, before the loop: ``attention.heads_major``). Per step, each
self-attention buffer is written in place by one ``dynamic-update-slice`` and never copied
(``models/layers/DECODING.md``'s check for decoders); the cross-attention buffers are only read, never copied or
relaid out (kept as ``[batch, src, heads, head_dim]`` they were transposed by every step: a whole-buffer copy each)."""
import functools
import importlib
import re

import jax
import numpy as np
import pytest

from flaxzoo.models.architectures.encoder_decoder.model import Seq2SeqForConditionalGeneration
from flaxzoo.models.families import get_preset
from flaxzoo.models.modeling import create_model
from flaxzoo.train.tools.hlo import computations, entry_while

# the package exports the function of that name: the module by its path
generatelib = importlib.import_module("flaxzoo.models.inference.generate")

SOURCE, NEW_TOKENS = 8, 20  # source bucket 16, capacity 24: no other array of the program has these dims


@functools.lru_cache(maxsize=None)
def compiled(batch: int) -> tuple[str, dict]:
    """The optimised HLO of the greedy generation program for ``t5-tiny`` at ``batch``, and the buffer shapes."""
    config = get_preset("t5-tiny")
    model = create_model(config, Seq2SeqForConditionalGeneration, seed=0)
    width, capacity = generatelib.shape_bucket(SOURCE), generatelib.shape_bucket(NEW_TOKENS)
    ids = np.random.default_rng(0).integers(2, config.vocab_size, (batch, width), dtype=np.int32)
    mask = (np.arange(width) < SOURCE).astype(np.int32)[None].repeat(batch, 0)
    knobs = (np.float32(0.0), np.int32(0), np.float32(1.0), generatelib._padded_stop_ids(()), np.int32(0),
             np.float32(1.0))
    graphdef, state = generatelib.eval_split(model)
    hlo = generatelib._generate_from_source.lower(
        graphdef, state, ids, mask, np.int32(0), np.int32(NEW_TOKENS), jax.random.key(0), knobs, capacity=capacity,
        search=generatelib.Search(greedy=True)).compile().as_text()
    heads, head_dim = config.num_kv_heads, config.head_dim
    shapes = dict(self=(batch * heads, capacity, head_dim), cross=(batch * heads, width, head_dim),
                  layers=config.num_decoder_layers)
    return hlo, shapes


def body_instructions(hlo: str) -> list[tuple[str, tuple[int, ...], str, str]]:
    """``(dtype, dims, op, line)`` of every array instruction in the loop's body and the computations it calls."""
    comps = computations(hlo)
    body = re.search(r"body=(%[\w.\-]+)", entry_while(hlo)).group(1)
    seen, stack = {body}, [body]
    while stack:
        for line in comps.get(stack.pop(), []):
            for sub in re.findall(r"(?:calls|body|condition|to_apply)=(%[\w.\-]+)", line):
                if sub not in seen:
                    seen.add(sub)
                    stack.append(sub)
    found = []
    for name in seen:
        for line in comps[name]:
            match = re.search(r"= (\w+)\[([\d,]*)\]\S* ([\w\-]+)\(", line)
            if match:
                dims = tuple(int(d) for d in match.group(2).split(",") if d)
                found.append((match.group(1), dims, match.group(3), line.strip()))
    return found


def carried(hlo: str, dims: tuple[int, ...]) -> int:
    """How many float buffers of exactly ``dims`` the loop carries."""
    carry = entry_while(hlo).split(" while(")[0]
    return len(re.findall(r"f32\[" + ",".join(map(str, dims)) + r"\]", carry))


def copies_of(hlo: str, dims: tuple[int, ...]) -> list[str]:
    """The loop body's ``copy`` / ``transpose`` instructions whose output holds a whole buffer of ``dims`` (in any
    dimension order: a relayout is a copy too)."""
    return [line for dtype, out, op, line in body_instructions(hlo)
            if dtype == "f32" and op in ("copy", "transpose") and sorted(out) == sorted(dims)]


@pytest.mark.parametrize("batch", [1, 3])
def test_the_self_attention_caches_are_written_in_place_and_never_copied(batch):
    hlo, shapes = compiled(batch)
    layers = shapes["layers"]
    assert carried(hlo, shapes["self"]) == 2 * layers, entry_while(hlo)[:2000]
    assert carried(hlo, shapes["cross"]) == 2 * layers, entry_while(hlo)[:2000]
    writes = [line for dtype, out, op, line in body_instructions(hlo)
              if op == "dynamic-update-slice" and out == shapes["self"]]
    assert len(writes) == 2 * layers, writes  # one in-place write per buffer and step
    assert copies_of(hlo, shapes["self"]) == []
    # no other update of a whole cache buffer (a dynamic-update-slice into a copy, a relayout's update)
    assert not [line for dtype, out, op, line in body_instructions(hlo)
                if op == "dynamic-update-slice" and sorted(out) == sorted(shapes["self"]) and out != shapes["self"]]


@pytest.mark.parametrize("batch", [1, 3])
def test_the_cross_attention_memory_is_never_copied_in_the_loop(batch):
    hlo, shapes = compiled(batch)
    assert copies_of(hlo, shapes["cross"]) == []
    assert not [line for dtype, out, op, line in body_instructions(hlo)
                if op == "dynamic-update-slice" and sorted(out) == sorted(shapes["cross"])]


@pytest.mark.parametrize("in_shape, out_shape", [((6,), (2, 3)), ((2, 3), (6,)), ((5,), (7,))])
def test_the_decode_layout_computes_what_the_layer_computed(in_shape, out_shape):
    """``decode_layout``: a Dense read from its ``[out, in]`` matrix gives numpy's ``x · W + b`` (1e-6) for one or
    several input / output axes; a layer with LoRA adapters beside its kernel keeps its layout."""
    from flax import nnx

    from flaxzoo.models.layers.linear import Dense, decode_layout

    dense = Dense(in_shape, out_shape, axes=(None,) * (len(in_shape) + len(out_shape)), use_bias=True,
                  rngs=nnx.Rngs(0), init_std=0.5)
    dense.bias.set_raw_value(jax.random.normal(jax.random.key(1), out_shape))
    x = np.random.default_rng(2).standard_normal((3, 4, *in_shape)).astype(np.float32)
    kernel, bias = np.asarray(dense.kernel[...]), np.asarray(dense.bias[...])
    expected = (x.reshape(12, -1) @ kernel.reshape(int(np.prod(in_shape)), -1)).reshape(3, 4, *out_shape) + bias
    adapted = Dense(in_shape, out_shape, axes=(None,) * (len(in_shape) + len(out_shape)), use_bias=False,
                    rngs=nnx.Rngs(0))
    adapted.kernel_lora_a = nnx.LoRAParam(np.zeros((int(np.prod(in_shape)), 2), np.float32))
    decode_layout([dense, adapted])
    assert dense.kernel[...].shape == (int(np.prod(out_shape)), int(np.prod(in_shape))) and dense.out_major
    np.testing.assert_allclose(np.asarray(dense(x)), expected, rtol=1e-6, atol=1e-6)
    assert adapted.kernel[...].shape == (*in_shape, *out_shape) and not getattr(adapted, "out_major", False)
