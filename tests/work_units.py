"""How ``-n 2 --dist loadfile`` (``.ci/run``) cuts the suite into units and in which order it hands them out.

A unit runs whole on one worker (its module fixtures built once): a test file, except

- the tests that are minutes each on their own (a notebook, a docs page group: ``SOLO_TESTS``), one unit apiece so
  that both workers take them;
- the files that use the real SmolLM2 (``SMOLLM2_FILES``), one unit together, so that the SmolLM2 fixture of
  ``tests/conftest.py`` loads its float + int8 pair once per worker.

Units are handed out longest first, by the seconds a full run measured (``unit_seconds.json``, written by
``python tests/suite_budget.py prof.xml --write-unit-seconds tests/unit_seconds.json``): the last units to start are
the short ones, so that neither worker waits long for the other at the end. A unit the table does not know counts as
the table's median. A stale table only changes the order, never what runs.

Standard library only: ``tests/suite_budget.py`` uses it without jax installed.
"""

from __future__ import annotations

import json
import pathlib
import statistics

UNIT_SECONDS_FILE = pathlib.Path(__file__).resolve().parent / "unit_seconds.json"
SOLO_TESTS = {"test_notebooks.py": "test_runs_in_small_mode", "test_docs.py": "test_code_blocks_run"}
SMOLLM2_FILES = ("test_pretrained.py", "test_quantize.py")
SMOLLM2_UNIT = "smollm2"


def work_unit(nodeid: str) -> str:
    """The unit of a test id (``tests/test_x.py::test_y[param]``): its file (``tests/test_x.py``), the test itself
    (a solo test) or ``"smollm2"``."""
    path, _, test = nodeid.partition("::")
    name = path.rsplit("/", 1)[-1]
    if SOLO_TESTS.get(name) == test.split("[", 1)[0]:
        return nodeid
    return SMOLLM2_UNIT if name in SMOLLM2_FILES else path


def load_unit_seconds(path: pathlib.Path = UNIT_SECONDS_FILE) -> dict[str, float]:
    """``{unit: seconds}`` from ``path``; empty when there is no such file. A file that is not such a JSON object
    raises ValueError naming the file."""
    if not path.exists():
        return {}
    try:
        table = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(table, dict) or not all(isinstance(v, (int, float)) for v in table.values()):
        raise ValueError(f"{path}: expected a JSON object of unit -> seconds")
    return {str(unit): float(seconds) for unit, seconds in table.items()}


def unit_seconds(nodeids_seconds: list[tuple[str, float]]) -> dict[str, float]:
    """``{unit: summed seconds}`` of ``(node id, seconds)`` pairs, longest first."""
    totals: dict[str, float] = {}
    for nodeid, seconds in nodeids_seconds:
        unit = work_unit(nodeid)
        totals[unit] = totals.get(unit, 0.0) + seconds
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def longest_first(nodeids: list[str], table: dict[str, float]) -> list[int]:
    """The positions of ``nodeids`` reordered so that the units come longest first by ``table`` (unknown units: the
    table's median), each unit's tests together and in their collected order; ties keep the collected order."""
    default = statistics.median(table.values()) if table else 0.0
    first_seen: dict[str, int] = {}
    units = [work_unit(nodeid) for nodeid in nodeids]
    for unit in units:
        first_seen.setdefault(unit, len(first_seen))
    return sorted(range(len(nodeids)), key=lambda i: (-table.get(units[i], default), first_seen[units[i]], i))
