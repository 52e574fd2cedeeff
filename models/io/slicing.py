"""Which part of a stored tensor one shard of a parameter needs.

A weight table's ``Transform`` (``flaxzoo.models.families.base``) turns one stored tensor into one or more flaxzoo
parameters. :func:`trace_layouts` traces its ``to_flax`` once on an abstract tensor of the stored shape
(``jax.make_jaxpr``: nothing is read or allocated) and reads the program as a rearrangement of axes: every stored
axis is cut into *atoms* (the ``h`` and ``k`` of a ``(h k)`` axis, the ``parts`` of a fused tensor), and every output
axis is a sequence of those atoms, some restricted to a range (one ``part`` of a fused tensor). :func:`read_index`
then maps the index of one shard (a tuple of slices on the flaxzoo side) back to the box of the stored tensor it
comes from, reads that box only, and rearranges it.

What maps: programs made of ``reshape``, ``transpose``, static ``slice`` (unit strides), ``squeeze`` and ``copy``,
i.e. any einops ``rearrange`` (``layout(...)``: transposes, head splits and merges, the unbinding of a fused
``(parts h k)`` tensor) and the identity. Anything else (arithmetic, gathers such as a permutation of rows, dtype
conversions, constants) raises :class:`Unmappable`, and the caller reads the whole tensor instead.

A shard's box is read with one slice per stored axis. When the atoms of a stored axis that a shard needs are not
contiguous on that axis (a ``(h k)`` axis split inside ``k``), the smallest slice holding them is read and the rest
dropped: more is read than needed, never less. With the logical rules of ``flaxzoo.train.sharding`` (``head_dim``
never split) every box is contiguous.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable, Iterator, Sequence

import jax
import numpy as np

from flaxzoo.models.families.base import Transform

__all__ = ["Layout", "Unmappable", "read_index", "trace_layouts"]

Box = tuple[tuple[int, int], ...]  # (start, stop) per axis


class Unmappable(Exception):
    """A transform whose output is not a rearrangement of its input's axes."""


@dataclasses.dataclass(frozen=True)
class Segment:
    """The range ``[lo, hi)`` of one atom present on an axis."""

    atom: int
    lo: int
    hi: int

    @property
    def length(self) -> int:
        return self.hi - self.lo


@dataclasses.dataclass(frozen=True)
class Layout:
    """One output of a transform as a rearrangement of the stored tensor. ``stored``: the atoms of each stored axis
    (major first). ``axes``: the segments of each output axis (major first). ``fixed``: length-one segments that no
    output axis shows (one part of a fused tensor). ``sizes``: every atom's size."""

    stored: tuple[tuple[int, ...], ...]
    axes: tuple[tuple[Segment, ...], ...]
    fixed: tuple[Segment, ...]
    sizes: dict[int, int]


@dataclasses.dataclass(frozen=True)
class _Array:
    axes: tuple[tuple[Segment, ...], ...]
    fixed: tuple[Segment, ...]


