"""The packages, found rather than listed: each folder that pyproject.toml's ``[tool.setuptools.package-dir]`` maps
(``flaxzoo.models`` = ``models`` ...) and every folder with an ``__init__.py`` below it, under the mapped name
(``models/io`` -> ``flaxzoo.models.io``). setuptools adds these to pyproject.toml's settings;
``[tool.setuptools.packages.find]`` alone would name them after the folder (``models.io``)."""

from __future__ import annotations

import pathlib
import tomllib

from setuptools import find_packages, setup

ROOT = pathlib.Path(__file__).resolve().parent


def package_dirs(root: pathlib.Path = ROOT) -> dict[str, str]:
    """``{package: folder}`` of pyproject.toml's ``[tool.setuptools.package-dir]``."""
    with open(root / "pyproject.toml", "rb") as file:
        return dict(tomllib.load(file)["tool"]["setuptools"]["package-dir"])


def flaxzoo_packages(root: pathlib.Path = ROOT) -> list[str]:
    """Every mapped package and each package found below its folder, under the mapped name, sorted."""
    found = []
    for package, folder in package_dirs(root).items():
        found.append(package)
        found += [f"{package}.{name}" for name in find_packages(str(root / folder))]
    return sorted(found)


if __name__ == "__main__":  # setuptools runs this file as __main__; tests/test_packaging.py imports it
    setup(packages=flaxzoo_packages())
