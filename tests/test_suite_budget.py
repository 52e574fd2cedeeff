"""tests/suite_budget.py on small hand-made junit files (no jax, no model: each test well under a second)."""

from __future__ import annotations

import json
import pathlib

import pytest

import suite_budget
from suite_budget import by_family, by_file, families_of, family_names, main, node_id, read_junit, read_slow_ids
from work_units import load_unit_seconds, longest_first, work_unit

# (classname, name, seconds, child element or None): what pytest's junitxml writes for these node ids.
CASES = [
    ("tests.test_family_gemma", "test_logits[gemma3-scanned]", 4.0, None),
    ("tests.test_family_gemma", "test_logits[gemma-unrolled]", 2.0, None),
    ("tests.test_family_gemma", "test_config", 1.0, None),
    ("tests.test_every_family", "test_forward[qwen2]", 3.0, None),
    ("tests.test_every_family", "test_forward[gpt_neox]", 5.0, None),
    ("tests.test_every_family", "test_forward[llama]", 0.0, "skipped"),
    ("tests.test_every_family", "test_rope[head]", 0.5, None),
    ("tests.test_family_albert_electra", "test_heads[AlbertForMaskedLM-scanned]", 6.0, None),
    ("tests.test_family_albert_electra", "test_only[electra]", 2.0, "failure"),
    ("tests.test_docs", "test_code_blocks_run[README.md]", 30.0, None),
    ("tests.test_docs.TestPages", "test_links", 1.0, None),
]
SLOW = """tests/test_family_gemma.py::test_logits[gemma3-scanned]
tests/test_docs.py::test_code_blocks_run[README.md]
tests/test_family_albert_electra.py::test_heads[AlbertForMaskedLM-scanned]

3/11 tests collected (8 deselected) in 0.51s
"""
# The families these cases name, as the default reads them from models/families/ (folder, model types, aliases).
NAMES = {"gemma": {"gemma", "gemma2", "gemma3_text", "gemma3"}, "qwen2": {"qwen2"}, "gpt_neox": {"gpt_neox", "neox"},
         "llama": {"llama", "llama3"}, "albert": {"albert"}, "electra": {"electra"}, "bert": {"bert"}}


def junit(path: pathlib.Path, cases=CASES, wall: float = 30.2) -> pathlib.Path:
    rows = "".join(f'<testcase classname="{c}" name="{n}" time="{s}">' + (f'<{child} message="x"/>' if child else "")
                   + "</testcase>" for c, n, s, child in cases)
    path.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" '
                    f'errors="0" failures="1" skipped="1" tests="{len(cases)}" time="{wall}">{rows}</testsuite>'
                    "</testsuites>")
    return path


def figures(tallies) -> dict[str, tuple]:
    return {k: (t.tests, round(t.seconds, 6), t.quick_tests, round(t.quick, 6), t.slow_tests, round(t.slow, 6))
            for k, t in tallies.items()}


def test_node_ids_from_classname_and_name():
    assert node_id("tests.test_x", "test_y[a-b.md]") == "tests/test_x.py::test_y[a-b.md]"
    assert node_id("tests.test_x.TestFoo", "test_y") == "tests/test_x.py::TestFoo::test_y"
    assert node_id("tests.sub.test_x", "test_y") == "tests/sub/test_x.py::test_y"


def test_cases_outcomes_and_wall(tmp_path):
    run = read_junit(junit(tmp_path / "prof.xml"))
    assert run.wall == 30.2 and len(run.cases) == 11
    assert [c.outcome for c in run.cases].count("skipped") == 1
    assert [c.outcome for c in run.cases].count("failed") == 1
    assert run.cases[-1].nodeid == "tests/test_docs.py::TestPages::test_links"


def test_per_file_sums(tmp_path):
    files = by_file(read_junit(junit(tmp_path / "prof.xml")).cases)
    assert list(files) == ["tests/test_docs.py", "tests/test_every_family.py", "tests/test_family_albert_electra.py",
                           "tests/test_family_gemma.py"]  # the most seconds first
    assert {f: (t.tests, t.seconds) for f, t in files.items()} == {
        "tests/test_docs.py": (2, 31.0), "tests/test_every_family.py": (4, 8.5),
        "tests/test_family_albert_electra.py": (2, 8.0), "tests/test_family_gemma.py": (3, 7.0)}


