"""int8 weights stay int8 inside the GPU decode loop, proven on the compiled program (a deviceless compile of
``generate`` for one H100): the loop carries the int8 arrays and no float copy of them, and fusions inside it convert
them as they read them. (XLA CPU, by contrast, moves the conversion out of the loop: ``models/QUANTIZE.md``.)"""
import importlib
import os
import re

import jax
import pytest

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # two test workers may load libtpu at once
from flaxzoo.models import GPTForCausalLM, create_model, get_preset  # noqa: E402
from flaxzoo.models.quantize import quantize_model  # noqa: E402
from flaxzoo.train import targets  # noqa: E402

generatelib = importlib.import_module("flaxzoo.models.generate")  # the package exports the function of that name

HIDDEN, MLP = 128, 512
HEADS, HEAD_DIM = 2, 64
# The MLP's up / down kernels and the attention's query / key / value and out kernels.
WEIGHT_SHAPES = (f"{HIDDEN},{MLP}", f"{MLP},{HIDDEN}", f"{HIDDEN},{HEADS},{HEAD_DIM}", f"{HEADS},{HEAD_DIM},{HIDDEN}")


def compiled_generate_hlo(target_name: str) -> str:
    """The optimised HLO of ``generate``'s whole program (prefill + decode loop) for one chip of ``target_name``, on
    a tiny GPT whose projections are int8, in bfloat16."""
    ok, why = targets.plugin_available(targets.parse_target(target_name).platform)
    if not ok:
        pytest.skip(why)
    device = targets.compile_devices(targets.parse_target(target_name))[0]
    config = get_preset("gpt2", vocab_size=384, hidden_size=HIDDEN, num_layers=2, num_heads=HEADS,
                        intermediate_size=MLP, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
                        dtype="bfloat16")
    model = quantize_model(create_model(config, GPTForCausalLM, seed=0), "int8")
    with jax.default_device(device), targets.persistent_cache_off():  # traced for the GPU
        lowered = generatelib.lower_generate(model, 1, 32, 32, sharding=jax.sharding.SingleDeviceSharding(device))
        return lowered.compile().as_text()


def computations(hlo: str) -> dict[str, list[str]]:
    found, current = {}, None
    for line in hlo.splitlines():
        if line and not line.startswith(" ") and "{" in line:
            current = "ENTRY" if line.startswith("ENTRY") else line.split(" ")[0]
            found[current] = []
        elif current is not None:
            found[current].append(line)
    return found


def decode_loop(hlo: str) -> str:
    """The decode loop's ``while`` instruction: the one the entry computation runs."""
    (line,) = [line for line in computations(hlo)["ENTRY"] if " while(" in line]
    return line


def loop_carry(hlo: str) -> str:
    """The type of the decode loop's carried tuple."""
    return decode_loop(hlo).split(" while(")[0]


def int8_readers_in_loop(hlo: str) -> list[set[str]]:
    """For each fused computation run by the loop body that takes an int8 weight, the HLO ops inside it."""
    comps = computations(hlo)
    body = re.search(r"body=(%[\w.\-]+)", decode_loop(hlo)).group(1)
    seen, stack = {body}, [body]
    while stack:
        for line in comps.get(stack.pop(), []):
            for sub in re.findall(r"(?:calls|body|condition|to_apply)=(%[\w.\-]+)", line):
                if sub not in seen:
                    seen.add(sub)
                    stack.append(sub)

    def ops(name: str) -> set[str]:
        found = set()
        for line in comps.get(name, []):
            match = re.search(r"= [\w\[\],{}.:]+ ([\w\-]+)\(", line)
            found |= {match.group(1)} if match else set()
            for sub in re.findall(r"calls=(%[\w.\-]+)", line):
                found |= ops(sub)
        return found

    return [ops(name) for name in sorted(seen)
            if any(re.search(rf"= s8\[({'|'.join(WEIGHT_SHAPES)})\]\S* parameter\(", line) for line in comps[name])]


def test_the_gpu_decode_loop_reads_int8_weights():
    hlo = compiled_generate_hlo("h100x1")
    carry = loop_carry(hlo)
    for shape in WEIGHT_SHAPES:  # int8 in, no float copy made before the loop
        assert f"s8[{shape}]" in carry and f"bf16[{shape}]" not in carry and f"f32[{shape}]" not in carry, carry
    readers = int8_readers_in_loop(hlo)
    assert len(readers) >= len(WEIGHT_SHAPES) and all("convert" in ops for ops in readers), readers
    # At batch 1 XLA turns projections into reductions that convert the int8 entries as they read them.
    assert any("reduce" in ops or "dot" in ops for ops in readers), readers
