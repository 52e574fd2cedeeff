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
    """How the rings run on a placement's mesh: the table's row axes, the ring's (those of the row axes that also
    split the batch, adjacent in the rows' order) and the batch axes left for one ``psum``."""

    placement: ActivationPlacement
    table_shape: tuple[int, int]
    table_dtype: jnp.dtype
    row_axes: tuple[str, ...]
    ring_axes: tuple[str, ...]
    sum_axes: tuple[str, ...]
    ids_spec: PartitionSpec
    table_spec: PartitionSpec

    @property
    def hidden_spec(self) -> PartitionSpec:
        """The looked-up rows' (and their gradient's) ``[batch, seq, hidden]``: split like the ids."""
        return PartitionSpec(*self.ids_spec, None)

    @property
    def ring_size(self) -> int:
        return math.prod(self.placement.mesh.shape[a] for a in self.ring_axes)

    @property
    def row_ways(self) -> int:
        return math.prod(self.placement.mesh.shape[a] for a in self.row_axes)

    @property
    def block_rows(self) -> int:
        return self.table_shape[0] // self.row_ways

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
                    table_spec=PartitionSpec(row_axes if len(row_axes) > 1 else row_axes[0], None))


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


def _pass_on(block: jax.Array, plan: RingPlan) -> jax.Array:
    """``block`` sent to the next device of the ring (the one at ring position + 1)."""
    n = plan.ring_size
    return jax.lax.ppermute(block, plan.ring_axes, [(i, (i + 1) % n) for i in range(n)])


def _rows_in_block(ids: jax.Array, valid: jax.Array, ring_position: jax.Array, plan: RingPlan
                   ) -> tuple[jax.Array, jax.Array]:
    """``(local, inside)``: ``ids`` as rows of the block that the device at ``ring_position`` of this device's ring
    owns, and whether each valid id falls in it. Called inside the ``shard_map``."""
    own = jax.lax.axis_index(plan.row_axes)
    position = jax.lax.axis_index(plan.ring_axes)
    local = ids - (own + (ring_position - position) * plan.stride) * plan.block_rows
    return local, valid & (local >= 0) & (local < plan.block_rows)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _ring_lookup(table, ids, dtype, limit, plan):
    return _ring_lookup_forward(table, ids, dtype, limit, plan)[0]


def _ring_lookup_forward(table, ids, dtype, limit, plan):
    """Each device looks its batch up in the block it holds and passes the block on; after ``n`` blocks every row of
    its ring's blocks has been seen, and one ``psum`` over the row axes outside the ring (``tensor``) adds the rest."""
    n = plan.ring_size
    outside_ring = tuple(a for a in plan.row_axes if a not in plan.ring_axes)

    def local(block, ids):
        position = jax.lax.axis_index(plan.ring_axes)
        valid = (ids >= 0) & (ids < limit)

        def look_up(s, block):  # the block held after s passes started at ring position - s
            rows, inside = _rows_in_block(ids, valid, (position - s) % n, plan)
            found = jnp.take(block, jnp.where(inside, rows, 0), axis=0)
            return jnp.where(inside[..., None], found, jnp.zeros((), dtype))

        def step(s, carry):
            block, out = carry
            block = _pass_on(block, plan)
            return block, out + look_up(s, block)

        block = block.astype(dtype)
        _, out = jax.lax.fori_loop(1, n, step, (block, look_up(0, block)))
        if outside_ring:
            out = jax.lax.psum(out, outside_ring)
        return jnp.where(valid[..., None], out, jnp.asarray(jnp.nan, dtype))

    out = jax.shard_map(local, mesh=plan.placement.mesh, in_specs=(plan.table_spec, plan.ids_spec),
                        out_specs=plan.hidden_spec, check_vma=False)(table, ids)
    return constrain(out, HIDDEN), ids


def _ring_lookup_backward(dtype, limit, plan, ids, grad):
    hidden = plan.table_shape[1]
    n = plan.ring_size

    def local(grad, ids):
        ids = ids.reshape(-1)
        grad = grad.reshape(-1, hidden).astype(jnp.float32)
        valid = (ids >= 0) & (ids < limit)
        position = jax.lax.axis_index(plan.ring_axes)

        def add_contribution(block, ring_position):
            """``block`` (the rows of the ring's ``ring_position``) plus this device's batch's gradients for them,
            added into it rather than beside it (no third block-sized buffer)."""
            rows, inside = _rows_in_block(ids, valid, ring_position, plan)
            return block.at[jnp.where(inside, rows, plan.block_rows)].add(grad, mode="drop")

        def step(s, block):
            return add_contribution(_pass_on(block, plan), (position - 1 - s) % n)

        first = add_contribution(jnp.zeros((plan.block_rows, hidden), jnp.float32), (position - 1) % n)
        block = jax.lax.fori_loop(1, n, step, first)
        if plan.sum_axes:
            block = jax.lax.psum(block, plan.sum_axes)
        return block.astype(plan.table_dtype)

    table_grad = jax.shard_map(local, mesh=plan.placement.mesh, in_specs=(plan.hidden_spec, plan.ids_spec),
                               out_specs=plan.table_spec, check_vma=False)(constrain(grad, HIDDEN), ids)
    return table_grad, None


_ring_lookup.defvjp(_ring_lookup_forward, _ring_lookup_backward)
