"""The input pipeline: TFDS builders (array_record) + Grain loaders, tokenizers, packing, MLM masking.

Everything runs without TensorFlow: datasets are written by ``tfds.core.GeneratorBasedBuilder`` subclasses with
``file_format="array_record"`` and read by random access (``builder.as_data_source``), never ``as_dataset()``.

Stages (each cached under ``DataConfig.data_dir``, so a second run reuses the first one's work):

1. **Raw text** (TFDS dataset of ``{"text": str}`` documents, splits ``train`` / ``validation``):

   - ``source="embedded"``: English text that ships with Python: the ``pydoc_data.topics`` help pages and the
     docstrings of the standard library (modules, classes, functions, methods), extracted in a fresh isolated
     interpreter (``python -I``) from a fixed sorted module list, de-duplicated, in a fixed order. Identical on any
     machine with the same Python version and OS family; about 1.65 M characters on CPython 3.11 / Linux.
   - ``source="files"``: ``paths`` (files or globs; ``~`` expanded; ``**`` recursive; ``.gz`` read compressed).
     ``.jsonl`` / ``.ndjson`` files: one document per line, its ``text_field`` string. Other files: plain text, split
     into paragraphs at blank lines for the train/validation assignment; consecutive paragraphs of one file that land
     in the same split stay one document (joined by a blank line). Bytes that are not valid UTF-8 are **replaced**
     by U+FFFD and **counted**: a warning names each file and its count (no crash).
   - ``source="tfds:NAME"`` (e.g. ``"tfds:lm1b"``, ``"tfds:wikipedia/20230601.en"``): any TFDS catalog dataset,
     downloaded and prepared once as array_record into ``data_dir`` (needs internet the first time; catalog builders
     whose own preparation code imports TensorFlow need it installed for that one step, or prepare them elsewhere in
     array_record format and point ``data_dir`` there). ``text_field`` names the feature to read (``"text"`` for
     lm1b and wikipedia); the validation split is the catalog's ``validation`` split, else its ``test`` split.

   The documents of the embedded corpus and of JSONL files are assigned to ``validation`` when a hash of their text
   falls below ``val_fraction`` (deterministic, and duplicates never straddle the splits).

2. **Tokenizer** (:func:`build_tokenizer`): ``tokenizer="bpe"`` (byte-level BPE, GPT-2 style) or ``"wordpiece"``
   (BERT) trained on the train split with ``vocab_size`` entries and saved as ``tokenizer.json``, or a path to load
   (``tokenizer.json``, ``vocab.txt``, ``vocab.json`` + ``merges.txt``, or a directory); see ``train/tokenizer.py``.

3. **Packed examples** (TFDS dataset ``flaxzoo_packed``, keyed by a hash of corpus, tokenizer, ``seq_len`` and
   objective): documents are tokenized and packed into fixed-length records, one record = one training example:

   - ``causal``: the stream ``doc_1 EOS doc_2 EOS ...`` is cut into windows of ``seq_len + 1`` tokens that overlap by
     one token (window ``k`` = ``stream[k*T : k*T + T + 1]``); no padding anywhere; the incomplete tail (< T tokens)
     is dropped.
   - ``mlm``: documents are split into sentences; sentences are packed greedily, in order, into
     ``[CLS] A [SEP] B [SEP] [PAD]...`` of ``seq_len`` tokens (A = the first half of the record's sentences, B = the
     rest; ``token_type_ids`` 0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``); a sentence longer than ``seq_len - 3`` is
     cut into pieces. Records may cross document boundaries (RoBERTa's FULL-SENTENCES).

4. **Loading** (:func:`make_iterator`): a Grain ``DataLoader`` whose items are whole batches (:class:`BatchSource`),
   so Grain's per-item cost is paid once per batch, not once per example. Epoch ``e`` visits the packed records in
   a seeded global permutation (``np.random.default_rng([seed, e])``; a new order every epoch); global batch ``g``
   holds the next ``batch_size`` records of that order; ``num_epochs=None`` repeats forever. Per-process sharding:
   ``grain.sharding.ShardByJaxProcess`` gives this process's index ``p`` of ``P``, and the process keeps rows
   ``[p*B/P, (p+1)*B/P)`` of every global batch, so together the processes read each global batch exactly once
   and the global batch does not depend on ``P``. MLM masking draws from ``np.random.default_rng([seed, e, i])``
   for the record at position ``i`` of epoch ``e``. ``worker_count`` > 0 produces batches in Grain worker
   processes (``prefetch`` batches buffered each); the batches are the same for any ``worker_count``. The
   iterator's ``get_state()`` / ``set_state()`` (JSON bytes; ``grain.checkpoint.CheckpointSave(it)`` in orbax) resume
   at the exact next batch; restore into a loader with the same ``worker_count``.

Batches are dicts of numpy arrays:

(B = this process's rows, ``batch_size // process_count``; T = ``seq_len``)

- ``causal``: ``input_ids`` [B, T] int32 and ``targets`` [B, T] int32, the next token of each position
  (``targets[:, t] == input_ids[:, t + 1]``; the last target is the token that follows the window in the corpus):
  the trainer uses ``targets`` as they are, no shifting, and every position has a label (no padding, no mask).
- ``mlm``: ``input_ids`` [B, T] int32 (masked), ``labels`` [B, T] int32 (the original id at masked positions, −100
  elsewhere), ``attention_mask`` [B, T] int32 (0 on padding), ``token_type_ids`` [B, T] int32.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import dataclasses
import glob
import gzip
import hashlib
import itertools
import json
import logging
import os
import pathlib
import re
import subprocess
import sys
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import grain
import numpy as np
import tensorflow_datasets as tfds

from train.tokenizer import (
    KINDS as TOKENIZER_KINDS,
    TextTokenizer,
    load_tokenizer,
    min_vocab_size,
    train_tokenizer,
)

log = logging.getLogger(__name__)

OBJECTIVES = ("causal", "mlm")
IGNORE_INDEX = -100
MIN_SEQ_LEN = 8
PACK_FORMAT_VERSION = 1  # bump when the packing layout changes: new cache keys
TOKENIZER_CACHE_VERSION = 1
JSONL_SUFFIXES = (".jsonl", ".ndjson")

__all__ = [
    "BatchSource", "DataConfig", "IGNORE_INDEX", "TextTokenizer", "build_tokenizer", "embedded_documents", "load_documents",
    "make_iterator", "make_loader", "mask_tokens", "measure_throughput", "pack_causal", "pack_mlm", "prepare",
    "raw_sources", "read_text_files", "split_sentences",
]


def default_data_dir() -> str:
    return os.environ.get("FLAXZOO_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "flaxzoo", "data")


# ======================================================================================================== config
@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The input pipeline's settings (an ``ml_collections`` config section fills it 1:1).

    source: ``"embedded"`` | ``"files"`` | ``"tfds:NAME[/CONFIG][:VERSION]"``.
    paths: files or globs for ``source="files"`` (a single string is accepted).
    text_field: the JSONL key / TFDS feature holding the text.
    data_dir: where raw datasets, tokenizers and packed datasets are cached ("" = ``$FLAXZOO_DATA_DIR`` or
        ``~/.cache/flaxzoo/data``).
    tokenizer: ``"bpe"`` | ``"wordpiece"`` (trained on the train split, cached) or a path to load.
    vocab_size: size of a trained tokenizer (ignored when loading one).
    lowercase: WordPiece normalisation (training, and loading a ``vocab.txt`` without ``tokenizer_config.json``).
    tokenizer_max_docs: train the tokenizer on at most this many documents (an evenly strided subset); 0 = all.
    seq_len: tokens per example (>= 8).
    batch_size: global batch size (split evenly over JAX processes).
    objective: ``"causal"`` | ``"mlm"``; mask_prob: MLM masking rate.
    val_fraction: share of documents held out for validation (embedded and files sources).
    seed: shuffle and masking seed; shuffle: global shuffle of records; num_epochs: ``None`` = repeat forever.
    worker_count: Grain worker processes (0 = produce batches in the calling thread); prefetch: batches buffered per
        worker; read_threads: Grain reader threads (0 = read in the consuming thread; the fastest on few cores).
    """

    source: str = "embedded"
    paths: tuple[str, ...] = ()
    text_field: str = "text"
    data_dir: str = ""
    tokenizer: str = "bpe"
    vocab_size: int = 8192
    lowercase: bool = True
    tokenizer_max_docs: int = 0
    seq_len: int = 256
    batch_size: int = 16
    objective: str = "causal"
    mask_prob: float = 0.15
    val_fraction: float = 0.05
    seed: int = 0
    shuffle: bool = True
    num_epochs: int | None = None
    worker_count: int = 0
    prefetch: int = 2
    read_threads: int = 0

    def __post_init__(self) -> None:
        paths = self.paths
        if isinstance(paths, (str, os.PathLike)):
            paths = (paths,)
        object.__setattr__(self, "paths", tuple(str(p) for p in (paths or ())))
        if not self.data_dir:
            object.__setattr__(self, "data_dir", default_data_dir())
        self._validate()

    def _validate(self) -> None:
        if not (self.source in ("embedded", "files") or (self.source.startswith("tfds:") and len(self.source) > 5)):
            raise ValueError(f"source={self.source!r}: expected 'embedded', 'files' or 'tfds:NAME'")
        if self.source == "files" and not self.paths:
            raise ValueError("source='files' needs paths: expected one or more files or globs")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective={self.objective!r}: expected one of {OBJECTIVES}")
        for name in ("seq_len", "batch_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r}: expected a positive integer")
        if self.seq_len < MIN_SEQ_LEN:
            raise ValueError(f"seq_len={self.seq_len}: expected at least {MIN_SEQ_LEN} tokens per example")
        if self.tokenizer in TOKENIZER_KINDS and self.vocab_size < min_vocab_size(self.tokenizer):
            raise ValueError(
                f"vocab_size={self.vocab_size} is too small for the special tokens and base alphabet of a "
                f"{self.tokenizer} tokenizer; expected at least {min_vocab_size(self.tokenizer)}"
            )
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"mask_prob={self.mask_prob}: expected a rate in (0, 1)")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction={self.val_fraction}: expected a fraction in [0, 1)")
        if self.num_epochs is not None and self.num_epochs < 1:
            raise ValueError(f"num_epochs={self.num_epochs}: expected None (forever) or a positive integer")
        for name in ("worker_count", "read_threads", "tokenizer_max_docs", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)}: expected >= 0")
        if self.prefetch < 1:
            raise ValueError(f"prefetch={self.prefetch}: expected >= 1")

    def replace(self, **changes: Any) -> "DataConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ================================================================================================= plain helpers
