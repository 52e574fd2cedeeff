"""Items of several lengths put into fixed-width rows, in their order (next-fit): the text-to-text fine-tuner's
packed pairs and the supervised fine-tuner's packed conversations."""

from __future__ import annotations

from typing import Sequence


def next_fit(sizes: Sequence[Sequence[int]], capacity: Sequence[int]) -> list[list[int]]:
    """Item indices grouped into rows: an item joins the current row while, on every side ``k``, its ``sizes[i][k]``
    fits beside the row's others within ``capacity[k]``; else it starts the next row. An item larger than the
    capacity alone takes a row of its own (the caller cuts or refuses it)."""
    rows, row, used = [], [], [0] * len(capacity)
    for i, size in enumerate(sizes):
        if row and any(u + s > c for u, s, c in zip(used, size, capacity)):
            rows.append(row)
            row, used = [], [0] * len(capacity)
        row.append(i)
        used = [u + s for u, s in zip(used, size)]
    return rows + [row] if row else rows