def test_per_family_sums(tmp_path):
    families = by_family(read_junit(junit(tmp_path / "prof.xml")).cases, NAMES)
    assert {f: (t.tests, t.seconds) for f, t in families.items()} == {
        "gemma": (3, 7.0), "gpt_neox": (1, 5.0), "electra": (2, 5.0),  # electra: half of test_heads + test_only
        "albert": (1, 3.0), "qwen2": (1, 3.0), "bert": (0, 0.0), "llama": (1, 0.0),
        "shared": (3, 31.5)}  # test_rope[head] and both docs tests
    assert list(families)[-1] == "shared"
    assert sum(t.seconds for t in families.values()) == 54.5


def test_family_names_match_whole_tokens():
    def of(nodeid: str) -> list[str]:
        return families_of(suite_budget.Case(nodeid, nodeid.split("::")[0], 0.0, "passed"), NAMES | {
            "xlm_roberta": {"xlm_roberta", "xlm-roberta"}, "roberta": {"roberta"}, "distilbert": {"distilbert"}})

    assert of("tests/test_x.py::test_a[xlm-roberta-XLMRobertaModel]") == ["xlm_roberta"]  # not also roberta
    assert of("tests/test_x.py::test_a[roberta-stacked]") == ["roberta"]
    assert of("tests/test_x.py::test_a[distilbert]") == ["distilbert"]  # not bert
    assert of("tests/test_x.py::test_a[gpt_neox_sequential]") == ["gpt_neox"]
    assert of("tests/test_x.py::test_a[gemma3_text-scanned]") == ["gemma"]
    assert of("tests/test_albert_electra.py::test_a[llama]") == ["albert", "electra"]  # the file's families rule
    assert of("tests/test_alberto.py::test_a[qwen]") == ["shared"]


def test_default_families_come_from_the_repository():
    names = family_names()
    assert {"gemma", "bert", "roberta", "gpt_neox"} <= set(names)
    assert {"gemma2", "gemma3_text"} <= names["gemma"]
    assert "xlm-roberta" in names["roberta"]


def test_quick_and_slow_split(tmp_path):
    (tmp_path / "slow.txt").write_text(SLOW)
    slow = read_slow_ids(tmp_path / "slow.txt")
    assert len(slow) == 3
    cases = read_junit(junit(tmp_path / "prof.xml")).cases
    # (tests, s, quick tests, quick s, slow tests, slow s)
    assert figures(by_file(cases, slow)) == {
        "tests/test_docs.py": (2, 31.0, 1, 1.0, 1, 30.0), "tests/test_every_family.py": (4, 8.5, 4, 8.5, 0, 0.0),
        "tests/test_family_albert_electra.py": (2, 8.0, 1, 2.0, 1, 6.0),
        "tests/test_family_gemma.py": (3, 7.0, 2, 3.0, 1, 4.0)}
    families = figures(by_family(cases, NAMES, slow))
    assert families["gemma"] == (3, 7.0, 2, 3.0, 1, 4.0)
    assert families["albert"] == (1, 3.0, 0, 0.0, 1, 3.0)
    assert families["electra"] == (2, 5.0, 1, 2.0, 1, 3.0)
    assert families["shared"] == (3, 31.5, 2, 1.5, 1, 30.0)


