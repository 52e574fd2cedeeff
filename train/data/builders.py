"""TFDS builders (``file_format="array_record"``, never TensorFlow), cache keys, the preparation lock, and the raw
text datasets they hold.

Every stage is cached under ``DataConfig.data_dir`` in a folder named by a key (:func:`cache_key`) of what it was
built from, so a second run reuses the first one's work, and a concurrent run waits on :func:`file_lock` instead of
building twice. Datasets are written by ``tfds.core.GeneratorBasedBuilder`` subclasses and read by random access
(``builder.as_data_source``), never ``as_dataset()`` (which needs TensorFlow).

Raw text (:func:`raw_sources`): a dataset of ``{"text": str}`` documents, splits ``train`` / ``validation``:

- ``source="embedded"``: :func:`flaxzoo.train.data.corpus.embedded_documents` (``flaxzoo_embedded_text``).
- ``source="files"``: :func:`flaxzoo.train.data.corpus.read_text_files` of ``paths`` (``flaxzoo_text_files``, keyed by the
  files' paths, sizes and modification times).
- ``source="tfds:NAME"`` (e.g. ``"tfds:lm1b"``, ``"tfds:wikipedia/20230601.en"``): any TFDS catalog dataset,
  downloaded and prepared once as array_record into ``data_dir`` (needs internet the first time; catalog builders
  whose own preparation code imports TensorFlow need it installed for that one step, or prepare them elsewhere in
  array_record format and point ``data_dir`` there). ``text_field`` names the feature to read; the validation split
  is the catalog's ``validation`` split, else its ``test`` split. One example = one document.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import itertools
import json
import logging
import os
import pathlib
import sys
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow_datasets as tfds

from flaxzoo.train.data import corpus as corpuslib
from flaxzoo.train.data.config import DataConfig

log = logging.getLogger(__name__)


def cache_key(*parts: Any) -> str:
    """A short stable hash of ``parts`` (JSON): the name of a cached stage."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


@contextlib.contextmanager
def quiet_tfds() -> Iterator[None]:
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
def file_lock(directory: pathlib.Path) -> Iterator[None]:
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


def prepare_builder(builder) -> None:
    """Write ``builder``'s dataset (array_record) unless it is there already. flaxzoo's own builders download
    nothing: TFDS's "Downloading and preparing dataset Unknown size" lines (printed to stdout) are dropped for them;
    a ``tfds:NAME`` dataset keeps them (it does download)."""
    if builder.is_prepared():
        return
    own = isinstance(builder, LocatedBuilder)
    with contextlib.redirect_stdout(io.StringIO()) if own else contextlib.nullcontext():
        builder.download_and_prepare(file_format="array_record",
                                     download_config=tfds.download.DownloadConfig(try_download_gcs=False))


# ------------------------------------------------------------------------------------------------- raw text
class LocatedBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A builder that says where its code is: tfds looks through the top-level package, and ``flaxzoo`` is a
    namespace package (the folders map to ``flaxzoo.*``) that an editable install backs with no directory."""

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> pathlib.Path:
        return pathlib.Path(sys.modules[cls.__module__].__file__)


class TextBuilder(LocatedBuilder, skip_registration=True):
    """A dataset of ``{"text": str}`` documents, written from ``documents() -> (train, validation)``."""

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


class FlaxzooEmbeddedText(TextBuilder, skip_registration=True):
    """Python's pydoc topics and standard-library docstrings (the embedded default corpus)."""

    name = "flaxzoo_embedded_text"


class FlaxzooTextFiles(TextBuilder, skip_registration=True):
    """The user's text / JSONL files."""

    name = "flaxzoo_text_files"


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
    with quiet_tfds(), file_lock(data_dir):
        if cfg.source == "embedded":
            name = f"py{sys.version_info.major}{sys.version_info.minor}_{sys.platform}_val{vf:g}"
            builder = FlaxzooEmbeddedText(data_dir=str(data_dir), config=tfds.core.BuilderConfig(name=name),
                                          file_format="array_record",
                                          documents=lambda: corpuslib.split_documents(corpuslib.embedded_documents(),
                                                                                      vf))
            text_field = "text"
        elif cfg.source == "files":
            files = corpuslib.resolve_paths(cfg.paths)  # FileNotFoundError before anything is built
            stamp = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
            name = "files_" + cache_key(stamp, cfg.text_field, vf)

            def documents():
                found = corpuslib.read_text_files(cfg.paths, text_field=cfg.text_field, val_fraction=vf)
                return found.train, found.validation

            builder = FlaxzooTextFiles(data_dir=str(data_dir), config=tfds.core.BuilderConfig(name=name),
                                       file_format="array_record", documents=documents)
            text_field = "text"
        else:
            builder = tfds.builder(cfg.source[len("tfds:"):], data_dir=str(data_dir), file_format="array_record")
            text_field = cfg.text_field
        prepare_builder(builder)
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


# --------------------------------------------------------------------------------------------------- packed
class FlaxzooPacked(LocatedBuilder, skip_registration=True):
    """Tokenized, packed fixed-length examples (one record = one training example); ``features`` maps each field
    to its length (all int32)."""

    name = "flaxzoo_packed"
    VERSION = tfds.core.Version("2.0.0")
    RELEASE_NOTES = {"1.0.0": "First version.", "2.0.0": "Per-token document / segment numbers."}

    def __init__(self, *, seq_len: int, features: dict[str, int],
                 generators: dict[str, Callable[[dict[str, int]], Iterator[dict[str, np.ndarray]]]] | None = None,
                 **kwargs: Any):
        self._seq_len = seq_len
        self._features = dict(features)
        self._generators = generators
        super().__init__(**kwargs)
        # TFDS pickles a builder as its constructor arguments (data sources sent to Grain workers hold one).
        self._original_state.update(seq_len=seq_len, features=self._features)

    def __setstate__(self, state):
        with quiet_tfds():
            super().__setstate__(state)

    def _info(self):
        features = {k: tfds.features.Tensor(shape=(n,), dtype=np.int32) for k, n in self._features.items()}
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
                log.warning("the %s split is too small for one example of %d tokens: it is left out", split,
                            self._seq_len)
                continue
            splits[split] = self._generate_examples(split, itertools.chain([first], records), stats)
        return splits

    def _generate_examples(self, split, records, stats):
        count = 0
        for count, record in enumerate(records, 1):
            yield count - 1, record
        self.info.metadata[split] = {**stats, "records": count}
