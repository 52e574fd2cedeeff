"""Reading a compiled program's HLO text: its collectives, its fused attention kernels, its largest buffers, the
buffers that hold a whole global batch.

Used by ``flaxzoo.train.tools.compile`` (the deviceless compile report) and ``flaxzoo.train.tools.bench`` (which kernel a timed step ran).
Shapes in a partitioned (SPMD) program are per device.
"""

from __future__ import annotations

import collections
import math
import re
from typing import Iterator

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
# An instruction whose op is a collective (its async "-start" half counted once; "ragged-all-to-all" is not one).
_COLLECTIVE = re.compile(r"=\s*[^=]*?(?<![\w-])(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_ARRAY = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (\w+)\[([\d,]*)\]")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
BYTES_PER_ELEMENT = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
                     "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
                     "c128": 16}
# Which fused attention kernel a custom call is: (the call's target, a name the kernel's metadata carries).
KERNEL_SIGNS = {
    "splash": ('custom_call_target="tpu_custom_call"', "splash_mha_fwd"),  # Pallas' TPU (Mosaic) splash attention
    "gpu_flash": ('custom_call_target="__gpu$xla.gpu.triton"', "mha_forward"),  # Pallas' Triton flash attention
    "cudnn": ('custom_call_target="__cudnn$fmha', ""),  # cuDNN's fused attention
}


def computations(hlo: str) -> dict[str, list[str]]:
    """``{computation name: its instruction lines}`` of an HLO module's text; the entry computation is ``"ENTRY"``."""
    found, current = {}, None
    for line in hlo.splitlines():
        if line and not line.startswith(" ") and "{" in line:
            current = "ENTRY" if line.startswith("ENTRY") else line.split(" ")[0]
            found[current] = []
        elif current is not None:
            found[current].append(line)
    return found


def entry_while(hlo: str) -> str:
    """The one ``while`` instruction the entry computation runs (a generation program's decode loop)."""
    (line,) = [line for line in computations(hlo)["ENTRY"] if " while(" in line]
    return line


def collectives(hlo: str) -> dict[str, int]:
    """``{kind: count}`` of the collective operations (kinds of :data:`COLLECTIVES` that occur)."""
    counts = collections.Counter(m.group(1) for m in _COLLECTIVE.finditer(hlo))
    return {kind: counts[kind] for kind in COLLECTIVES if counts[kind]}


def attention_kernels(hlo: str) -> list[str]:
    """The fused attention kernels the program calls (names of :data:`KERNEL_SIGNS`); empty: attention runs as
    plain XLA operations (the closed-form softmax kernel or XLA's path)."""
    return [name for name, (target, kernel) in KERNEL_SIGNS.items() if target in hlo and kernel in hlo]


def largest_buffers(hlo: str, top: int = 5) -> list[str]:
    """The ``top`` largest arrays that instructions outside fusions produce, in words, largest first, each shape
    once: ``"bf16[12,64,1024,3072] (fusion.12, a fusion from .../mlp/dot_general): 4.50 GiB"``: the instruction, its
    op and the last steps of the JAX operation it came from (``metadata={op_name=...}``, when the line has it). (A
    fusion's inner values live in registers or on-chip memory; its output is the instruction that calls it.)"""
    largest: dict[str, tuple[float, str]] = {}
    for name, dtype, dims, line in _buffers(hlo):
        size = BYTES_PER_ELEMENT[dtype] * math.prod(int(d) for d in dims.split(",") if d)
        shape = f"{dtype}[{dims}]"
        if shape not in largest or largest[shape][0] < size:
            largest[shape] = (size, _producer(name, line))
    ranked = sorted(largest.items(), key=lambda item: -item[1][0])[:top]
    return [f"{shape} ({producer}): {size / 2**30:.2f} GiB" for shape, (size, producer) in ranked]


def global_batch_buffers(hlo: str, rows: int, seq: int) -> list[str]:
    """The float arrays outside fusions whose leading dimensions are the global batch's ``[rows, seq]`` (or their
    product, ``[rows * seq, ...]``), each shape once with what produced it: in a program whose batch is split over
    several devices, activations that every device holds whole. Empty is right; pick ``rows`` that no other
    dimension of the program has."""
    found: dict[str, str] = {}
    for name, dtype, dims, line in _buffers(hlo):
        if dtype[0] not in "fb":  # float types only (f32, bf16, f16, f8...): not ids, masks or iotas
            continue
        shape = [int(d) for d in dims.split(",") if d]
        if shape[:2] == [rows, seq] or (len(shape) >= 2 and shape[0] == rows * seq):
            found.setdefault(f"{dtype}[{dims}]", _producer(name, line))
    return [f"{shape} ({producer})" for shape, producer in found.items()]


def _buffers(hlo: str) -> Iterator[tuple[str, str, str, str]]:
    """``(name, dtype, dims, line)`` of each array instruction outside fusions (a fusion's inner values live in
    registers or on-chip memory; its output is the instruction that calls it)."""
    inside_fusion = False
    for line in hlo.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            inside_fusion = "fused" in header.group(1) or header.group(1).startswith("wrapped")
            continue
        match = _ARRAY.match(line)
        if not inside_fusion and match and match.group(2) in BYTES_PER_ELEMENT:
            yield (*match.groups(), line)


_OP = re.compile(r"\]\S*\s+([\w-]+)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def _producer(name: str, line: str) -> str:
    """``"name"``, or ``"name, a fusion from .../dot_general"``: the HLO op and the last three steps of the JAX
    operation's name where the line carries them."""
    op, origin = _OP.search(line), _OP_NAME.search(line)
    if not op:
        return name
    where = ""
    if origin:
        steps = origin.group(1).split("/")
        where = " from " + (".../" if len(steps) > 3 else "") + "/".join(steps[-3:])
    return f"{name}, {'an' if op.group(1)[0] in 'aeiou' else 'a'} {op.group(1)}{where}"
