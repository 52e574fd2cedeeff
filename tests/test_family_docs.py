"""docs/adding-a-family.md against the family added last (the folder whose ``RECORDS`` hold the highest place): the
page says adding a family is one new folder, lists the files a family folder holds (those it says every folder has
are in the last one's, and the last one holds no file it does not list), and no central file (the registry, the
packaging) names that family: it is found, not listed."""

from __future__ import annotations

import importlib
import pathlib
import re
from types import ModuleType

from flaxzoo.models import families

REPO = pathlib.Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "adding-a-family.md"
ROW = re.compile(r"^\| `([^`]+)` \| (always|optional) \|", re.M)
CENTRAL = ("models/families/__init__.py", "pyproject.toml", "setup.py", "tests/test_packaging.py")


def folder_table() -> dict[str, str]:
    """``{file: "always" | "optional"}`` of the page's section "The folder"."""
    section = DOC.read_text().split("\n## The folder\n", 1)[1].split("\n## ", 1)[0]
    return dict(ROW.findall(section))


def files_of(folder: ModuleType) -> set[str]:
    """The file names in a family folder (not ``__pycache__``)."""
    return {p.name for p in pathlib.Path(folder.__file__).parent.iterdir() if p.name != "__pycache__"}


def short_name(folder: ModuleType) -> str:
    return folder.__name__.rsplit(".", 1)[1]


LAST = families.last_added(families.FOLDERS)


def test_the_page_says_a_family_is_one_new_folder():
    text = DOC.read_text()
    assert "**Adding a family = one new folder.**" in text
    assert f"place in `RECORDS`; today `{short_name(LAST)}`)" in text
    for stale in ("register(<name>.FAMILY)", "to `packages` in `pyproject.toml`", "one register"):
        assert stale not in text, stale


def test_the_last_family_added_holds_the_files_the_page_lists():
    table = folder_table()
    assert set(table.values()) == {"always", "optional"}, table
    assert {"__init__.py", "hf.py", "presets.py", "model.py", "gguf.py", "parity_cases.py"} <= set(table)
    files = files_of(LAST)
    assert {name for name, when in table.items() if when == "always"} <= files, sorted(files)
    assert files <= set(table), sorted(files - set(table))


def test_every_folder_holds_only_what_the_page_lists():
    """A file the table does not name is a module holding another of its folder's records (``<other>.py``)."""
    table = folder_table()
    assert "<other>.py" in table
    for folder in families.FOLDERS:
        assert {name for name, when in table.items() if when == "always"} <= files_of(folder), folder.__name__
        records = list(folder.RECORDS.values())
        for name in sorted(files_of(folder) - set(table)):
            assert name.endswith(".py"), (folder.__name__, name)
            module = importlib.import_module(f"{folder.__name__}.{name[:-3]}")
            assert any(value is record for value in vars(module).values() for record in records), \
                f"{folder.__name__}/{name} is not on docs/adding-a-family.md's list of a folder's files"


def test_no_central_file_names_the_last_family():
    names = {short_name(LAST)} | {record.model_type for record in LAST.RECORDS.values()}
    for central in CENTRAL:
        text = (REPO / central).read_text()
        for name in names:
            assert not re.search(rf"\b{re.escape(name)}\b", text), (central, name)