def _doc_hash_fraction(text: str) -> float:
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _is_validation(text: str, val_fraction: float) -> bool:
    return _doc_hash_fraction(text) < val_fraction


def split_documents(docs: Iterable[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """(train, validation) by a hash of each document's text."""
    train, val = [], []
    for d in docs:
        (val if _is_validation(d, val_fraction) else train).append(d)
    return train, val


_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+(?=\S)|\n[ \t]*\n\s*")


def split_sentences(text: str) -> list[str]:
    """Sentences for MLM packing: cuts after ``.``/``!``/``?`` followed by white space, and at blank lines."""
    return [s.strip() for s in _SENTENCE_RE.split(text) if s and s.strip()]


@contextlib.contextmanager
def _quiet_tfds() -> Iterator[None]:
    """No TFDS progress bars, no absl 'custom data configuration' chatter while building / opening datasets."""
    from tensorflow_datasets.core.utils import tqdm_utils

    was_active = getattr(tqdm_utils, "_active", True)
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    tfds.display_progress_bar(False)
    absl_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        tfds.display_progress_bar(was_active)
        absl_logger.setLevel(level)


@contextlib.contextmanager
def _file_lock(directory: pathlib.Path) -> Iterator[None]:
    """An exclusive lock on ``directory/.flaxzoo.lock`` (POSIX), so that concurrent processes prepare once."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(directory / ".flaxzoo.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ============================================================================================== embedded corpus
# Run in a fresh `python -I` so the result does not depend on what the calling process imported or patched.
_EMBEDDED_SCRIPT = r'''
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

_EMBEDDED_CACHE: list[str] | None = None


def embedded_documents() -> list[str]:
    """The embedded corpus: ``pydoc_data.topics`` pages then standard-library docstrings, de-duplicated, in a fixed
    order (computed once per process, in an isolated child interpreter)."""
    global _EMBEDDED_CACHE
    if _EMBEDDED_CACHE is None:
        # The child prints ASCII-only JSON, so its locale and encoding do not matter.
        proc = subprocess.run([sys.executable, "-I", "-c", _EMBEDDED_SCRIPT], capture_output=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"extracting the embedded corpus failed:\n{proc.stderr.decode(errors='replace')}")
        _EMBEDDED_CACHE = json.loads(proc.stdout.decode("utf-8"))
    return list(_EMBEDDED_CACHE)


# ==================================================================================================== text files
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


def decode_bytes(data: bytes) -> tuple[str, int]:
    """``data`` as UTF-8 (a BOM is dropped); undecodable sequences become U+FFFD. Returns (text, replacements)."""
    try:
        return data.decode("utf-8-sig"), 0
    except UnicodeDecodeError:
        counter = _ReplacementCounter()
        return data.decode("utf-8-sig", errors=counter.name), counter.count


def _has_magic(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def resolve_paths(patterns: Sequence[str]) -> list[pathlib.Path]:
    """Files named by ``patterns`` (paths or globs), sorted, de-duplicated. FileNotFoundError names the first path
    that does not exist or glob that matches no file."""
    files: dict[str, pathlib.Path] = {}
    for pattern in patterns:
        expanded = os.path.expanduser(str(pattern))
        if _has_magic(expanded):
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


def _read_bytes(path: pathlib.Path) -> bytes:
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as fh:
            return fh.read()
    return path.read_bytes()


def _is_jsonl(path: pathlib.Path) -> bool:
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
        text, replaced = decode_bytes(_read_bytes(path))
        if replaced:
            log.warning("%s: %d undecodable byte sequence(s) replaced with U+FFFD", path, replaced)
            replaced_total += replaced
        if _is_jsonl(path):
            for lineno, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
                if not isinstance(record, dict) or text_field not in record:
                    raise ValueError(f"{path}:{lineno}: no {text_field!r} field; expected a JSON object with a "
                                     f"string under text_field={text_field!r}")
                doc = record[text_field]
                if not isinstance(doc, str):
                    raise ValueError(f"{path}:{lineno}: {text_field!r} is {type(doc).__name__}; expected a string")
                if doc.strip():
                    (val if _is_validation(doc, val_fraction) else train).append(doc)
        else:
            # Paragraphs are assigned to a split by hash; runs of consecutive same-split paragraphs stay one document.
            run: list[str] = []
            run_is_val = False
            for para in _PARAGRAPH_RE.split(text.replace("\r\n", "\n")):
                para = para.strip("\n")
                if not para.strip():
                    continue
                is_val = _is_validation(para, val_fraction)
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


# ================================================================================================ TFDS builders
class _TextBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First version."}

    def __init__(self, *, documents: Callable[[], tuple[list[str], list[str]]] | None = None, **kwargs: Any):
        self._documents_fn = documents
        super().__init__(**kwargs)

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self, description=self.__doc__,
            features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        if self._documents_fn is None:
            raise RuntimeError(f"{self.name} is not prepared in {self.data_dir} and has no documents to write")
        train, val = self._documents_fn()
        splits = {"train": self._generate_examples(train)}
        if val:
            splits["validation"] = self._generate_examples(val)
        return splits

    def _generate_examples(self, docs):
        for i, doc in enumerate(docs):
            yield i, {"text": doc}


class FlaxzooEmbeddedText(_TextBuilder, skip_registration=True):
    """Python's pydoc topics and standard-library docstrings (the embedded default corpus)."""

    name = "flaxzoo_embedded_text"


class FlaxzooTextFiles(_TextBuilder, skip_registration=True):
    """The user's text / JSONL files."""

    name = "flaxzoo_text_files"


class FlaxzooPacked(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Tokenized, packed fixed-length examples (one record = one training example)."""

    name = "flaxzoo_packed"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First version."}

    def __init__(self, *, seq_len: int, objective: str,
                 generators: dict[str, Callable[[], Iterator[dict[str, np.ndarray]]]] | None = None,
                 **kwargs: Any):
        self._seq_len = seq_len
        self._objective = objective
        self._generators = generators
        super().__init__(**kwargs)
        # TFDS pickles a builder as its constructor arguments (data sources sent to Grain workers hold one).
        self._original_state.update(seq_len=seq_len, objective=objective)

    def __setstate__(self, state):
        with _quiet_tfds():
            super().__setstate__(state)

    def _info(self):
        t = self._seq_len
        if self._objective == "causal":
            features = {"input_ids": tfds.features.Tensor(shape=(t + 1,), dtype=np.int32)}
        else:
            features = {"input_ids": tfds.features.Tensor(shape=(t,), dtype=np.int32),
                        "token_type_ids": tfds.features.Tensor(shape=(t,), dtype=np.int32)}
        return tfds.core.DatasetInfo(builder=self, description=self.__doc__,
                                     features=tfds.features.FeaturesDict(features), disable_shuffling=True,
                                     metadata=tfds.core.MetadataDict())

    def _split_generators(self, dl_manager):
        del dl_manager
        if self._generators is None:
            raise RuntimeError(f"{self.name} is not prepared in {self.data_dir} and has no examples to write")
        splits = {}
        for split, make in self._generators.items():
            stats: dict[str, int] = {}
            records = make(stats)
            first = next(records, None)  # TFDS cannot write an empty split: find out now
            if first is None:
                if split == "train":
                    raise ValueError(
                        f"corpus too small: its train split does not fill one example of seq_len={self._seq_len} "
                        f"tokens; add text or lower seq_len"
                    )
                log.warning("the %s split is too small for one example of %d tokens: it is left out",
                            split, self._seq_len)
                continue
            splits[split] = self._generate_examples(split, itertools.chain([first], records), stats)
        return splits

    def _generate_examples(self, split, records, stats):
        count = 0
        for count, record in enumerate(records, 1):
            yield count - 1, record
        self.info.metadata[split] = {**stats, "records": count}


def _prepare_builder(builder) -> None:
    if not builder.is_prepared():
        builder.download_and_prepare(file_format="array_record",
                                     download_config=tfds.download.DownloadConfig(try_download_gcs=False))


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclasses.dataclass
class RawCorpus:
    """Raw documents: ``sources[split]`` is a random-access data source of ``{"text": bytes}`` records."""

    corpus_id: str
    sources: dict[str, Any]
    text_field: str

    def texts(self, split: str, *, max_docs: int = 0) -> Iterator[str]:
        """The documents of ``split`` as str (every ``ceil(n / max_docs)``-th one when ``max_docs`` > 0)."""
        src = self.sources[split]
        n = len(src)
        step = max(1, -(-n // max_docs)) if max_docs else 1
        for i in range(0, n, step):
            value = src[i][self.text_field]
            if isinstance(value, bytes):
                value = value.decode("utf-8", errors="replace")
            elif not isinstance(value, str):
                value = str(value)
            if value.strip():
                yield value


def raw_sources(cfg: DataConfig) -> RawCorpus:
    """Build (once) and open the raw text dataset of ``cfg.source``."""
    data_dir = pathlib.Path(os.path.expanduser(cfg.data_dir))
    vf = cfg.val_fraction
    with _quiet_tfds(), _file_lock(data_dir):
        if cfg.source == "embedded":
            cls = FlaxzooEmbeddedText
            name = f"py{sys.version_info.major}{sys.version_info.minor}_{sys.platform}_val{vf:g}"
            builder = cls(data_dir=str(data_dir), config=tfds.core.BuilderConfig(name=name), file_format="array_record",
                          documents=lambda: split_documents(embedded_documents(), vf))
            text_field = "text"
        elif cfg.source == "files":
            files = resolve_paths(cfg.paths)  # FileNotFoundError before anything is built
            stamp = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
            name = "files_" + _key(stamp, cfg.text_field, vf)
            cls = FlaxzooTextFiles

            def documents():
                found = read_text_files(cfg.paths, text_field=cfg.text_field, val_fraction=vf)
                return found.train, found.validation

            builder = cls(data_dir=str(data_dir), config=tfds.core.BuilderConfig(name=name), file_format="array_record",
                          documents=documents)
            text_field = "text"
        else:
            builder = tfds.builder(cfg.source[len("tfds:"):], data_dir=str(data_dir), file_format="array_record")
            text_field = cfg.text_field
        _prepare_builder(builder)
        splits = builder.info.splits
        sources = {"train": builder.as_data_source("train")}
        for candidate in ("validation", "test"):
            if candidate in splits:
                sources["validation"] = builder.as_data_source(candidate)
                break
    if text_field not in builder.info.features:
        raise ValueError(f"text_field={text_field!r} is not a feature of {builder.name}; expected one of "
                         f"{sorted(builder.info.features.keys())}")
    config_name = builder.builder_config.name if builder.builder_config else ""
    return RawCorpus(corpus_id=f"{builder.name}/{config_name}/{builder.version}", sources=sources,
                     text_field=text_field)


def load_documents(cfg: DataConfig, split: str = "train") -> list[str]:
    """The raw documents of ``split`` (builds the raw dataset if needed)."""
    return list(raw_sources(cfg).texts(split))


# ===================================================================================================== tokenizer
def build_tokenizer(cfg: DataConfig, corpus: RawCorpus | None = None) -> TextTokenizer:
    """The tokenizer of ``cfg``: loaded from a path, or trained on the train split and cached as
    ``data_dir/tokenizers/<key>/tokenizer.json`` (a second call loads that file)."""
    if cfg.tokenizer not in TOKENIZER_KINDS:
        tok = load_tokenizer(cfg.tokenizer, lowercase=cfg.lowercase)
    else:
        corpus = corpus or raw_sources(cfg)
        key = _key(corpus.corpus_id, cfg.tokenizer, cfg.vocab_size, cfg.lowercase, cfg.tokenizer_max_docs,
                   TOKENIZER_CACHE_VERSION)
        folder = pathlib.Path(os.path.expanduser(cfg.data_dir)) / "tokenizers" / f"{cfg.tokenizer}_{key}"
        with _file_lock(folder.parent):
            if (folder / "tokenizer.json").is_file():
                tok = load_tokenizer(folder / "tokenizer.json")
            else:
                tok = train_tokenizer(corpus.texts("train", max_docs=cfg.tokenizer_max_docs), cfg.tokenizer,
                                      cfg.vocab_size, lowercase=cfg.lowercase)
                tok.save(folder)
                (folder / "source.json").write_text(json.dumps({"corpus": corpus.corpus_id, **cfg.to_dict()},
                                                               indent=1, default=str))
    _check_tokenizer(tok, cfg.objective)
    return tok


def _check_tokenizer(tok: TextTokenizer, objective: str) -> dict[str, int]:
    roles = ("eos",) if objective == "causal" else ("cls", "sep", "mask", "pad")
    try:
        return tok.require(*roles)
    except ValueError as exc:
        hint = " (train one with tokenizer='wordpiece')" if objective == "mlm" else ""
        raise ValueError(f"objective={objective!r}: {exc}{hint}") from None


# ======================================================================================================= packing
def pack_causal(docs_ids: Iterable[Sequence[int]], seq_len: int, eos_id: int) -> Iterator[np.ndarray]:
    """Windows of ``seq_len + 1`` tokens over the stream ``doc_1 EOS doc_2 EOS ...``; window ``k`` is
    ``stream[k*seq_len : k*seq_len + seq_len + 1]`` (consecutive windows share one token, so the inputs
    ``w[:-1]`` of all windows are the stream, every token exactly once, in order). The tail that does not fill a
    window is dropped. Empty documents are skipped."""
    if seq_len < 1:
        raise ValueError(f"seq_len={seq_len}: expected a positive integer")
    pending = np.empty(0, np.int32)
    eos = np.array([eos_id], np.int32)
    for ids in docs_ids:
        if len(ids) == 0:
            continue
        pending = np.concatenate([pending, np.asarray(ids, np.int32), eos])
        n = (len(pending) - 1) // seq_len
        for k in range(n):
            yield pending[k * seq_len:k * seq_len + seq_len + 1].copy()
        if n:
            pending = pending[n * seq_len:]


def pack_mlm(sentences_ids: Iterable[Sequence[int]], seq_len: int, *, cls_id: int, sep_id: int,
             pad_id: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(input_ids, token_type_ids)`` records ``[CLS] A [SEP] B [SEP] [PAD]...`` of ``seq_len`` tokens, packing
    sentences greedily in order (A = first half of the record's sentences, B = the rest; a one-sentence record is
    ``[CLS] A [SEP]``). Sentences longer than ``seq_len - 3`` are cut into pieces. The last record is padded."""
    budget = seq_len - 3
    if budget < 1:
        raise ValueError(f"seq_len={seq_len}: expected at least 4 for [CLS] A [SEP] B [SEP]")

    def pieces() -> Iterator[np.ndarray]:
        for ids in sentences_ids:
            ids = np.asarray(ids, np.int32)
            for start in range(0, len(ids), budget):
                yield ids[start:start + budget]

    def emit(group: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        half = (len(group) + 1) // 2
        a = np.concatenate(group[:half])
        parts = [np.array([cls_id], np.int32), a, np.array([sep_id], np.int32)]
        types = [np.zeros(len(a) + 2, np.int32)]
        if len(group) > half:
            b = np.concatenate(group[half:])
            parts += [b, np.array([sep_id], np.int32)]
            types.append(np.ones(len(b) + 1, np.int32))
        ids = np.concatenate(parts)
        type_ids = np.concatenate(types)
        pad = seq_len - len(ids)
        return (np.concatenate([ids, np.full(pad, pad_id, np.int32)]),
                np.concatenate([type_ids, np.zeros(pad, np.int32)]))

    group: list[np.ndarray] = []
    used = 0
    for piece in pieces():
        if len(piece) == 0:
            continue
        if group and used + len(piece) > budget:
            yield emit(group)
            group, used = [], 0
        group.append(piece)
        used += len(piece)
    if group:
        yield emit(group)


def _tokenized(texts: Iterable[str], tok: TextTokenizer, chunk: int = 512) -> Iterator[list[int]]:
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == chunk:
            yield from tok.encode_batch(batch)
            batch = []
    if batch:
        yield from tok.encode_batch(batch)


def _record_generators(cfg: DataConfig, corpus: RawCorpus, tok: TextTokenizer):
    roles = _check_tokenizer(tok, cfg.objective)

    def make(split: str):
        def generate(stats: dict[str, int]) -> Iterator[dict[str, np.ndarray]]:
            counts = {"documents": 0, "tokens": 0}

            def docs() -> Iterator[str]:
                for text in corpus.texts(split):
                    counts["documents"] += 1
                    yield text

            def counted(ids_iter: Iterable[list[int]]) -> Iterator[list[int]]:
                for ids in ids_iter:
                    counts["tokens"] += len(ids)
                    yield ids

            if cfg.objective == "causal":
                for window in pack_causal(counted(_tokenized(docs(), tok)), cfg.seq_len, roles["eos"]):
                    yield {"input_ids": window}
            else:
                sentences = (s for d in docs() for s in split_sentences(d))
                for ids, types in pack_mlm(counted(_tokenized(sentences, tok)), cfg.seq_len, cls_id=roles["cls"],
                                           sep_id=roles["sep"], pad_id=roles["pad"]):
                    yield {"input_ids": ids, "token_type_ids": types}
            stats.update(counts)

        return generate

    return {split: make(split) for split in corpus.sources}


def prepare(cfg: DataConfig, tokenizer: TextTokenizer | None = None) -> dict[str, Any]:
    """Packed examples per split (``"train"``, and ``"validation"`` when the corpus has one): random-access data
    sources of fixed-length records, built once and cached under ``data_dir/flaxzoo_packed/<key>``."""
    corpus = raw_sources(cfg)
    tok = tokenizer if tokenizer is not None else build_tokenizer(cfg, corpus)
    _check_tokenizer(tok, cfg.objective)
    key = _key(corpus.corpus_id, tok.fingerprint(), cfg.seq_len, cfg.objective, PACK_FORMAT_VERSION)
    name = f"{cfg.objective}{cfg.seq_len}_{key}"
    data_dir = pathlib.Path(os.path.expanduser(cfg.data_dir))
    cls = FlaxzooPacked
    with _quiet_tfds(), _file_lock(data_dir):
        builder = cls(data_dir=str(data_dir), config=tfds.core.BuilderConfig(name=name), file_format="array_record",
                      seq_len=cfg.seq_len, objective=cfg.objective,
                      generators=_record_generators(cfg, corpus, tok))
        _prepare_builder(builder)
        return {split: builder.as_data_source(split) for split in builder.info.splits}


# ======================================================================================================= masking
_SPECIAL_CACHE: dict[tuple[int, tuple[int, ...]], tuple[np.ndarray, np.ndarray]] = {}


def _special_tables(vocab_size: int, special: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(is_special lookup table [vocab_size] bool, the non-special ids) for ``special``, cached."""
    key = (vocab_size, special)
    if key not in _SPECIAL_CACHE:
        is_special = np.zeros(vocab_size, bool)
        is_special[[s for s in special if 0 <= s < vocab_size]] = True
        allowed = np.flatnonzero(~is_special).astype(np.int32)
        if len(allowed) == 0:
            raise ValueError(f"vocab_size={vocab_size}: no non-special token to sample random replacements from")
        _SPECIAL_CACHE[key] = (is_special, allowed)
    return _SPECIAL_CACHE[key]


def mask_tokens(ids: np.ndarray, rng: np.random.Generator, *, vocab_size: int, mask_id: int,
                special_ids: Sequence[int], prob: float = 0.15) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking: each non-special token is selected with probability ``prob``; a selected token becomes
    ``mask_id`` (80 %), a uniformly drawn non-special token (10 %) or stays (10 %). Returns ``(inputs, labels)``, int32,
    ``labels`` = the original id where selected and −100 elsewhere. Special tokens (and ``mask_id``) are never
    selected nor drawn. ``ids`` may have any shape; every id must be in ``[0, vocab_size)``."""
    if not 0.0 < prob < 1.0:
        raise ValueError(f"prob={prob}: expected a rate in (0, 1)")
    if not 0 <= mask_id < vocab_size:
        raise ValueError(f"mask_id={mask_id}: expected a token id in [0, {vocab_size})")
    ids = np.asarray(ids)
    special = tuple(sorted({int(s) for s in special_ids} | {int(mask_id)}))
    is_special, allowed = _special_tables(vocab_size, special)
    u = rng.random((2, *ids.shape))
    selected = (u[0] < prob) & ~is_special[ids]
    labels = np.where(selected, ids, IGNORE_INDEX).astype(np.int32)
    inputs = ids.astype(np.int32, copy=True)
    inputs[selected & (u[1] < 0.8)] = mask_id
    to_random = selected & (u[1] >= 0.8) & (u[1] < 0.9)
    n_random = int(np.count_nonzero(to_random))
    if n_random:
        inputs[to_random] = allowed[rng.integers(0, len(allowed), n_random)]
    return inputs, labels


# ======================================================================================================= loading
_MAX_BATCH_INDEX = 2**62  # "forever": an index space no run exhausts


class BatchSource:
    """A random-access source of batches (Grain reads one item per batch, which keeps its per-item overhead off the
    per-example path).

    Item ``g`` is global batch ``g``: epoch ``e = g // batches_per_epoch`` visits the records in the order of a
    seeded permutation (``np.random.default_rng([seed, e])``; the identity when ``shuffle`` is off), global batch ``g``
    holds the next ``global_batch`` records of that order (the incomplete last batch of an epoch is dropped), and this
    process keeps rows ``[row_start, row_stop)`` of it. The data of global batch ``g`` therefore does not depend on
    the number of processes or Grain workers. MLM masking uses ``np.random.default_rng([seed, e, position])`` for
    the record at ``position`` of epoch ``e``'s order.
    """

    def __init__(self, records: Any, *, global_batch: int, row_start: int, row_stop: int, shuffle: bool, seed: int,
                 num_epochs: int | None, objective: str, masking: dict[str, Any] | None = None,
                 pad_last: bool = False):
        self.records = records
        self.global_batch = global_batch
        self.row_start, self.row_stop = row_start, row_stop
        self.shuffle, self.seed, self.num_epochs = shuffle, seed, num_epochs
        self.objective, self.masking = objective, masking
        # pad_last (evaluation): the last batch of an epoch is completed with padding rows that score nothing.
        self.pad_last = pad_last
        self.batches_per_epoch = (-(-len(records) // global_batch) if pad_last and len(records)
                                  else len(records) // global_batch)
        if self.batches_per_epoch < 1:
            raise ValueError(f"{len(records)} examples are fewer than one global batch of {global_batch}")
        if num_epochs is None:
            self._len = (_MAX_BATCH_INDEX // self.batches_per_epoch) * self.batches_per_epoch
        else:
            self._len = num_epochs * self.batches_per_epoch
        self._order_epoch: int | None = None
        self._order: np.ndarray | None = None

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return (f"BatchSource(records={len(self.records)}, global_batch={self.global_batch}, "
                f"rows=[{self.row_start}, {self.row_stop}), shuffle={self.shuffle}, seed={self.seed}, "
                f"num_epochs={self.num_epochs}, objective={self.objective!r})")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_order_epoch": None, "_order": None}

    def order(self, epoch: int) -> np.ndarray:
        """The record order of ``epoch`` (cached for the current epoch)."""
        if self._order_epoch != epoch:
            n = len(self.records)
            if self.shuffle:
                self._order = np.random.default_rng([self.seed, epoch]).permutation(n)
            else:
                self._order = np.arange(n)
            self._order_epoch = epoch
        return self._order

    def __getitem__(self, g: int) -> dict[str, np.ndarray]:
        if not 0 <= g < self._len:
            raise IndexError(f"batch index {g} out of range [0, {self._len})")
        epoch, b = divmod(int(g), self.batches_per_epoch)
        first = b * self.global_batch
        order = self.order(epoch)
        positions = [p for p in range(first + self.row_start, first + self.row_stop) if p < len(order)]
        padding = self.row_stop - self.row_start - len(positions)  # rows past the split's end (pad_last only)
        rows = [self.records[int(order[p])] for p in positions]
        ids = self._stack([r["input_ids"] for r in rows], padding, 0)
        if self.objective == "causal":
            targets = ids[:, 1:].copy()
            targets[len(rows):] = IGNORE_INDEX
            return {"input_ids": ids[:, :-1], "targets": targets}
        m = self.masking
        ids[len(rows):] = m["pad_id"]
        inputs = ids.copy()
        labels = np.full_like(ids, IGNORE_INDEX)
        for k, p in enumerate(positions):
            rng = np.random.default_rng([self.seed, epoch, p])
            inputs[k], labels[k] = mask_tokens(ids[k], rng, vocab_size=m["vocab_size"], mask_id=m["mask_id"],
                                               special_ids=m["special_ids"], prob=m["prob"])
        return {"input_ids": inputs, "labels": labels, "attention_mask": (ids != m["pad_id"]).astype(np.int32),
                "token_type_ids": self._stack([r["token_type_ids"] for r in rows], padding, 0)}

    def _stack(self, rows: list[np.ndarray], padding: int, fill: int) -> np.ndarray:
        """``rows`` as one int32 array, with ``padding`` more rows of ``fill`` (the length of the records)."""
        width = len(self.records[0]["input_ids"])
        stacked = np.stack(rows).astype(np.int32, copy=False) if rows else np.zeros((0, width), np.int32)
        if not padding:
            return stacked
        return np.concatenate([stacked, np.full((padding, width), fill, np.int32)])


def _allow_unparsed_absl_flags() -> None:
    # grain's worker processes read an absl flag; outside an absl app the flags are unparsed and reading raises.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def make_loader(cfg: DataConfig, split: str = "train", tokenizer: TextTokenizer | None = None, *,
                sources: dict[str, Any] | None = None, pad_last: bool = False, **overrides: Any):
    """A Grain ``DataLoader`` yielding this process's part of each global batch of ``split``.

    ``overrides`` replace ``cfg`` fields (e.g. ``num_epochs=1, shuffle=False`` for evaluation). ``sources`` (from
    :func:`prepare`) skips the cache lookup. ``pad_last`` (evaluation, with ``num_epochs``): the last partial batch
    of an epoch is completed with rows that score nothing (targets / labels −100), so the whole split is read,
    even one smaller than a batch. The process's rows come from ``grain.sharding.ShardByJaxProcess``:
    process ``p`` of ``P`` takes rows ``[p * B / P, (p + 1) * B / P)`` of every global batch of ``B`` records.
    """
    if overrides:
        cfg = cfg.replace(**overrides)
    if tokenizer is None and (sources is None or cfg.objective == "mlm"):
        tokenizer = build_tokenizer(cfg)
    if sources is None:
        sources = prepare(cfg, tokenizer)
    if split not in sources:
        raise ValueError(f"split={split!r}: the prepared data has splits {sorted(sources)}")
    records = sources[split]
    shard = grain.sharding.ShardByJaxProcess(drop_remainder=True)
    if cfg.batch_size % shard.shard_count:
        raise ValueError(f"batch_size={cfg.batch_size} is not divisible by the {shard.shard_count} JAX processes")
    if pad_last and cfg.num_epochs is None:
        raise ValueError("pad_last needs num_epochs (an epoch to complete): evaluation reads the split once")
    if len(records) < (1 if pad_last else cfg.batch_size):
        raise ValueError(f"split={split!r} has {len(records)} examples of {cfg.seq_len} tokens: fewer than one batch "
                         f"of batch_size={cfg.batch_size}; lower batch_size or seq_len, or add text")
    per_process = cfg.batch_size // shard.shard_count
    masking = None
    if cfg.objective == "mlm":
        if tokenizer is None:
            raise ValueError("objective='mlm' needs the tokenizer (for the [MASK] id and the special tokens)")
        roles = _check_tokenizer(tokenizer, "mlm")
        masking = {"vocab_size": tokenizer.vocab_size, "mask_id": roles["mask"], "pad_id": roles["pad"],
                   "special_ids": tokenizer.special_ids, "prob": cfg.mask_prob}
    source = BatchSource(records, global_batch=cfg.batch_size, row_start=shard.shard_index * per_process,
                         row_stop=(shard.shard_index + 1) * per_process, shuffle=cfg.shuffle, seed=cfg.seed,
                         num_epochs=cfg.num_epochs, objective=cfg.objective, masking=masking, pad_last=pad_last)
    sampler = grain.samplers.IndexSampler(num_records=len(source), shard_options=grain.sharding.NoSharding(),
                                          shuffle=False, num_epochs=1)
    if cfg.worker_count:
        _allow_unparsed_absl_flags()
    return grain.DataLoader(data_source=source, sampler=sampler, worker_count=cfg.worker_count,
                            worker_buffer_size=cfg.prefetch, shard_options=grain.sharding.NoSharding(),
                            read_options=grain.ReadOptions(num_threads=cfg.read_threads,
                                                           prefetch_buffer_size=cfg.prefetch))


def make_iterator(cfg: DataConfig, split: str = "train", tokenizer: TextTokenizer | None = None, *,
                  sources: dict[str, Any] | None = None, pad_last: bool = False, **overrides: Any):
    """An iterator of batches (dicts of numpy arrays, see the module docstring) with ``get_state()`` /
    ``set_state(state)`` for exact resume (``grain.checkpoint.CheckpointSave(it)`` stores it in orbax)."""
    return iter(make_loader(cfg, split, tokenizer, sources=sources, pad_last=pad_last, **overrides))


# ==================================================================================================== throughput
def measure_throughput(cfg: DataConfig, *, batches: int = 300, warmup: int = 10, split: str = "train",
                       tokenizer: TextTokenizer | None = None) -> dict[str, float]:
    """Tokens per second delivered by the pipeline of ``cfg`` (preparation and warm-up excluded)."""
    tok = tokenizer if tokenizer is not None else build_tokenizer(cfg)
    sources = prepare(cfg, tok)
    it = make_iterator(cfg, split, tok, sources=sources)
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    for _ in range(batches):
        batch = next(it)
    elapsed = time.perf_counter() - start
    b, t = batch["input_ids"].shape
    return {"tokens_per_s": batches * b * t / elapsed, "batches_per_s": batches / elapsed, "batch_shape": (b, t),
            "seconds": elapsed, "records": len(sources[split]), "vocab_size": tok.vocab_size}


def corpus_stats(cfg: DataConfig) -> dict[str, Any]:
    corpus = raw_sources(cfg)
    out: dict[str, Any] = {"corpus": corpus.corpus_id}
    for split in corpus.sources:
        docs = list(corpus.texts(split))
        out[split] = {"documents": len(docs), "characters": sum(map(len, docs))}
    return out


def _parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, DataConfig]:
    parser = argparse.ArgumentParser(prog="python -m train.data", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", action="store_true", help="measure pipeline tokens/s")
    parser.add_argument("--stats", action="store_true", help="print corpus sizes")
    parser.add_argument("--batches", type=int, default=300)
    defaults = DataConfig()
    for f in dataclasses.fields(DataConfig):
        value = getattr(defaults, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=value)
        elif isinstance(value, tuple):
            parser.add_argument(flag, nargs="*", default=list(value))
        elif f.name == "num_epochs":
            parser.add_argument(flag, type=lambda s: None if s.lower() == "none" else int(s), default=value)
        else:
            parser.add_argument(flag, type=type(value), default=value)
    args = parser.parse_args(argv)
    cfg = DataConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(DataConfig)})
    return args, cfg


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args, cfg = _parse_args(argv)
    if args.stats:
        print(json.dumps(corpus_stats(cfg), indent=1))
    if args.bench or not args.stats:
        t0 = time.perf_counter()
        tok = build_tokenizer(cfg)
        sources = prepare(cfg, tok)
        prep = time.perf_counter() - t0
        result = measure_throughput(cfg, batches=args.batches, tokenizer=tok)
        print(json.dumps({"config": cfg.to_dict(), "prepare_s": round(prep, 2),
                          "splits": {k: len(v) for k, v in sources.items()}, **result}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    from train import data as _data  # run the importable module, so pickled classes resolve as train.data.*

    sys.exit(_data.main())