class _Atoms:
    """Atom sizes, and the atoms an atom was later cut into (major, minor)."""

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}
        self.children: dict[int, tuple[int, int]] = {}

    def new(self, size: int) -> int:
        self.sizes[len(self.sizes)] = size
        return len(self.sizes) - 1

    def full(self, atom: int) -> Segment:
        return Segment(atom, 0, self.sizes[atom])

    def split(self, seg: Segment, major: int) -> tuple[Segment, Segment]:
        """A whole atom cut into ``major`` × ``size // major`` atoms (the same cut when it was cut before)."""
        if seg.lo != 0 or seg.hi != self.sizes[seg.atom]:
            raise Unmappable(f"a reshape cuts a part of an axis ({seg})")
        if seg.atom not in self.children:
            self.children[seg.atom] = (self.new(major), self.new(seg.length // major))
        first, second = self.children[seg.atom]
        if self.sizes[first] != major:
            raise Unmappable("one axis is cut two ways")
        return self.full(first), self.full(second)

    def leaves(self, seg: Segment) -> tuple[Segment, ...]:
        """``seg`` in atoms that were never cut; Unmappable when its range is not a box of them."""
        if seg.atom not in self.children:
            return (seg,)
        major, minor = self.children[seg.atom]
        m = self.sizes[minor]
        if seg.lo % m == 0 and seg.hi % m == 0:
            return self.leaves(Segment(major, seg.lo // m, seg.hi // m)) + self.leaves(self.full(minor))
        q = seg.lo // m
        if q == (seg.hi - 1) // m:
            return self.leaves(Segment(major, q, q + 1)) + self.leaves(Segment(minor, seg.lo - q * m, seg.hi - q * m))
        raise Unmappable(f"a range of a cut axis is not a box ({seg})")


def _reshape(array: _Array, new_sizes: Sequence[int], atoms: _Atoms) -> _Array:
    fixed = list(array.fixed)
    queue: list[Segment] = []
    for axis in array.axes:
        for seg in axis:
            (fixed if seg.length == 1 else queue).append(seg)
    queue.reverse()  # popped from the end: major first
    axes = []
    for size in new_sizes:
        axis, need = [], int(size)
        while need > 1:
            if not queue:
                raise Unmappable("a reshape grows the array")
            seg = queue.pop()
            if need % seg.length == 0:
                axis.append(seg)
                need //= seg.length
            elif seg.length % need == 0:
                first, rest = atoms.split(seg, need)
                axis.append(first)
                queue.append(rest)
                need = 1
            else:
                raise Unmappable(f"a reshape to {tuple(new_sizes)} mixes axes")
        axes.append(tuple(axis))
    if queue:
        raise Unmappable("a reshape shrinks the array")
    return _Array(tuple(axes), tuple(fixed))


def _slice(array: _Array, start: Sequence[int], limit: Sequence[int]) -> _Array:
    axes = []
    for axis, a, b in zip(array.axes, start, limit):
        size = math.prod(s.length for s in axis)
        if (a, b) == (0, size):
            axes.append(axis)
            continue
        inner = math.prod(s.length for s in axis[1:])
        if a % inner or b % inner:
            raise Unmappable("a slice cuts inside an inner axis")
        first = axis[0]
        axes.append((Segment(first.atom, first.lo + a // inner, first.lo + b // inner), *axis[1:]))
    return _Array(tuple(axes), array.fixed)


def _apply(eqn, array: _Array, atoms: _Atoms) -> _Array:
    name, params = eqn.primitive.name, eqn.params
    if name in ("copy", "copy_p"):
        return array
    if name == "reshape" and params.get("dimensions") is None:
        return _reshape(array, params["new_sizes"], atoms)
    if name == "transpose":
        return _Array(tuple(array.axes[i] for i in params["permutation"]), array.fixed)
    if name == "slice" and (params.get("strides") is None or all(s == 1 for s in params["strides"])):
        return _slice(array, params["start_indices"], params["limit_indices"])
    if name == "squeeze":
        dims = set(params["dimensions"])
        gone = tuple(s for d in sorted(dims) for s in array.axes[d])
        return _Array(tuple(a for d, a in enumerate(array.axes) if d not in dims), array.fixed + gone)
    raise Unmappable(f"the transform computes ({name})")


def trace_layouts(transform: Transform, shape: Sequence[int]) -> tuple[Layout, ...]:
    """One :class:`Layout` per output of ``transform.to_flax`` on a stored tensor of ``shape``; raises
    :class:`Unmappable` when the transform is not a rearrangement of axes (see the module docstring)."""
    try:
        closed = jax.make_jaxpr(transform.to_flax)(jax.ShapeDtypeStruct(tuple(shape), np.float32))
    except Exception as exc:  # a transform that cannot be traced at all
        raise Unmappable(f"to_flax cannot be traced ({type(exc).__name__})") from exc
    jaxpr = closed.jaxpr
    if jaxpr.constvars or len(jaxpr.invars) != 1:
        raise Unmappable("the transform uses constants")
    atoms = _Atoms()
    stored_atoms = [atoms.new(int(d)) for d in shape]
    env = {jaxpr.invars[0]: _Array(tuple((atoms.full(a),) for a in stored_atoms), ())}
    for eqn in jaxpr.eqns:
        if len(eqn.invars) != 1 or len(eqn.outvars) != 1 or eqn.invars[0] not in env:
            raise Unmappable(f"the transform computes ({eqn.primitive.name})")
        env[eqn.outvars[0]] = _apply(eqn, env[eqn.invars[0]], atoms)
    stored = tuple(tuple(s.atom for s in atoms.leaves(atoms.full(a))) for a in stored_atoms)
    layouts = []
    for var in jaxpr.outvars:
        if var not in env:
            raise Unmappable("an output is a constant")
        array = env[var]
        axes = tuple(tuple(s for seg in axis for s in atoms.leaves(seg)) for axis in array.axes)
        fixed = tuple(s for seg in array.fixed for s in atoms.leaves(seg))
        seen = sorted(s.atom for s in (*fixed, *(s for axis in axes for s in axis)))
        if seen != sorted(a for axis in stored for a in axis):
            raise Unmappable("an output does not show every stored axis once")
        layouts.append(Layout(stored, axes, fixed, dict(atoms.sizes)))
    return tuple(layouts)


def _boxes(start: int, stop: int, sizes: Sequence[int]) -> Iterator[Box]:
    """``[start, stop)`` of an axis made of ``sizes`` (major first) as boxes of those sizes, in order: a range of one
    level, everything below it whole, one index above it."""
    if not sizes:
        yield ()
        return
    inner = math.prod(sizes[1:])
    if start % inner == 0 and stop % inner == 0:
        yield ((start // inner, stop // inner), *((0, n) for n in sizes[1:]))
        return
    first, last = start // inner, (stop - 1) // inner
    if first == last:
        for rest in _boxes(start - first * inner, stop - first * inner, sizes[1:]):
            yield ((first, first + 1), *rest)
        return
    yield from _boxes(start, (first + 1) * inner, sizes)
    if last > first + 1:
        yield from _boxes((first + 1) * inner, last * inner, sizes)
    yield from _boxes(last * inner, stop, sizes)


def _axis_pieces(axis: tuple[Segment, ...], start: int, stop: int) -> list[tuple[int, dict[int, tuple[int, int]]]]:
    """``(offset from start, {atom: (lo, hi)})`` for each box of ``[start, stop)`` on an output axis."""
    lengths = [s.length for s in axis]
    strides = [math.prod(lengths[i + 1:]) for i in range(len(lengths))]
    pieces = []
    for box in _boxes(start, stop, lengths):
        offset = sum(a * st for (a, _), st in zip(box, strides)) - start
        pieces.append((offset, {s.atom: (s.lo + a, s.lo + b) for s, (a, b) in zip(axis, box)}))
    return pieces


def _read_piece(layout: Layout, ranges: dict[int, tuple[int, int]], read: Callable[[tuple[slice, ...]], np.ndarray]
                ) -> np.ndarray:
    """The values of one box (``ranges``: every atom's range) in the output's axis order."""
    slices, takes, dims = [], [], []
    for axis, atoms in enumerate(layout.stored):
        sizes = [layout.sizes[a] for a in atoms]
        rs = [ranges[a] for a in atoms]
        strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
        lo = sum(r[0] * st for r, st in zip(rs, strides))
        hi = sum((r[1] - 1) * st for r, st in zip(rs, strides)) + 1
        count = math.prod(r[1] - r[0] for r in rs)
        slices.append(slice(lo, hi))
        if count != hi - lo:  # not contiguous on this axis: read the span, keep what the box holds
            grid = np.meshgrid(*(np.arange(*r) for r in rs), indexing="ij")
            takes.append((axis, (np.ravel_multi_index(grid, sizes).ravel() - lo)))
        dims += [r[1] - r[0] for r in rs]
    block = read(tuple(slices))
    for axis, idx in takes:
        block = np.take(block, idx, axis=axis)
    order = [a for atoms in layout.stored for a in atoms]
    wanted = [s.atom for axis in layout.axes for s in axis] + [s.atom for s in layout.fixed]
    block = block.reshape(dims).transpose([order.index(a) for a in wanted])
    return block.reshape([math.prod(ranges[s.atom][1] - ranges[s.atom][0] for s in axis) for axis in layout.axes])


def read_index(layout: Layout, index: Sequence[slice], read: Callable[[tuple[slice, ...]], np.ndarray]
               ) -> np.ndarray:
    """The values ``output[index]`` of the output ``layout`` describes, reading the stored tensor only through
    ``read(slices)`` (one tuple of unit-step slices, one per stored axis) for the boxes the index needs."""
    shape = [math.prod(s.length for s in axis) for axis in layout.axes]
    if len(index) != len(shape):
        raise ValueError(f"index {tuple(index)} has {len(index)} entries; the parameter has {len(shape)} axes")
    spans = []
    for ix, dim in zip(index, shape):
        start, stop, step = ix.indices(dim)
        if step != 1:
            raise ValueError(f"index {tuple(index)}: expected unit-step slices (a shard's index)")
        spans.append((start, stop))
    fixed = {s.atom: (s.lo, s.hi) for s in layout.fixed}
    per_axis = [_axis_pieces(axis, a, b) for axis, (a, b) in zip(layout.axes, spans)]
    combos = list(itertools.product(*per_axis))
    if len(combos) == 1:
        return _read_piece(layout, {k: v for _, r in combos[0] for k, v in r.items()} | fixed, read)
    out = None
    for combo in combos:
        piece = _read_piece(layout, {k: v for _, r in combo for k, v in r.items()} | fixed, read)
        if out is None:
            out = np.empty([b - a for a, b in spans], piece.dtype)
        out[tuple(slice(off, off + n) for (off, _), n in zip(combo, piece.shape))] = piece
    return out
