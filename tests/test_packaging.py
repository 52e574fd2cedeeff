"""The distribution as a user installs it: the wheel holds one top-level package, ``flaxzoo``; the console script."""

from __future__ import annotations

import email
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SOURCE_FOLDERS = ("models", "train", "configs")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
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
    # every package folder of the source tree is in the wheel (pyproject lists them by hand)
    for folder in SOURCE_FOLDERS:
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.relative_to(REPO).as_posix()
            assert f"flaxzoo/{relative}" in names, f"{relative} is missing from the wheel: add its package to " \
                                                   "[tool.setuptools] packages in pyproject.toml"
        for module in (REPO / folder).rglob("*.py"):
            if "__pycache__" not in module.parts:
                assert f"flaxzoo/{module.relative_to(REPO).as_posix()}" in names, module


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
