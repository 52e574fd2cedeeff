"""The token table's lookup on a mesh, in which no device ever holds the whole table or its whole gradient.

Under FSDP the table's rows are split over the devices that also split the batch. Left to XLA, the lookup either
collected every device's ids and built the whole global batch's embeddings on each device, or (the table gathered
first, as FSDP gathers every weight) held the whole table in the compute dtype, and its gradient, by autodiff, was a
scatter-add of the device's batch into a zero table of every row followed by a reduce-scatter: one whole
``[vocab, hidden]`` table per device plus the padded copy libtpu's reduce-scatter makes of it (0.49 GiB each for
Llama 3's 128,256 x 2048 in bfloat16, the peak of its step on two v5e-8 slices).

:func:`sharded_lookup` runs both directions as rings over the ``n`` devices that split both the rows and the batch.
Forward: each device looks its batch up in the block of ``vocab / n`` rows it holds (cast to the compute dtype) and
passes the block on (``ppermute``); after ``n`` blocks it has seen every row of the ring. Backward: each device adds
its batch's gradients into the float32 block it holds and passes the block on; after ``n - 1`` passes each device
holds the sum of every device's contributions to its own block, which is its slice of the gradient (a ring
reduce-scatter). Axes that split the batch but not the rows (``data``) are added with one ``psum`` of that slice;
axes that split the rows but not the batch (``tensor``) look up and add only their own rows, and the forward's rows
are added over them with one ``psum`` of the device's batch.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from flaxzoo.models.layers.linear import take_rows
from flaxzoo.models.layers.partitioning import (ACTIVATION_BATCH, ACTIVATION_EMBED, ACTIVATION_LENGTH,
                                                ACTIVATION_VOCAB, HEAD_VOCAB, HIDDEN, ActivationPlacement, constrain,
                                                current_placement)


def _axes(entry) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


@dataclasses.dataclass(frozen=True)
class RingPlan:
    """How the gradient's ring runs on a placement's mesh: the table's row axes, the ring's (those of the row axes
    that also split the batch, adjacent in the rows' order) and the batch axes left for one ``psum``."""

    placement: ActivationPlacement
    table_shape: tuple[int, int]
    table_dtype: jnp.dtype
    row_axes: tuple[str, ...]
    ring_axes: tuple[str, ...]
    sum_axes: tuple[str, ...]
    ids_spec: PartitionSpec
    grad_spec: PartitionSpec

    @property
    def ring_size(self) -> int:
        return math.prod(self.placement.mesh.shape[a] for a in self.ring_axes)

    @property
    def row_ways(self) -> int:
        return math.prod(self.placement.mesh.shape[a] for a in self.row_axes)

    @property
    def stride(self) -> int:
        """Blocks between two neighbours of the ring: the row axes after the ring's split the rows more finely."""
        after = self.row_axes[self.row_axes.index(self.ring_axes[-1]) + 1:]
        return math.prod(self.placement.mesh.shape[a] for a in after)


def ring_plan(table_shape: tuple[int, int], table_dtype, ids_shape: tuple[int, ...]) -> RingPlan | None:
    """The ring for a ``[rows, hidden]`` table of ``table_dtype`` and ``[batch, seq]`` ids under the placement in
    force, or ``None`` when there is no placement or no mesh axis splits both the rows and the batch (the plain
    lookup then)."""
    placement = current_placement()
    if placement is None or len(ids_shape) != 2:
        return None
    row_axes = _axes(placement.spec((HEAD_VOCAB, None), table_shape)[0])
    ids_spec = placement.spec((ACTIVATION_BATCH, ACTIVATION_LENGTH), ids_shape)
    batch_axes = _axes(ids_spec[0])
    ring_axes = tuple(a for a in row_axes if a in batch_axes)
    if not ring_axes or _axes(ids_spec[1]):
        return None
    first = row_axes.index(ring_axes[0])
    if row_axes[first:first + len(ring_axes)] != ring_axes:  # the ring's blocks would not be evenly spaced
        return None
    return RingPlan(placement=placement, table_shape=tuple(table_shape), table_dtype=jnp.dtype(table_dtype),
                    row_axes=row_axes, ring_axes=ring_axes,
                    sum_axes=tuple(a for a in batch_axes if a not in ring_axes), ids_spec=ids_spec,
                    grad_spec=PartitionSpec(row_axes if len(row_axes) > 1 else row_axes[0], None))


def sharded_lookup(table: jax.Array, ids: jax.Array, dtype, limit: int) -> jax.Array:
    """``table[ids]`` in ``dtype``: ``[rows, hidden]`` and ``[batch, seq]`` int → ``[batch, seq, hidden]``; ids
    outside ``[0, limit)`` give rows of NaNs (``take_rows``) and no gradient. On a mesh whose axes split both the
    table's rows and the batch, the lookup and the table's gradient (in the table's dtype) are the rings of this
    module's docstring; elsewhere they are ``take_rows`` and autodiff's."""
    plan = ring_plan(tuple(table.shape), table.dtype, tuple(ids.shape))
    if plan is None:
        return _lookup(table, ids, jnp.dtype(dtype), limit)
    return _ring_lookup(table, ids, jnp.dtype(dtype), limit, plan)


def _lookup(table: jax.Array, ids: jax.Array, dtype, limit: int) -> jax.Array:
    gathered = constrain(table.astype(dtype), (ACTIVATION_VOCAB, ACTIVATION_EMBED))
    return take_rows(gathered, ids, limit)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _ring_lookup(table, ids, dtype, limit, plan):
    return _ring_lookup_forward(table, ids, dtype, limit, plan)[0]


def _ring_lookup_forward(table, ids, dtype, limit, plan):
    """Each device looks its batch up in the block it holds and passes the block on; after ``n`` blocks every row of
    its ring's blocks has been seen, and one ``psum`` over the row axes outside the ring (``tensor``) adds the rest."""
    block_rows = table.shape[0] // plan.row_ways
    n, stride = plan.ring_size, plan.stride
    outside_ring = tuple(a for a in plan.row_axes if a not in plan.ring_axes)

    def local(block, ids):
        position = jax.lax.axis_index(plan.ring_axes)
        own = jax.lax.axis_index(plan.row_axes)
        valid = (ids >= 0) & (ids < limit)

        def look_up(s, block):
            start = (own + ((position - s) % n - position) * stride) * block_rows
            local_ids = ids - start
            inside = valid & (local_ids >= 0) & (local_ids < block_rows)
            rows = jnp.take(block, jnp.where(inside, local_ids, 0), axis=0)
            return jnp.where(inside[..., None], rows, jnp.zeros((), dtype))

        def step(s, carry):
            block, out = carry
            block = jax.lax.ppermute(block, plan.ring_axes, [(i, (i + 1) % n) for i in range(n)])
            return block, out + look_up(s, block)

        block = block.astype(dtype)
        _, out = jax.lax.fori_loop(1, n, step, (block, look_up(0, block)))
        if outside_ring:
            out = jax.lax.psum(out, outside_ring)
        return jnp.where(valid[..., None], out, jnp.asarray(jnp.nan, dtype))

    out_spec = PartitionSpec(*plan.ids_spec, None)
    out = jax.shard_map(local, mesh=plan.placement.mesh, in_specs=(plan.grad_spec, plan.ids_spec),
                        out_specs=out_spec, check_vma=False)(table, ids)
    return constrain(out, HIDDEN), ids


def _ring_lookup_backward(dtype, limit, plan, ids, grad):
    rows, hidden = plan.table_shape
    block_rows = rows // plan.row_ways
    n, stride = plan.ring_size, plan.stride
    mesh = plan.placement.mesh
    grad = constrain(grad, HIDDEN)

    def local(grad, ids):
        ids = ids.reshape(-1)
        grad = grad.reshape(-1, hidden).astype(jnp.float32)
        valid = (ids >= 0) & (ids < limit)
        position = jax.lax.axis_index(plan.ring_axes)
        own = jax.lax.axis_index(plan.row_axes)

        def add_contribution(block, ring_position):
            """``block`` (the rows of the ring's ``ring_position``) plus this device's batch's gradients for them,
            added into it rather than beside it (no third block-sized buffer)."""
            start = (own + (ring_position - position) * stride) * block_rows
            local_ids = ids - start
            inside = valid & (local_ids >= 0) & (local_ids < block_rows)
            return block.at[jnp.where(inside, local_ids, block_rows)].add(grad, mode="drop")

        def step(s, block):
            passed = jax.lax.ppermute(block, plan.ring_axes, [(i, (i + 1) % n) for i in range(n)])
            return add_contribution(passed, (position - 1 - s) % n)

        first = add_contribution(jnp.zeros((block_rows, hidden), jnp.float32), (position - 1) % n)
        block = jax.lax.fori_loop(1, n, step, first)
        if plan.sum_axes:
            block = jax.lax.psum(block, plan.sum_axes)
        return block.astype(plan.table_dtype)

    grad_spec = PartitionSpec(*plan.ids_spec, None)
    table_grad = jax.shard_map(local, mesh=mesh, in_specs=(grad_spec, plan.ids_spec), out_specs=plan.grad_spec,
                               check_vma=False)(grad, ids)
    return table_grad, None


_ring_lookup.defvjp(_ring_lookup_forward, _ring_lookup_backward)
