"""Pipeline throughput, corpus sizes and the unigram baseline, and the ``python -m flaxzoo.train.data`` command
line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import time
from typing import Any, Sequence

import numpy as np

from flaxzoo.train.data.builders import raw_sources
from flaxzoo.train.data.config import DataConfig
from flaxzoo.train.data.loader import make_iterator
from flaxzoo.train.data.packing import prepare
from flaxzoo.train.data.tokenizers import build_tokenizer
from flaxzoo.train.tokenizer import TextTokenizer


def unigram_baseline(sources: dict[str, Any], vocab_size: int, objective: str, *, ignore_ids: tuple[int, ...] = (),
                     max_records: int = 20_000) -> float | None:
    """Perplexity of the validation targets under the train split's unigram distribution (add-one smoothed): the
    best a model can do that ignores context.

    Causal: every token of the stream is a target. MLM: the non-special tokens (what masking can select). At most
    ``max_records`` records per split are read (evenly strided; the default corpus has fewer). None without a
    validation split.
    """
    if "validation" not in sources:
        return None

    def counts(split: str, targets: bool) -> np.ndarray:
        source = sources[split]
        indices = list(range(0, len(source), max(1, -(-len(source) // max_records))))
        total = np.zeros(vocab_size, np.int64)
        for start in range(0, len(indices), 4096):
            chunk = indices[start:start + 4096]
            records = source.__getitems__(chunk) if hasattr(source, "__getitems__") else [source[i] for i in chunk]
            ids = np.stack([np.asarray(r["input_ids"]) for r in records])
            if objective == "causal":
                ids = ids[:, 1:] if targets else ids[:, :-1]
            total += np.bincount(ids.ravel(), minlength=vocab_size)[:vocab_size]
        if ignore_ids:
            total[list(ignore_ids)] = 0
        return total

    train_counts = counts("train", targets=False).astype(np.float64)
    val_counts = counts("validation", targets=True).astype(np.float64)
    probs = (train_counts + 1.0) / (train_counts.sum() + vocab_size)
    cross_entropy = -(val_counts * np.log(probs)).sum() / max(val_counts.sum(), 1.0)
    return float(math.exp(cross_entropy))


def measure_throughput(cfg: DataConfig, *, batches: int = 300, warmup: int = 10, split: str = "train",
                       tokenizer: TextTokenizer | None = None) -> dict[str, Any]:
    """Tokens per second delivered by the pipeline of ``cfg`` and milliseconds per batch (preparation and warm-up
    excluded)."""
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
    return {"tokens_per_s": batches * b * t / elapsed, "batches_per_s": batches / elapsed,
            "ms_per_batch": 1e3 * elapsed / batches, "batch_shape": (b, t), "seconds": elapsed,
            "records": len(sources[split]), "vocab_size": tok.vocab_size}


def corpus_stats(cfg: DataConfig) -> dict[str, Any]:
    """Documents and characters per split of ``cfg``'s raw corpus."""
    corpus = raw_sources(cfg)
    out: dict[str, Any] = {"corpus": corpus.corpus_id}
    for split in corpus.sources:
        docs = list(corpus.texts(split))
        out[split] = {"documents": len(docs), "characters": sum(map(len, docs))}
    return out


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, DataConfig]:
    parser = argparse.ArgumentParser(prog="python -m flaxzoo.train.data",
                                     description="Prepare the input pipeline of a DataConfig; measure it.")
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
    args, cfg = parse_args(argv)
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
