"""``DataConfig``: the input pipeline's settings, validated at construction."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from flaxzoo.models.config import FieldError

from flaxzoo.train.tokenizer import KINDS as TOKENIZER_KINDS, min_vocab_size

OBJECTIVES = ("causal", "mlm")
MIN_SEQ_LEN = 8


def default_data_dir() -> str:
    return os.environ.get("FLAXZOO_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "flaxzoo", "data")


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
    batch_size: global batch size (each JAX process loads the rows its devices hold).
    objective: ``"causal"`` | ``"mlm"``; mask_prob: MLM masking rate (the share of a row's non-special tokens
        predicted); max_predictions: at most this many predicted tokens per MLM row, the width of
        ``masked_positions`` / ``masked_labels`` (0 = ``ceil(mask_prob * seq_len)``; see :attr:`predictions`).
    val_fraction: share of documents held out for validation (embedded and files sources).
    seed: shuffle and masking seed; shuffle: global shuffle of records; num_epochs: ``None`` = repeat forever.
    worker_count: Grain worker processes (0 = produce batches in this process); prefetch: batches buffered (per
        worker, and by the reader threads); read_threads: Grain reader threads producing batches ahead of the
        consumer (0 = produce each batch when it is asked for). Default 1: on a 2-core AMD EPYC a training loop then
        waits ~0.2 ms per batch (GPT 8 x 256, BERT 16 x 128) against 1-2 ms with 0 threads; 2 threads or a worker
        process are no faster there.
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
    max_predictions: int = 0
    val_fraction: float = 0.05
    seed: int = 0
    shuffle: bool = True
    num_epochs: int | None = None
    worker_count: int = 0
    prefetch: int = 2
    read_threads: int = 1

    def __post_init__(self) -> None:
        paths = self.paths
        if isinstance(paths, (str, os.PathLike)):
            paths = (paths,)
        object.__setattr__(self, "paths", tuple(str(p) for p in (paths or ())))
        if not self.data_dir:
            object.__setattr__(self, "data_dir", default_data_dir())
        self.validate()

    def validate(self) -> None:
        """Raise ``FieldError`` (a ValueError) naming the first bad field (``.field``) and its value."""
        if not (self.source in ("embedded", "files") or (self.source.startswith("tfds:") and len(self.source) > 5)):
            raise FieldError("source", f"source={self.source!r}: expected 'embedded', 'files' or 'tfds:NAME'")
        if self.source == "files" and not self.paths:
            raise FieldError("paths", "source='files' needs paths: expected one or more files or globs")
        if self.objective not in OBJECTIVES:
            raise FieldError("objective", f"objective={self.objective!r}: expected one of {OBJECTIVES}")
        for name in ("seq_len", "batch_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise FieldError(name, f"{name}={value!r}: expected a positive integer")
        if self.seq_len < MIN_SEQ_LEN:
            raise FieldError("seq_len", f"seq_len={self.seq_len}: expected at least {MIN_SEQ_LEN} tokens per example")
        if self.tokenizer in TOKENIZER_KINDS and self.vocab_size < min_vocab_size(self.tokenizer):
            raise FieldError(
                "vocab_size", f"vocab_size={self.vocab_size} is too small for the special tokens and base alphabet of a "
                f"{self.tokenizer} tokenizer; expected at least {min_vocab_size(self.tokenizer)}"
            )
        if not 0.0 < self.mask_prob < 1.0:
            raise FieldError("mask_prob", f"mask_prob={self.mask_prob}: expected a rate in (0, 1)")
        mp = self.max_predictions
        if not isinstance(mp, int) or isinstance(mp, bool) or not 0 <= mp <= self.seq_len:
            raise FieldError("max_predictions", f"max_predictions={mp!r}: expected 0 (= ceil(mask_prob * seq_len)) or a count of "
                             f"predicted tokens per row in [1, seq_len={self.seq_len}]")
        if not 0.0 <= self.val_fraction < 1.0:
            raise FieldError("val_fraction", f"val_fraction={self.val_fraction}: expected a fraction in [0, 1)")
        if self.num_epochs is not None and self.num_epochs < 1:
            raise FieldError("num_epochs", f"num_epochs={self.num_epochs}: expected None (forever) or a positive integer")
        for name in ("worker_count", "read_threads", "tokenizer_max_docs", "seed"):
            if getattr(self, name) < 0:
                raise FieldError(name, f"{name}={getattr(self, name)}: expected >= 0")
        if self.prefetch < 1:
            raise FieldError("prefetch", f"prefetch={self.prefetch}: expected >= 1")

    @property
    def predictions(self) -> int:
        """``max_predictions`` resolved: the width P of ``masked_positions`` / ``masked_labels``."""
        # (the small tolerance keeps e.g. 0.15 * 20 = 3.0000000000000004 at 3)
        return self.max_predictions or max(1, math.ceil(self.mask_prob * self.seq_len - 1e-9))

    def replace(self, **changes: Any) -> "DataConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