def test_over_budget_is_flagged(tmp_path, monkeypatch, capsys):
    (tmp_path / "slow.txt").write_text(SLOW)
    monkeypatch.setattr(suite_budget, "FAMILY_QUICK_BUDGET_S", 2.5)  # gemma's quick 3.0 s: over; electra's 2.0: not
    monkeypatch.setattr(suite_budget, "FAMILY_FULL_BUDGET_S", 6.0)  # gemma's 7.0 s: over
    monkeypatch.setattr(suite_budget, "FULL_WORK_BUDGET_S", 50)  # 54.5 s of work: over
    assert main([str(junit(tmp_path / "prof.xml")), "--slow-ids", str(tmp_path / "slow.txt"),
                 "--families", "gemma,albert,electra", "--top", "2"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert rows["gemma"].endswith("OVER quick, full")
    assert "OVER" not in rows["electra"] and "OVER" not in rows["shared"]  # shared: 31.5 s, but no family budget
    assert "budget 50 s  OVER" in rows["work:"]
    assert "budget 540 s" in rows["quick"] and "OVER" not in rows["quick"]  # quick tier: 14.5 s
    top = out.split("The 2 longest tests")[1].splitlines()[3:5]
    assert [line.split() for line in top] == [["30.0", "tests/test_docs.py::test_code_blocks_run[README.md]"],
                                              ["6.0", "tests/test_family_albert_electra.py::test_heads"
                                                      "[AlbertForMaskedLM-scanned]"]]


def test_compare_as_markdown(tmp_path, capsys):
    before = junit(tmp_path / "before.xml", [("tests.test_docs", "test_code_blocks_run[README.md]", 40.0, None),
                                             ("tests.test_gone", "test_z", 2.0, None)])
    assert main([str(junit(tmp_path / "after.xml")), "--compare", str(before), "--families", "gemma",
                 "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| file | tests | s | share |\n| --- | ---: | ---: | ---: |" in out
    assert "| `test_docs.py` | 1 | 40.0 | 2 | 31.0 | -9.0 |" in out
    assert "| `test_gone.py` | 1 | 2.0 | 0 | 0.0 | -2.0 |" in out
    assert "| total | 2 | 42.0 | 11 | 54.5 | +12.5 |" in out


@pytest.mark.parametrize("content", [None, "this is no XML", "<html><body/></html>"], ids=["missing", "text", "html"])
def test_bad_input_exits_2_naming_the_file(tmp_path, capsys, content):
    path = tmp_path / "prof.xml"
    if content is not None:
        path.write_text(content)
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and err.count("\n") == 1


# ------------------------------------------------------------------------------- scheduling units (work_units.py)

def test_work_units_group_solo_tests_and_the_smollm2_files():
    assert work_unit("tests/test_hub.py::test_x[gpt2]") == "tests/test_hub.py"
    assert work_unit("tests/test_docs.py::test_code_blocks_run[README.md]") == \
        "tests/test_docs.py::test_code_blocks_run[README.md]"
    assert work_unit("tests/test_docs.py::test_append_rule") == "tests/test_docs.py"  # not a solo test
    assert work_unit("tests/test_quantize.py::test_q") == work_unit("tests/test_pretrained.py::test_p") == "smollm2"


def test_unit_seconds_are_summed_per_unit_longest_first(tmp_path, capsys):
    out = tmp_path / "units.json"
    assert main([str(junit(tmp_path / "prof.xml")), "--families", "gemma", "--write-unit-seconds", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table == {"tests/test_docs.py::test_code_blocks_run[README.md]": 30.0, "tests/test_every_family.py": 8.5,
                     "tests/test_family_albert_electra.py": 8.0, "tests/test_family_gemma.py": 7.0,
                     "tests/test_docs.py": 1.0}
    assert list(table.values()) == sorted(table.values(), reverse=True)
    assert load_unit_seconds(out) == table
    assert f"5 units' seconds written to {out}" in capsys.readouterr().out


def test_longest_unit_first_each_unit_together_in_its_order():
    ids = ["tests/test_a.py::t1", "tests/test_b.py::t1", "tests/test_a.py::t2", "tests/test_new.py::t",
           "tests/test_docs.py::test_code_blocks_run[p]", "tests/test_c.py::t", "tests/test_b.py::t2"]
    table = {"tests/test_a.py": 1.0, "tests/test_b.py": 50.0, "tests/test_c.py": 5.0,
             "tests/test_docs.py::test_code_blocks_run[p]": 9.0}
    # test_new.py is unknown: the median of the table, 7.0 s, between test_docs' page and test_c
    assert [ids[i] for i in longest_first(ids, table)] == [
        "tests/test_b.py::t1", "tests/test_b.py::t2", "tests/test_docs.py::test_code_blocks_run[p]",
        "tests/test_new.py::t", "tests/test_c.py::t", "tests/test_a.py::t1", "tests/test_a.py::t2"]
    assert longest_first(ids, {}) == [0, 2, 1, 6, 3, 4, 5]  # no table: the units in the order they were collected


@pytest.mark.parametrize("content", ["[1, 2]", "{\"tests/test_a.py\": \"ten\"}", "not json"])
def test_a_unit_table_that_is_not_unit_seconds_is_refused_naming_the_file(tmp_path, content):
    path = tmp_path / "units.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=str(path)):
        load_unit_seconds(path)
    assert load_unit_seconds(tmp_path / "absent.json") == {}
