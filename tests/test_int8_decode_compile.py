"""int8 weights reach the matmuls as int8 on accelerators, proven on compiled programs: the whole ``generate``
(prefill + decode loop) for one H100, whose loop carries the int8 arrays and no float copy of them and converts them
inside its fusions; one decode step for one TPU v5e chip, whose fusions read the int8 kernels. (XLA CPU, by contrast,
moves the conversion out of the loop: ``models/QUANTIZE.md``. A deviceless compile of the whole loop for a TPU
crashes libtpu's compiler here, so the TPU test compiles one step.)"""
import importlib
import os
import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # two test workers may load libtpu at once
from flaxzoo.models import GPTForCausalLM, create_model, get_preset  # noqa: E402
from flaxzoo.models.adapters.quantize import quantize_model  # noqa: E402
from flaxzoo.train.tools import targets  # noqa: E402
from flaxzoo.train.tools.hlo import computations, entry_while  # noqa: E402

generatelib = importlib.import_module("flaxzoo.models.inference.generate")  # the package exports the function of that name

HIDDEN, MLP = 128, 512
HEADS, HEAD_DIM = 2, 64
# The MLP's up / down kernels and the attention's query / key / value and out kernels.
WEIGHT_SHAPES = (f"{HIDDEN},{MLP}", f"{MLP},{HIDDEN}", f"{HIDDEN},{HEADS},{HEAD_DIM}", f"{HEADS},{HEAD_DIM},{HIDDEN}")


def device_and_model(target_name: str):
    """One chip of ``target_name`` (skips without its compiler) and a tiny bfloat16 GPT with int8 projections."""
    ok, why = targets.plugin_available(targets.parse_target(target_name).platform)
    if not ok:
        pytest.skip(why)
    device = targets.compile_devices(targets.parse_target(target_name))[0]
    config = get_preset("gpt2", vocab_size=384, hidden_size=HIDDEN, num_layers=2, num_heads=HEADS,
                        intermediate_size=MLP, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
                        dtype="bfloat16")
    return device, quantize_model(create_model(config, GPTForCausalLM, seed=0), "int8")


def compiled_generate_hlo(target_name: str) -> str:
    """The optimised HLO of ``generate``'s whole program (prefill + decode loop) for one chip of ``target_name``."""
    device, model = device_and_model(target_name)
    with jax.default_device(device), targets.persistent_cache_off():  # traced for the target's platform
        lowered = generatelib.lower_generate(model, 1, 32, 32, sharding=jax.sharding.SingleDeviceSharding(device))
        return lowered.compile().as_text()


def compiled_decode_step_hlo(target_name: str) -> str:
    """The optimised HLO of one cached decode step (batch 1, a 64-slot cache) for one chip of ``target_name``."""
    device, model = device_and_model(target_name)
    graphdef, state = generatelib.eval_split(model)
    placed = jax.sharding.SingleDeviceSharding(device)

    def step(state, decode_state, tokens):
        logits, decode_state = nnx.merge(graphdef, state).decode(tokens, decode_state)
        return logits, decode_state

    def spec(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placed)

    with jax.default_device(device), targets.persistent_cache_off():
        decode_state = jax.eval_shape(lambda: model.init_state(1, 64))
        return jax.jit(step).lower(jax.tree.map(spec, state), jax.tree.map(spec, decode_state),
                                   jax.ShapeDtypeStruct((1, 1), jnp.int32, sharding=placed)).compile().as_text()


def loop_carry(hlo: str) -> str:
    """The type of the decode loop's carried tuple."""
    return entry_while(hlo).split(" while(")[0]


def int8_readers(hlo: str, within_loop: bool = True) -> list[set[str]]:
    """For each computation (in the decode loop's body, or anywhere) that takes an int8 weight as a parameter, the
    HLO ops inside it."""
    comps = computations(hlo)
    if not within_loop:
        return [ops_in(comps, name) for name in sorted(comps) if takes_int8_weight(comps[name])]
    body = re.search(r"body=(%[\w.\-]+)", entry_while(hlo)).group(1)
    seen, stack = {body}, [body]
    while stack:
        for line in comps.get(stack.pop(), []):
            for sub in re.findall(r"(?:calls|body|condition|to_apply)=(%[\w.\-]+)", line):
                if sub not in seen:
                    seen.add(sub)
                    stack.append(sub)

    return [ops_in(comps, name) for name in sorted(seen) if takes_int8_weight(comps[name])]


def takes_int8_weight(lines: list[str]) -> bool:
    return any(re.search(rf"= s8\[({'|'.join(WEIGHT_SHAPES)})\]\S* parameter\(", line) for line in lines)


def ops_in(comps: dict[str, list[str]], name: str) -> set[str]:
    """The HLO op names in computation ``name`` and the fusions it calls."""
    found = set()
    for line in comps.get(name, []):
        match = re.search(r"= [\w\[\],{}.:()]+ ([\w\-]+)\(", line)
        found |= {match.group(1)} if match else set()
        for sub in re.findall(r"calls=(%[\w.\-]+)", line):
            found |= ops_in(comps, sub)
    return found


@pytest.mark.slow
def test_the_gpu_decode_loop_reads_int8_weights():
    hlo = compiled_generate_hlo("h100x1")
    carry = loop_carry(hlo)
    for shape in WEIGHT_SHAPES:  # int8 in, no float copy made before the loop
        assert f"s8[{shape}]" in carry and f"bf16[{shape}]" not in carry and f"f32[{shape}]" not in carry, carry
    readers = int8_readers(hlo)
    assert len(readers) >= len(WEIGHT_SHAPES) and all("convert" in ops for ops in readers), readers
    # At batch 1 XLA turns projections into reductions that convert the int8 entries as they read them.
    assert any("reduce" in ops or "dot" in ops for ops in readers), readers


@pytest.mark.slow
def test_a_tpu_decode_step_reads_int8_weights():
    hlo = compiled_decode_step_hlo("v5e-1")
    comps = computations(hlo)
    readers = [ops_in(comps, name) for name in sorted(comps) if name != "ENTRY" and takes_int8_weight(comps[name])]
    matmuls = [ops for ops in readers if {"reduce", "dot", "convolution"} & ops]
    # Every computation given an int8 kernel either moves it as int8 (a relayout copy) or converts it inside the
    # matmul's fusion (at batch 1 a multiply-reduce): none makes a float copy of a kernel for a later matmul.
    assert len(matmuls) >= len(WEIGHT_SHAPES) and all({"convert", "multiply"} <= ops for ops in matmuls), readers
    assert all(ops <= {"copy", "parameter", "bitcast"} for ops in readers if ops not in matmuls), readers
