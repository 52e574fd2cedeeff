"""The import graph of the code, read with ``ast`` (every import, function-level ones included): no cycle inside
``flaxzoo.models``, ``models`` never reaching up into ``train`` / ``configs``, no private (underscore) names taken from
another module, and every import by the installed names (``flaxzoo.models`` ...), never the bare folder names."""

from __future__ import annotations

import ast
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = {"models": "flaxzoo.models", "train": "flaxzoo.train", "configs": "flaxzoo.configs"}
BARE = tuple(PACKAGES)  # the folder names, which are not importable once installed


def module_files() -> dict[str, pathlib.Path]:
    """``{dotted module name: file}`` of every module under models/, train/, configs/."""
    found = {}
    for folder, package in PACKAGES.items():
        for file in sorted((ROOT / folder).rglob("*.py")):
            parts = file.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = file
    return found


MODULES = module_files()


def imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, list[str], int]]:
    """``(imported module, names taken from it, line)`` for every import statement anywhere in ``tree``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            out.append((base, [alias.name for alias in node.names], node.lineno))
    return out


def targets(imported: str, names: list[str]) -> list[str]:
    """The flaxzoo modules an import statement loads: ``from pkg import sub`` is the module ``pkg.sub`` when there is
    one, else ``pkg`` itself."""
    found = [f"{imported}.{n}" for n in names if f"{imported}.{n}" in MODULES]
    if imported in MODULES and (not names or len(found) < len(names)):
        found.append(imported)
    return found


def graph() -> tuple[dict[str, set[str]], list[str]]:
    """(module → modules it imports, private-name imports as messages)."""
    edges: dict[str, set[str]] = {}
    private = []
    for module, file in MODULES.items():
        tree = ast.parse(file.read_text(), str(file))
        edges[module] = set()
        for imported, names, line in imports(tree, module, file.name == "__init__.py"):
            edges[module].update(t for t in targets(imported, names) if t != module)
            if imported.startswith("flaxzoo.") and imported != module:
                private += [f"{file.relative_to(ROOT)}:{line} imports {n} from {imported}"
                            for n in names if n.startswith("_") and not n.startswith("__")]
    return edges, private


def find_cycle(edges: dict[str, set[str]], within: str) -> list[str] | None:
    """One import cycle among the modules under ``within`` (as a path that returns to its start), or None."""
    nodes = {m for m in edges if m == within or m.startswith(within + ".")}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node] & nodes):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(nodes):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_is_read():
    edges, _ = graph()
    assert "flaxzoo.models.io.pretrained" in edges["flaxzoo.models.io"]  # package __init__ → submodule
    assert "flaxzoo.models.config" in edges["flaxzoo.models.modeling"]
    assert any("flaxzoo.models.io.checkpoint" in e for m, e in edges.items() if m.startswith("flaxzoo.train"))
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}, "a") is None  # only modules under `within`
    assert find_cycle({"p.a": {"p.b"}, "p.b": {"p.a"}}, "p") == ["p.a", "p.b", "p.a"]


def test_no_import_cycle_within_models():
    cycle = find_cycle(graph()[0], "flaxzoo.models")
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_models_never_import_train_or_configs():
    edges, _ = graph()
    bad = sorted(f"{m} -> {t}" for m, ts in edges.items() if m.startswith("flaxzoo.models")
                 for t in ts if t.startswith(("flaxzoo.train", "flaxzoo.configs")))
    assert not bad, bad


FAMILIES = "flaxzoo.models.families"


def family_of(module: str) -> str | None:
    """The family folder a module belongs to (``flaxzoo.models.families.qwen2.gguf`` -> ``qwen2``), or None for the
    modules beside the folders (the registry, ``base``, ``fields``) and everything outside ``families``."""
    parts = module.split(".")
    if module.startswith(FAMILIES + ".") and (ROOT / "models" / "families" / parts[3]).is_dir():
        return parts[3]
    return None


def test_no_family_imports_another_family():
    """What several families share lives in ``models/architectures`` (or ``models/layers``), never in one of them."""
    edges, _ = graph()
    assert family_of("flaxzoo.models.families.qwen2.gguf") == "qwen2"
    assert family_of("flaxzoo.models.families.bert") == "bert"
    assert family_of("flaxzoo.models.families.base") is None and family_of("flaxzoo.models.layers.stack") is None
    bad = sorted(f"{m} -> {t}" for m, ts in edges.items() if family_of(m)
                 for t in ts if family_of(t) not in (None, family_of(m)))
    assert not bad, bad


def test_no_private_name_is_imported_from_another_module():
    _, private = graph()
    assert not private, private


def code_sources() -> list[tuple[str, str]]:
    """``(where, Python source)`` of every module of models/, train/, configs/, tests/ and every notebook code cell
    (IPython ``%`` / ``!`` lines blanked)."""
    sources = [(str(f.relative_to(ROOT)), f.read_text()) for f in MODULES.values()]
    sources += [(str(f.relative_to(ROOT)), f.read_text()) for f in sorted((ROOT / "tests").rglob("*.py"))]
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(notebook.read_text())["cells"]):
            if cell["cell_type"] == "code":
                text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
                lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in text.splitlines()]
                sources.append((f"{notebook.relative_to(ROOT)} cell {i}", "\n".join(lines)))
    return sources


def test_everything_imports_the_installed_names():
    bad = []
    for where, source in code_sources():
        for node in ast.walk(ast.parse(source, where)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            bad += [f"{where}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in BARE]
    assert not bad, f"import flaxzoo.models / flaxzoo.train / flaxzoo.configs instead: {bad}"


@pytest.mark.parametrize("source, expected", [
    ("import models.bert", ["models.bert"]),
    ("from train.loop import x", ["train.loop"]),
    ("def f():\n    from configs import default", ["configs"]),
])
def test_the_bare_name_check_sees_function_level_imports(source, expected):
    found = [n for node in ast.walk(ast.parse(source))
             for n in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module] if isinstance(node, ast.ImportFrom) else []) if n.split(".")[0] in BARE]
    assert found == expected


@pytest.mark.parametrize("old, new", [
    ("flaxzoo.models.hub", "flaxzoo.models.io"),
    ("flaxzoo.models.generate", "flaxzoo.models.inference.generate"),
    ("flaxzoo.models.lora", "flaxzoo.models.adapters.lora"),
    ("flaxzoo.models.chat", "flaxzoo.models.io.chat"),
])
def test_a_moved_module_names_its_new_home(old, new):
    import importlib
    import importlib.util
    import sys

    import flaxzoo.models

    assert old not in sys.modules
    with pytest.raises(ModuleNotFoundError) as raised:
        importlib.import_module(old)
    assert str(raised.value) == f"{old} has moved: import {new}"
    importlib.import_module(new)  # the new name imports
    for moved, home in flaxzoo.models.MOVED_MODULES.items():
        assert importlib.util.find_spec(f"flaxzoo.models.{home}") is not None, (moved, home)


@pytest.mark.parametrize("old, new", [
    ("flaxzoo.train.gpu_check", "flaxzoo.train.tools.gpu_check"),
    ("flaxzoo.train.roofline", "flaxzoo.train.tools.roofline"),
    ("flaxzoo.train.targets", "flaxzoo.train.tools.targets"),
    ("flaxzoo.train.finetune.compile", "flaxzoo.train.tools.compile_finetune"),
    ("flaxzoo.train.loop", "flaxzoo.train.pretrain"),
])
def test_a_moved_train_module_names_its_new_home(old, new):
    import importlib
    import importlib.util
    import sys

    import flaxzoo.train

    assert old not in sys.modules
    with pytest.raises(ModuleNotFoundError) as raised:
        importlib.import_module(old)
    assert str(raised.value) == f"{old} has moved: import {new}"
    for moved, home in flaxzoo.train.MOVED_MODULES.items():
        assert importlib.util.find_spec(f"flaxzoo.train.{home}") is not None, (moved, home)
        assert not (ROOT / "train" / f"{moved.replace('.', '/')}.py").exists(), moved


@pytest.mark.parametrize("command", ["bench", "compile"])
def test_the_tools_old_commands_still_run(command):
    """``python -m flaxzoo.train.bench`` / ``.compile`` forward to ``flaxzoo.train.tools``: the tool's own help."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", f"flaxzoo.train.{command}", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "usage: python -m flaxzoo.train." + command in proc.stdout, proc.stderr[-2000:]
