"""The tokenizer of a ``DataConfig``: loaded from a path, or trained on the train split and cached; and the check
that it has the special tokens an objective needs. (The tokenizer itself is ``flaxzoo.train.tokenizer.TextTokenizer``.)"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Callable, Iterable

from flaxzoo.train.data.builders import RawCorpus, cache_key, file_lock, raw_sources
from flaxzoo.train.data.config import DataConfig
from flaxzoo.train.tokenizer import KINDS as TOKENIZER_KINDS, TextTokenizer, load_tokenizer, train_tokenizer

TOKENIZER_CACHE_VERSION = 1

ROLES = {"causal": ("eos",), "mlm": ("cls", "sep", "mask", "pad")}  # the special tokens each objective needs


def build_tokenizer(cfg: DataConfig, corpus: RawCorpus | None = None) -> TextTokenizer:
    """The tokenizer of ``cfg``: loaded from a path, or trained on the train split and cached as
    ``data_dir/tokenizers/<kind>_<key>/tokenizer.json`` (a second call loads that file)."""
    if cfg.tokenizer not in TOKENIZER_KINDS:
        tok = load_tokenizer(cfg.tokenizer, lowercase=cfg.lowercase)
    else:
        corpus = corpus or raw_sources(cfg)
        tok = cached_trained_tokenizer(
            lambda: corpus.texts("train", max_docs=cfg.tokenizer_max_docs), cfg.tokenizer, cfg.vocab_size,
            cfg.data_dir, identity=(corpus.corpus_id, cfg.tokenizer_max_docs), lowercase=cfg.lowercase,
            record={"corpus": corpus.corpus_id, **cfg.to_dict()})
    check_tokenizer(tok, cfg.objective)
    return tok


def cached_trained_tokenizer(texts: Callable[[], Iterable[str]], kind: str, vocab_size: int, data_dir: str, *,
                             identity: Any, lowercase: bool = True, record: dict[str, Any] | None = None
                             ) -> TextTokenizer:
    """A ``kind`` tokenizer of at most ``vocab_size`` pieces trained on ``texts()``, once: cached as
    ``data_dir/tokenizers/<kind>_<key>/tokenizer.json`` under a file lock, ``key`` hashing ``identity`` (what names
    the texts) and the settings. Every later call, process or rerun loads that file: the trainer of ``tokenizers``
    breaks ties between equally frequent merges differently from run to run, so two trainings on the same texts can
    keep different pieces. ``record``: written beside it as ``source.json``."""
    key = cache_key(identity, kind, vocab_size, lowercase, TOKENIZER_CACHE_VERSION)
    folder = pathlib.Path(os.path.expanduser(data_dir)) / "tokenizers" / f"{kind}_{key}"
    with file_lock(folder.parent):
        if not (folder / "tokenizer.json").is_file():
            train_tokenizer(texts(), kind, vocab_size, lowercase=lowercase).save(folder)
            (folder / "source.json").write_text(json.dumps(record or {"identity": identity}, indent=1, default=str))
        return load_tokenizer(folder / "tokenizer.json")  # the first call reads the file too: every call alike


def check_tokenizer(tok: TextTokenizer, objective: str) -> dict[str, int]:
    """The ids of the special tokens ``objective`` needs (``{"eos": ...}`` or ``{"cls", "sep", "mask", "pad"}``);
    ValueError naming the missing ones otherwise."""
    try:
        return tok.require(*ROLES[objective])
    except ValueError as exc:
        hint = " (train one with tokenizer='wordpiece')" if objective == "mlm" else ""
        raise ValueError(f"objective={objective!r}: {exc}{hint}") from None
