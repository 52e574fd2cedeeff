"""``--profile DIR``: trace a few calls of a compiled program with ``jax.profiler`` and sum the trace's time per
operation, labelled with the HLO instruction's shape and source op."""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
from typing import Any, Callable

import jax


def hlo_annotations(hlo_text: str) -> dict[str, str]:
    """``{instruction name: "shape  source op"}`` from a compiled program's HLO text, to label profiled operations."""
    labels = {}
    for line in hlo_text.splitlines():
        match = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+) ", line)
        if match:
            source = re.search(r'op_name="([^"]*)"', line)
            labels.setdefault(match.group(1), f"{match.group(2)}  {source.group(1)[-70:] if source else ''}")
    return labels


def profile_ops(fn: Callable[[], Any], directory: str, calls: int, top: int = 25,
                labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run ``fn`` ``calls`` times under ``jax.profiler.trace(directory)`` and sum the trace's per-operation times.

    On CPU the compiled program's operations (XLA fusions, library matmuls, copies) appear in the trace only with
    ``--xla_cpu_enable_xprof_traceme=true`` in ``XLA_FLAGS`` (``main`` sets it for ``--profile``). Returns the ``top``
    operations, each ``{"op", "ms_per_call", "count_per_call", "label"}`` (``label`` from ``labels``, see
    ``hlo_annotations``); operations that run concurrently (the CPU runtime
    overlaps independent ones) each count their own wall time. The trace itself stays in ``directory`` (Perfetto /
    TensorBoard).
    """
    with jax.profiler.trace(directory, create_perfetto_trace=True):
        for _ in range(calls):
            fn()
    trace_file = max(glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True),
                     key=os.path.getmtime)
    with gzip.open(trace_file) as handle:
        events = json.load(handle)
    events = events["traceEvents"] if isinstance(events, dict) else events
    runtime = ("ThunkExecutor", "$", "SlinkyThreadPool", "PjitFunction", "CommonPjRt", "end: ")
    totals: dict[str, list[float]] = {}
    for event in events:
        if event.get("ph") == "X" and not event["name"].startswith(runtime):
            entry = totals.setdefault(event["name"], [0.0, 0])
            entry[0] += event.get("dur", 0) / 1e3
            entry[1] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:top]
    return [dict(op=op, ms_per_call=round(ms / calls, 2), count_per_call=count / calls,
                 label=(labels or {}).get(op, "")) for op, (ms, count) in ranked]
