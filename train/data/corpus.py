"""Raw text: the embedded corpus (and the script that extracts it), the user's text / JSONL files, and the
document / sentence splitting the later stages rely on.

- The embedded corpus: English text that ships with Python, the ``pydoc_data.topics`` help pages and the docstrings
  of the standard library (modules, classes, functions, methods), extracted in a fresh isolated interpreter
  (``python -I``) from a fixed sorted module list, de-duplicated, in a fixed order. Identical on any machine with the
  same Python version and OS family; about 1.65 M characters on CPython 3.11 / Linux. One docstring = one document.
- Files (:func:`read_text_files`): ``.jsonl`` / ``.ndjson`` files hold one document per line (its ``text_field``
  string). Other files are plain text, split into paragraphs at blank lines for the train/validation assignment;
  consecutive paragraphs of one file that land in the same split stay one document (joined by a blank line). Bytes
  that are not valid UTF-8 are replaced by U+FFFD and counted (a warning names each file and its count).
- Documents are assigned to ``validation`` when a hash of their text falls below ``val_fraction`` (deterministic;
  duplicates never straddle the splits).
"""

from __future__ import annotations

import codecs
import dataclasses
import glob
import gzip
import hashlib
import json
import logging
import os
import pathlib
import re
import subprocess
import sys
from typing import Any, Iterable, Iterator, Sequence

log = logging.getLogger(__name__)

JSONL_SUFFIXES = (".jsonl", ".ndjson")


# ------------------------------------------------------------------------------------------------- splitting
def doc_hash_fraction(text: str) -> float:
    """A number in [0, 1) from a hash of ``text`` (the split assignment)."""
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def is_validation(text: str, val_fraction: float) -> bool:
    return doc_hash_fraction(text) < val_fraction


