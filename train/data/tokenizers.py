"""The tokenizer of a ``DataConfig``: loaded from a path, or trained on the train split and cached; and the check
that it has the special tokens an objective needs. (The tokenizer itself is ``flaxzoo.train.tokenizer.TextTokenizer``.)"""

from __future__ import annotations

import json
import os
import pathlib

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
        key = cache_key(corpus.corpus_id, cfg.tokenizer, cfg.vocab_size, cfg.lowercase, cfg.tokenizer_max_docs,
                        TOKENIZER_CACHE_VERSION)
        folder = pathlib.Path(os.path.expanduser(cfg.data_dir)) / "tokenizers" / f"{cfg.tokenizer}_{key}"
        with file_lock(folder.parent):
            if (folder / "tokenizer.json").is_file():
                tok = load_tokenizer(folder / "tokenizer.json")
            else:
                tok = train_tokenizer(corpus.texts("train", max_docs=cfg.tokenizer_max_docs), cfg.tokenizer,
                                      cfg.vocab_size, lowercase=cfg.lowercase)
                tok.save(folder)
                (folder / "source.json").write_text(json.dumps({"corpus": corpus.corpus_id, **cfg.to_dict()},
                                                               indent=1, default=str))
    check_tokenizer(tok, cfg.objective)
    return tok


def check_tokenizer(tok: TextTokenizer, objective: str) -> dict[str, int]:
    """The ids of the special tokens ``objective`` needs (``{"eos": ...}`` or ``{"cls", "sep", "mask", "pad"}``);
    ValueError naming the missing ones otherwise."""
    try:
        return tok.require(*ROLES[objective])
    except ValueError as exc:
        hint = " (train one with tokenizer='wordpiece')" if objective == "mlm" else ""
        raise ValueError(f"objective={objective!r}: {exc}{hint}") from None
