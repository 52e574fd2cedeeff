"""The distribution as a user installs it: the wheel holds one top-level package, ``flaxzoo``; the console script."""

from __future__ import annotations

import email
import importlib.util
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SOURCE_FOLDERS = ("models", "train", "configs")


def load_setup_script():
    """The repository's setup.py as a module (imported, not run: it calls ``setup`` only as ``__main__``)."""
    spec = importlib.util.spec_from_file_location("flaxzoo_setup_script", REPO / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def package_folders(root: pathlib.Path) -> set[str]:
    """``flaxzoo.<dotted folder>`` of every folder with an ``__init__.py`` under the source folders of ``root``."""
    return {"flaxzoo." + ".".join(init.parent.relative_to(root).parts)
            for folder in SOURCE_FOLDERS for init in (root / folder).rglob("__init__.py")}


def test_found_packages_are_every_folder_with_an_init():
    """setup.py finds the packages: every folder with an ``__init__.py`` under models/, train/, configs/, named
    flaxzoo.<folder>..., and nothing else (the list is derived, not written by hand)."""
    setup_script = load_setup_script()
    assert setup_script.package_dirs() == {f"flaxzoo.{folder}": folder for folder in SOURCE_FOLDERS}
    packages = setup_script.flaxzoo_packages()
    assert len(packages) == len(set(packages))
    assert set(packages) == package_folders(REPO)
    for name in ("flaxzoo.models.io", "flaxzoo.models.inference", "flaxzoo.models.adapters",
                 "flaxzoo.models.families.bert", "flaxzoo.models.architectures.decoder"):
        assert name in packages


def test_a_new_folder_is_found_without_an_edit(tmp_path):
    """A tree with a new nested package (and a folder without ``__init__.py``, which is no package): the new one is
    found under its mapped name, the other is not, with pyproject.toml unchanged."""
    for folder in SOURCE_FOLDERS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_bytes((REPO / "pyproject.toml").read_bytes())
    nested = tmp_path / "models" / "families" / "newfamily"
    nested.mkdir(parents=True)
    for init in (nested.parent / "__init__.py", nested / "__init__.py"):
        init.write_text("")
    (tmp_path / "train" / "notes").mkdir()
    packages = load_setup_script().flaxzoo_packages(tmp_path)
    assert packages == ["flaxzoo.configs", "flaxzoo.models", "flaxzoo.models.families",
                        "flaxzoo.models.families.newfamily", "flaxzoo.train"]
    assert set(packages) == package_folders(tmp_path)


def clean_copy(destination: pathlib.Path) -> pathlib.Path:
    """The repository's files as git sees them (tracked, and untracked ones it does not ignore) copied to
    ``destination``: a wheel built there cannot pick up a stale ``build/`` folder's modules."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                            check=True, timeout=60).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            (destination / name).write_bytes(source.read_bytes())
    return destination


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("wheel")
    source = clean_copy(tmp_path_factory.mktemp("source"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = out.glob("flaxzoo-*.whl")
    return built


@pytest.mark.slow
def test_wheel_holds_only_the_flaxzoo_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert tops - dist_info == {"flaxzoo"}, sorted(tops)
    # flaxzoo itself is a namespace package: nothing but the three mapped folders below it
    assert {name.split("/")[1] for name in names if name.startswith("flaxzoo/")} == set(SOURCE_FOLDERS)
    # every package folder of the source tree is in the wheel (setup.py finds them), and every module, and the
    # wheel's modules are the tree's (none from elsewhere)
    packages = {name.rsplit("/", 1)[0].replace("/", ".") for name in names if name.endswith("/__init__.py")}
    assert packages == package_folders(REPO), sorted(packages ^ package_folders(REPO))
    modules = {f"flaxzoo/{module.relative_to(REPO).as_posix()}" for folder in SOURCE_FOLDERS
               for module in (REPO / folder).rglob("*.py") if "__pycache__" not in module.parts}
    assert {name for name in names if name.endswith(".py")} == modules


def test_wheel_metadata_license_and_console_script(wheel):
    archive = zipfile.ZipFile(wheel)
    (dist_info,) = {n.split("/")[0] for n in archive.namelist() if n.split("/")[0].endswith(".dist-info")}
    metadata = email.message_from_bytes(archive.read(f"{dist_info}/METADATA"))
    assert metadata["License-Expression"] == "Apache-2.0"
    assert any(n.startswith(f"{dist_info}/licenses/LICENSE") for n in archive.namelist())
    entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    assert "flaxzoo = flaxzoo.train.cli:main" in entry_points


@pytest.mark.slow
def test_installed_wheel_imports_from_its_own_folder(wheel, tmp_path):
    """Installed (not editable) into a folder: flaxzoo.* come from there, and no ``models`` / ``train`` appears."""
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info")) in (["flaxzoo"],
                                                                                             ["bin", "flaxzoo"])
    code = ("import sys, flaxzoo.models.config, flaxzoo.train.cli, flaxzoo.configs; "
            "print(flaxzoo.models.config.__file__); "
            "print([m for m in ('models', 'train', 'configs') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path[:0] = {[str(target)]!r}; "
                           "import site; site.main(); " + code.replace("import sys, ", "import ")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONNOUSERSITE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    where, stray = proc.stdout.strip().splitlines()[-2:]
    assert pathlib.Path(where).is_relative_to(target), where
    assert stray == "[]"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flaxzoo.train.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def test_console_script_lists_commands_and_refuses_unknown_ones():
    listing = run_cli("help")
    assert listing.returncode == 0, listing.stderr
    for command in ("train", "convert", "compile", "bench", "launch"):
        assert f"  {command} " in listing.stdout
    unknown = run_cli("trian")
    assert unknown.returncode == 2
    assert "unknown command 'trian'" in unknown.stderr and "train" in unknown.stderr


def test_console_script_runs_the_module_with_its_own_flags_and_exit_code():
    help_text = run_cli("convert", "--help")
    assert help_text.returncode == 0, help_text.stderr
    assert "--to {hf,flaxzoo}" in help_text.stdout  # the module's own argparse
    missing = run_cli("convert", str(REPO / "no-such-checkpoint"), str(REPO / "never-written"))
    assert missing.returncode == 2, (missing.stdout, missing.stderr)
    assert "no-such-checkpoint" in missing.stderr
    assert not (REPO / "never-written").exists()
