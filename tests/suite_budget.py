"""Where the test suite's work goes, and how it compares with its time budgets.

Reads the junit XML that pytest writes (``--junitxml``, also from an ``-n 2`` xdist run) and prints the totals, the
seconds per test file and per model family, each beside its budget (``OVER`` where above it). Standard library only:
it imports neither flaxzoo nor jax, so it runs in a fresh clone with nothing installed.

    PYTEST_ADDOPTS="--junitxml=prof.xml" bash .ci/run          # or: python -m pytest -n 2 --junitxml=prof.xml
    python -m pytest -m slow --collect-only -q > slow.txt      # the slow tier's node ids (optional)
    python tests/suite_budget.py prof.xml [more.xml ...] [--slow-ids slow.txt] [--top 20]
        [--families gemma,llama,...] [--compare before.xml] [--markdown] [--write-unit-seconds FILE]

``--slow-ids`` splits every figure into the quick tier (``-m "not slow"``) and the slow tier; ``--slow-ids /dev/null``
reads an XML of a quick-tier run as all quick. ``--compare BEFORE.xml`` adds a per-file before/after table;
``--markdown`` prints the tables as GitHub markdown; ``--write-unit-seconds tests/unit_seconds.json`` (from a full
run's XML) writes the seconds of each scheduling unit, the order in which ``.ci/run`` hands them out
(``tests/work_units.py``). A test belongs to the families named in its parametrize id
(``[gemma3-scanned]``, ``[qwen2]``, ``[xlm-roberta-XLMRobertaModel]``) or its file name (``test_family_gemma.py``;
``test_family_albert_electra.py``: both, its seconds split evenly); a test that names none is "shared".
Exit status: 0 (a report, whatever the figures), 2 for input it cannot read.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from work_units import unit_seconds

# The budgets, from tests/SUITE_TIME.md and DEVELOPERS.md. The full suite, `bash .ci/run`, in at most 25 minutes of
# wall time on CI's 2-core AMD EPYC, install included (about 2.5 minutes); the suite is CPU-bound and both workers stay
# busy to the end, so the tests' 22.5 minutes are about 2 * 22.5 * 60 s of work. The quick tier,
# `pytest -m "not slow" -n 2`, in at most 5 minutes of wall time: about 540 s of work.
WORKERS = 2
INSTALL_S = 150
FULL_WALL_BUDGET_S = 25 * 60 - INSTALL_S  # the tests' own wall time (junit's testsuite time)
FULL_WORK_BUDGET_S = 2700
QUICK_WALL_BUDGET_S = 5 * 60
QUICK_WORK_BUDGET_S = 540
# Per family (folder of models/families/): its tests' work, in the quick tier and in the full suite.
FAMILY_QUICK_BUDGET_S = 20
FAMILY_FULL_BUDGET_S = 60

FAMILIES_DIR = Path(__file__).resolve().parent.parent / "models" / "families"
# Other names the tests give a family (cases and file names: `gemma3-scanned`, `llama3`, `test_family_phi3_neox_olmo2`).
ALIASES = {"gemma": ("gemma3",), "llama": ("llama3",), "gpt_neox": ("neox",), "roberta": ("xlmr",),
           "deberta_v2": ("deberta",)}
MODEL_TYPE = re.compile(r"""(?:\bmodel_type\s*=\s*|\bMODEL_TYPE\s*=\s*|\b_family\(\s*)["']([\w.-]+)["']""")
SHARED = "shared"
NUMBER = re.compile(r"[+-]?[0-9.]+%?")


class InputError(Exception):
    """A file this script cannot read (the message names it)."""


@dataclass(frozen=True)
class Case:
    """One <testcase>: its pytest node id, file (``tests/test_x.py``), seconds and outcome."""
    nodeid: str
    file: str
    seconds: float
    outcome: str  # "passed", "skipped" or "failed"


@dataclass
class Run:
    """The test cases of one or more junit XML files, and their testsuites' wall time (None when none says)."""
    cases: list[Case] = field(default_factory=list)
    wall: float | None = None


@dataclass
class Tally:
    """Tests and seconds of a file or a family, in all and per tier (the tiers stay 0 without --slow-ids)."""
    tests: int = 0
    seconds: float = 0.0
    quick_tests: int = 0
    quick: float = 0.0
    slow_tests: int = 0
    slow: float = 0.0

    def add(self, seconds: float, is_slow: bool | None) -> None:
        self.tests += 1
        self.seconds += seconds
        if is_slow is True:
            self.slow_tests += 1
            self.slow += seconds
        elif is_slow is False:
            self.quick_tests += 1
            self.quick += seconds


# ---------------------------------------------------------------------------------------------------- reading

def node_id(classname: str, name: str) -> str:
    """``tests.test_x`` + ``test_y[p]`` -> ``tests/test_x.py::test_y[p]``; a class part (a capitalised component,
    ``tests.test_x.TestFoo``) -> ``tests/test_x.py::TestFoo::test_y[p]``."""
    parts = classname.split(".")
    first_class = next((i for i, part in enumerate(parts) if part[:1].isupper()), len(parts))
    path = "/".join(parts[:first_class]) + ".py"
    return "::".join([path, *parts[first_class:], name])


def read_junit(path: Path) -> Run:
    """The test cases and wall time of one junit XML file; InputError naming it when it is missing or not junit."""
    try:
        root = ET.parse(path).getroot()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (ET.ParseError, OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not junit XML ({exc})") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise InputError(f"{path}: not junit XML (root element <{root.tag}>, expected <testsuites> or <testsuite>)")
    run = Run()
    for suite in root.iter("testsuite"):
        if suite.get("time") is not None:
            run.wall = (run.wall or 0.0) + _seconds(path, suite.get("time"))
    for case in root.iter("testcase"):
        classname, name = case.get("classname"), case.get("name")
        if not classname or not name:
            raise InputError(f"{path}: not junit XML from pytest (a <testcase> without classname and name)")
        nodeid = node_id(classname, name)
        outcome = ("skipped" if case.find("skipped") is not None
                   else "failed" if case.find("failure") is not None or case.find("error") is not None else "passed")
        run.cases.append(Case(nodeid, nodeid.split("::", 1)[0], _seconds(path, case.get("time", "0")), outcome))
    return run


def _seconds(path: Path, text: str | None) -> float:
    try:
        return float(text or 0)
    except ValueError:
        raise InputError(f"{path}: not junit XML (time={text!r} is not a number of seconds)") from None


def read_runs(paths: list[Path]) -> Run:
    """The cases of several junit files together; their wall times summed."""
    total = Run()
    for path in paths:
        run = read_junit(path)
        total.cases += run.cases
        if run.wall is not None:
            total.wall = (total.wall or 0.0) + run.wall
    return total


def read_slow_ids(path: Path) -> set[str]:
    """The node ids in a file (``pytest --collect-only -q``'s output: lines with ``::``; the rest is ignored)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the slow ids ({exc.strerror or exc})") from None
    return {line.strip() for line in text.splitlines() if "::" in line}


def family_names(families: list[str] | None = None, families_dir: Path = FAMILIES_DIR) -> dict[str, set[str]]:
    """``{family: the names that point at it}``: each family's folder name, the model types its folder registers
    (``gemma`` -> ``gemma2``, ``gemma3_text``; ``roberta`` -> ``xlm-roberta``) and :data:`ALIASES`. The families are
    ``families``, or else every folder of ``families_dir`` (read as text, without importing anything)."""
    if families is None:
        families = sorted(p.name for p in families_dir.iterdir() if (p / "__init__.py").is_file()) \
            if families_dir.is_dir() else []
    names: dict[str, set[str]] = {}
    for family in families:
        folder = families_dir / family
        types = {m for f in sorted(folder.glob("*.py")) for m in MODEL_TYPE.findall(f.read_text())} \
            if folder.is_dir() else set()
        names[family] = {family, *types, *ALIASES.get(family, ())}
    return names


# --------------------------------------------------------------------------------------------------- figuring

def tokens(text: str) -> list[str]:
    """Lower-case words of a file name or parametrize id: split on ``-``, ``_``, ``[``, ``]``, ``.``, ``/``."""
    return [t for t in re.split(r"[-_\[\]./]+", text.lower()) if t]


def named_families(text: str, names: dict[str, set[str]]) -> list[str]:
    """The families whose names occur in ``text`` as whole runs of its tokens, the longest name first, so that
    ``xlm_roberta`` / ``xlm-roberta`` is XLM-RoBERTa only (not also RoBERTa) and ``qwen2_yarn`` is Qwen2."""
    candidates = sorted(((tuple(tokens(n)), family) for family, ns in names.items() for n in ns),
                        key=lambda c: -len(c[0]))
    words, found, i = tokens(text), [], 0
    while i < len(words):
        hit = next(((n, f) for n, f in candidates if n and tuple(words[i:i + len(n)]) == n), None)
        if hit is None:
            i += 1
            continue
        if hit[1] not in found:
            found.append(hit[1])
        i += len(hit[0])
    return found


def families_of(case: Case, names: dict[str, set[str]]) -> list[str]:
    """A test's families: those its file name names (narrowed to the ones its parametrize id names, if any), else
    those its parametrize id names, else ``["shared"]``."""
    stem = case.file.rsplit("/", 1)[-1].removesuffix(".py").removeprefix("test_")
    test = case.nodeid.rsplit("::", 1)[-1]
    from_id = named_families(test.partition("[")[2], names) if "[" in test else []
    from_file = named_families(stem, names)
    if from_file:
        return [f for f in from_file if f in from_id] or from_file
    return from_id or [SHARED]


def slowness(case: Case, slow_ids: set[str] | None) -> bool | None:
    return None if slow_ids is None else case.nodeid in slow_ids


def by_file(cases: list[Case], slow_ids: set[str] | None = None) -> dict[str, Tally]:
    """``{tests/test_x.py: Tally}``, the most seconds first."""
    files: dict[str, Tally] = {}
    for case in cases:
        files.setdefault(case.file, Tally()).add(case.seconds, slowness(case, slow_ids))
    return dict(sorted(files.items(), key=lambda kv: -kv[1].seconds))


def by_family(cases: list[Case], names: dict[str, set[str]], slow_ids: set[str] | None = None) -> dict[str, Tally]:
    """``{family: Tally}`` (every family, "shared" last; the most seconds first). A test of several families counts
    as a test of each, its seconds split evenly between them."""
    families = {family: Tally() for family in names}
    shared = Tally()
    for case in cases:
        owners = families_of(case, names)
        for owner in owners:
            (shared if owner == SHARED else families[owner]).add(case.seconds / len(owners), slowness(case, slow_ids))
    return {**dict(sorted(families.items(), key=lambda kv: (-kv[1].seconds, kv[0]))), SHARED: shared}


def family_over(tally: Tally, tiers: bool) -> list[str]:
    """Which of a family's budgets its tests exceed: "quick" (with the tiers known), "full"."""
    return (["quick"] if tiers and tally.quick > FAMILY_QUICK_BUDGET_S else []) + \
        (["full"] if tally.seconds > FAMILY_FULL_BUDGET_S else [])


# --------------------------------------------------------------------------------------------------- printing

def table(headers: list[str], rows: list[list[str]], markdown: bool = False) -> str:
    """Rows under headers: aligned text, or a GitHub markdown table; the columns of numbers right-aligned."""
    numeric = [bool(rows) and all(NUMBER.fullmatch(row[i]) for row in rows) for i in range(len(headers))]
    if markdown:
        lines = [headers, ["---:" if right else "---" for right in numeric], *rows]
        return "\n".join("| " + " | ".join(line) + " |" for line in lines)
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows)]
    return "\n".join("  ".join(cell.rjust(w) if right else cell.ljust(w) for cell, w, right in
                               zip(line, widths, numeric)).rstrip() for line in [headers, *rows])


def short(file: str, markdown: bool) -> str:
    name = file.removeprefix("tests/")
    return f"`{name}`" if markdown else name


def over(value: float, budget: float) -> str:
    return f"  budget {budget:.0f} s" + ("  OVER" if value > budget else "")


def totals_text(run: Run, slow_ids: set[str] | None) -> str:
    cases, work = run.cases, sum(c.seconds for c in run.cases)
    skipped = sum(c.outcome == "skipped" for c in cases)
    failed = sum(c.outcome == "failed" for c in cases)
    quick_run = slow_ids is not None and not any(c.nodeid in slow_ids for c in cases)
    lines = [f"tests: {len(cases)} ({skipped} skipped, {failed} failed)",
             f"work: {work:.1f} s summed over the tests (with xdist, spread over the workers: "
             f"about {work / WORKERS:.0f} s of wall on {WORKERS})"
             + over(work, QUICK_WORK_BUDGET_S if quick_run else FULL_WORK_BUDGET_S)]
    if run.wall is not None:
        lines.append(f"wall: {run.wall:.1f} s (the testsuite's time, install not included)"
                     + over(run.wall, QUICK_WALL_BUDGET_S if quick_run else FULL_WALL_BUDGET_S))
    if slow_ids is not None:
        quick = [c for c in cases if c.nodeid not in slow_ids]
        quick_work = sum(c.seconds for c in quick)
        lines.append(f"quick tier: {len(quick)} tests, {quick_work:.1f} s of work"
                     + over(quick_work, QUICK_WORK_BUDGET_S))
        lines.append(f"slow tier: {len(cases) - len(quick)} tests, {work - quick_work:.1f} s of work")
        unmatched = len(slow_ids - {c.nodeid for c in cases})
        if unmatched:
            lines.append(f"note: {unmatched} of the {len(slow_ids)} slow ids name no test case here")
    return "\n".join(lines)


def files_text(files: dict[str, Tally], tiers: bool, markdown: bool) -> str:
    total = sum(t.seconds for t in files.values()) or 1.0
    headers = ["file", "tests", "s", "share"] + (["quick tests", "quick s", "slow tests", "slow s"] if tiers else [])
    rows = [[short(f, markdown), str(t.tests), f"{t.seconds:.1f}", f"{t.seconds / total:.1%}"]
            + ([str(t.quick_tests), f"{t.quick:.1f}", str(t.slow_tests), f"{t.slow:.1f}"] if tiers else [])
            for f, t in files.items()]
    return table(headers, rows, markdown)


def families_text(families: dict[str, Tally], tiers: bool, markdown: bool) -> str:
    headers = (["family", "tests"] + ([f"quick s (<={FAMILY_QUICK_BUDGET_S})", "slow s"] if tiers else [])
               + [f"total s (<={FAMILY_FULL_BUDGET_S})", "budget"])
    rows = []
    for family, t in families.items():
        flags = [] if family == SHARED else family_over(t, tiers)
        rows.append([family, str(t.tests)] + ([f"{t.quick:.1f}", f"{t.slow:.1f}"] if tiers else [])
                    + [f"{t.seconds:.1f}", "OVER " + ", ".join(flags) if flags else ""])
    return table(headers, rows, markdown)


def top_text(cases: list[Case], n: int, markdown: bool) -> str:
    longest = sorted(cases, key=lambda c: -c.seconds)[:n]
    return table(["s", "test"], [[f"{c.seconds:.1f}", c.nodeid + ("" if c.outcome == "passed" else f" ({c.outcome})")]
                                  for c in longest], markdown)


def compare_text(before: list[Case], after: list[Case], markdown: bool) -> str:
    old, new = by_file(before), by_file(after)
    pairs = [(f, old.get(f, Tally()), new.get(f, Tally())) for f in old.keys() | new.keys()]
    pairs.sort(key=lambda p: (-max(p[1].seconds, p[2].seconds), p[0]))
    rows = []
    for label, a, b in [(short(f, markdown), a, b) for f, a, b in pairs] + [
            ("total", Tally(len(before), sum(c.seconds for c in before)),
             Tally(len(after), sum(c.seconds for c in after)))]:
        rows.append([label, str(a.tests), f"{a.seconds:.1f}", str(b.tests), f"{b.seconds:.1f}",
                     f"{b.seconds - a.seconds:+.1f}"])
    return table(["file", "tests before", "s before", "tests after", "s after", "change s"], rows, markdown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("xml", nargs="+", type=Path, help="junit XML written by pytest --junitxml")
    parser.add_argument("--slow-ids", type=Path, help="node ids of the slow tier, one a line")
    parser.add_argument("--families", help="comma list of family folders (default: those of models/families/)")
    parser.add_argument("--top", type=int, default=0, metavar="N", help="print the N longest tests")
    parser.add_argument("--compare", type=Path, metavar="BEFORE.xml", help="a per-file before/after table")
    parser.add_argument("--markdown", action="store_true", help="print the tables as GitHub markdown")
    parser.add_argument("--write-unit-seconds", type=Path, metavar="FILE",
                        help="write {scheduling unit: seconds} of the XML (tests/unit_seconds.json: the units' order)")
    args = parser.parse_args(argv)
    try:
        run = read_runs(args.xml)
        slow_ids = read_slow_ids(args.slow_ids) if args.slow_ids else None
        before = read_junit(args.compare) if args.compare else None
        names = family_names([f.strip() for f in args.families.split(",") if f.strip()] if args.families else None)
    except InputError as exc:
        print(f"suite_budget: error: {exc}", file=sys.stderr)
        return 2
    tiers = slow_ids is not None
    sections = [("Totals (" + ", ".join(map(str, args.xml)) + ")", totals_text(run, slow_ids)),
                ("Per file", files_text(by_file(run.cases, slow_ids), tiers, args.markdown)),
                ("Per family", families_text(by_family(run.cases, names, slow_ids), tiers, args.markdown))]
    if args.top:
        sections.append((f"The {args.top} longest tests", top_text(run.cases, args.top, args.markdown)))
    if before is not None:
        sections.append((f"Per file, {args.compare} -> {', '.join(map(str, args.xml))}",
                         compare_text(before.cases, run.cases, args.markdown)))
    print("\n\n".join(f"{'## ' if args.markdown else ''}{title}\n\n{body}" for title, body in sections))
    if args.write_unit_seconds:
        seconds = unit_seconds([(case.nodeid, case.seconds) for case in run.cases])
        table = {unit: round(value, 1) for unit, value in seconds.items()}
        args.write_unit_seconds.write_text(json.dumps(table, indent=0) + "\n")
        print(f"\n{len(table)} units' seconds written to {args.write_unit_seconds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