def split_documents(docs: Iterable[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """(train, validation) by a hash of each document's text."""
    train, val = [], []
    for d in docs:
        (val if is_validation(d, val_fraction) else train).append(d)
    return train, val


_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+(?=\S)|\n[ \t]*\n\s*")


def split_sentences(text: str) -> list[str]:
    """Sentences for MLM packing: cuts after ``.``/``!``/``?`` followed by white space, and at blank lines."""
    return [s.strip() for s in _SENTENCE_RE.split(text) if s and s.strip()]


# ------------------------------------------------------------------------------------------- embedded corpus
# Run in a fresh `python -I` so the result does not depend on what the calling process imported or patched.
EMBEDDED_SCRIPT = r'''
import contextlib, importlib, inspect, io, json, pkgutil, re, sys, warnings
SKIP = {"this", "antigravity", "idlelib", "tkinter", "turtle", "turtledemo", "test", "tests", "lib2to3", "pydoc_data",
        "ensurepip", "venv", "msvcrt", "winreg", "winsound", "nt", "curses", "readline", "dbm", "sqlite3", "lzma",
        "bz2", "ssl", "xxsubtype", "xxlimited", "xxlimited_35", "distutils", "msilib", "idle_test"}

def quiet_import(name):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except BaseException:
            return None

modules = {}
for name in sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in SKIP):
    mod = quiet_import(name)
    if mod is None:
        continue
    modules[name] = mod
    if hasattr(mod, "__path__"):
        subs = sorted(i.name for i in pkgutil.walk_packages(mod.__path__, name + ".", onerror=lambda _: None))
        for sub in subs:
            parts = sub.split(".")
            if any(p.startswith("_") or p in SKIP for p in parts):
                continue
            m = quiet_import(sub)
            if m is not None:
                modules[sub] = m

docs = []
def add(key, obj):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = getattr(obj, "__doc__", None)
    if isinstance(d, str):
        d = inspect.cleandoc(d).strip()
        if len(d) >= 20 and not re.search(r" at 0x[0-9a-fA-F]+", d):
            docs.append((key, d))

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for mname in sorted(modules):
        mod = modules[mname]
        add(mname, mod)
        for k, v in sorted(vars(mod).items()):
            if k.startswith("_"):
                continue
            if not (inspect.isclass(v) or inspect.isfunction(v) or inspect.isbuiltin(v)):
                continue
            if getattr(v, "__module__", None) != mname:
                continue
            add(mname + "." + k, v)
            if inspect.isclass(v):
                for a, w in sorted(vars(v).items()):
                    if a.startswith("_") and a != "__init__":
                        continue
                    w = getattr(w, "__func__", w)
                    if (inspect.isfunction(w) or inspect.ismethoddescriptor(w) or isinstance(w, property)
                            or inspect.isbuiltin(w)):
                        add(mname + "." + k + "." + a, w)

import pydoc_data.topics
out, seen = [], set()
for _, d in [(k, inspect.cleandoc(v).strip()) for k, v in sorted(pydoc_data.topics.topics.items())] + docs:
    if d and d not in seen:
        seen.add(d)
        out.append(d)
sys.stdout.write(json.dumps(out))
'''

_embedded_cache: list[str] | None = None


def embedded_documents() -> list[str]:
    """The embedded corpus: ``pydoc_data.topics`` pages then standard-library docstrings, de-duplicated, in a fixed
    order (computed once per process, in an isolated child interpreter)."""
    global _embedded_cache
    if _embedded_cache is None:
        # The child prints ASCII-only JSON, so its locale and encoding do not matter.
        proc = subprocess.run([sys.executable, "-I", "-c", EMBEDDED_SCRIPT], capture_output=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"extracting the embedded corpus failed:\n{proc.stderr.decode(errors='replace')}")
        _embedded_cache = json.loads(proc.stdout.decode("utf-8"))
    return list(_embedded_cache)


# ------------------------------------------------------------------------------------------------- text files
class _ReplacementCounter:
    """A codecs error handler that replaces each undecodable byte sequence with U+FFFD and counts them."""

    def __init__(self) -> None:
        self.count = 0
        self.name = f"flaxzoo-count-{id(self)}"
        codecs.register_error(self.name, self)

    def __call__(self, exc: UnicodeError) -> tuple[str, int]:
        if not isinstance(exc, UnicodeDecodeError):
            raise exc
        self.count += 1
        return "\ufffd", exc.end


def jsonl_objects(text: str, path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line of a JSON-lines file's ``text``; a line that is not valid
    JSON, or not an object, raises ValueError naming ``path`` and the line."""
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object per line, got {type(record).__name__}")
        yield lineno, record


def decode_bytes(data: bytes) -> tuple[str, int]:
    """``data`` as UTF-8 (a BOM is dropped); undecodable sequences become U+FFFD. Returns (text, replacements)."""
    try:
        return data.decode("utf-8-sig"), 0
    except UnicodeDecodeError:
        counter = _ReplacementCounter()
        return data.decode("utf-8-sig", errors=counter.name), counter.count


def has_magic(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def resolve_paths(patterns: Sequence[str]) -> list[pathlib.Path]:
    """Files named by ``patterns`` (paths or globs), sorted, de-duplicated. FileNotFoundError names the first path
    that does not exist or glob that matches no file."""
    files: dict[str, pathlib.Path] = {}
    for pattern in patterns:
        expanded = os.path.expanduser(str(pattern))
        if has_magic(expanded):
            matches = sorted(p for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
            if not matches:
                raise FileNotFoundError(f"no file matches the data path glob {pattern!r}")
        else:
            if not os.path.exists(expanded):
                raise FileNotFoundError(f"data file {pattern!r} does not exist")
            if os.path.isdir(expanded):
                raise ValueError(f"data path {pattern!r} is a directory; expected files or a glob like "
                                 f"{os.path.join(pattern, '*.txt')!r}")
            matches = [expanded]
        for m in matches:
            p = pathlib.Path(m).resolve()
            files.setdefault(str(p), p)
    return [files[k] for k in sorted(files)]


def read_bytes(path: pathlib.Path) -> bytes:
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as fh:
            return fh.read()
    return path.read_bytes()


def is_jsonl(path: pathlib.Path) -> bool:
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    return name.endswith(JSONL_SUFFIXES)


@dataclasses.dataclass
class TextFiles:
    """What :func:`read_text_files` found: documents per split, and the undecodable byte sequences replaced."""

    train: list[str]
    validation: list[str]
    files: list[pathlib.Path]
    replaced: int


_PARAGRAPH_RE = re.compile(r"\n[ \t]*\n\s*")


def read_text_files(patterns: Sequence[str], *, text_field: str = "text", val_fraction: float = 0.05) -> TextFiles:
    """Read the user's files into train / validation documents (see the module docstring for the rules).

    Undecodable bytes are replaced with U+FFFD and counted (a warning per file, and ``TextFiles.replaced``).
    Raises FileNotFoundError for a missing file, ValueError for a bad JSONL line or an empty corpus.
    """
    files = resolve_paths(patterns)
    train: list[str] = []
    val: list[str] = []
    replaced_total = 0
    for path in files:
        text, replaced = decode_bytes(read_bytes(path))
        if replaced:
            log.warning("%s: %d undecodable byte sequence(s) replaced with U+FFFD", path, replaced)
            replaced_total += replaced
        if is_jsonl(path):
            for lineno, record in jsonl_objects(text, path):
                if text_field not in record:
                    raise ValueError(f"{path}:{lineno}: no {text_field!r} field; expected a JSON object with a "
                                     f"string under text_field={text_field!r}")
                doc = record[text_field]
                if not isinstance(doc, str):
                    raise ValueError(f"{path}:{lineno}: {text_field!r} is {type(doc).__name__}; expected a string")
                if doc.strip():
                    (val if is_validation(doc, val_fraction) else train).append(doc)
        else:
            # Paragraphs are assigned to a split by hash; runs of consecutive same-split paragraphs stay one document.
            run: list[str] = []
            run_is_val = False
            for para in _PARAGRAPH_RE.split(text.replace("\r\n", "\n")):
                para = para.strip("\n")
                if not para.strip():
                    continue
                is_val = is_validation(para, val_fraction)
                if run and is_val != run_is_val:
                    (val if run_is_val else train).append("\n\n".join(run))
                    run = []
                run.append(para)
                run_is_val = is_val
            if run:
                (val if run_is_val else train).append("\n\n".join(run))
    if not train and not val:
        raise ValueError(f"empty corpus: no text found in {[str(f) for f in files]}")
    if not train:
        raise ValueError(f"corpus too small: every document of {[str(f) for f in files]} fell into the validation "
                         f"split (val_fraction={val_fraction}); add text or lower val_fraction")
    return TextFiles(train=train, validation=val, files=files, replaced=replaced_total)
