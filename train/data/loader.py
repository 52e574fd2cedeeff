"""Batches: a random-access source of whole batches (:class:`BatchSource`) read by a Grain ``DataLoader``.

Grain's items are whole batches, so its per-item cost is paid once per batch, not once per example. Epoch ``e``
visits the packed records in a seeded global permutation (``np.random.default_rng([seed, e])``; a new order every
epoch); global batch ``g`` holds the next ``batch_size`` records of that order; ``num_epochs=None`` repeats forever.
A batch's records are read with one ``__getitems__`` call where the source has it (ArrayRecord sources do) and the
batch is large enough for that to pay (:data:`BATCHED_READ_MIN`), and stacked per field.

Per-process rows: ``rows`` (the training loop passes ``flaxzoo.train.sharding.BatchPlacement.rows``: the rows this
process's devices hold under the batch sharding, for any mesh) or by default ``grain.sharding.ShardByJaxProcess``'s
contiguous block ``[p*B/P, (p+1)*B/P)`` for process ``p`` of ``P``; either way the global batch does not depend on
``P``. MLM masking is keyed by ``(seed, e, i)`` for the record
at position ``i`` of epoch ``e``'s order (:mod:`flaxzoo.train.data.masking`). ``worker_count`` > 0 produces batches in Grain
worker processes, ``read_threads`` > 0 in reader threads, ``prefetch`` batches ahead; the batches are the same for
any of these settings.

**The data position is the step.** Global batch ``g`` is a pure function of ``g`` (and the settings), so resuming
needs only a number: ``make_iterator(..., start=g)`` yields global batches ``g, g + 1, ...``, and the iterator's
``position`` is the next one it will yield (a training checkpoint stores it; after step ``s`` it is ``s``).

Batches are dicts of int32 numpy arrays with the keys of ``flaxzoo.train.batches`` (B = this process's rows:
``batch_size // process_count`` by default, ``len(rows)`` when given; T = ``seq_len``; :func:`batch_shapes` gives the shapes):

- ``causal`` (``CAUSAL_KEYS``): ``input_ids`` [B, T]; ``targets`` [B, T], the next token of each position
  (``targets[:, t] == input_ids[:, t + 1]``; the last one is the token after the window), ``IGNORE_INDEX`` where the
  next token belongs to another document (a prediction across a boundary) and on padding rows; ``segment_ids``
  [B, T], the documents of the row numbered from 1 (0 on padding rows).
- ``mlm`` (``MLM_KEYS``): ``input_ids`` [B, T] (masked), ``attention_mask`` [B, T] (0 on padding),
  ``token_type_ids`` [B, T] (0), ``segment_ids`` [B, T] (segments from 1, 0 = padding), ``labels`` [B, T] (the
  original id at masked positions, ``IGNORE_INDEX`` elsewhere), ``masked_positions`` / ``masked_labels`` [B, P]
  (P = ``DataConfig.predictions``).
"""

from __future__ import annotations

from typing import Any, Sequence

import grain
import numpy as np

from flaxzoo.train.batches import CAUSAL_KEYS, IGNORE_INDEX, MLM_KEYS
from flaxzoo.train.data.config import DataConfig
from flaxzoo.train.data.masking import example_keys, mask_tokens
from flaxzoo.train.data.packing import prepare
from flaxzoo.train.data.tokenizers import build_tokenizer, check_tokenizer
from flaxzoo.train.tokenizer import TextTokenizer

MAX_BATCH_INDEX = 2**62  # "forever": an index space no run exhausts


def batch_shapes(cfg: DataConfig, rows: int) -> dict[str, tuple[int, ...]]:
    """``{key: shape}`` of a batch of ``rows`` rows under ``cfg`` (every array int32), in the order of
    ``flaxzoo.train.batches.CAUSAL_KEYS`` / ``MLM_KEYS``."""
    t = cfg.seq_len
    if cfg.objective == "causal":
        return {k: (rows, t) for k in CAUSAL_KEYS}
    p = cfg.predictions
    return {k: (rows, p) if k in ("masked_positions", "masked_labels") else (rows, t) for k in MLM_KEYS}


# TFDS's ArrayRecord ``__getitems__`` reads through a thread pool: measured on a 2-core AMD EPYC (MLM records of 128
# tokens) it costs 0.70 / 1.11 / 2.74 / 7.9 ms for 8 / 16 / 64 / 256 records against 0.32 / 0.86 / 2.47 / 10.0 ms
# one by one, so batches smaller than this are read one record at a time.
BATCHED_READ_MIN = 128


def read_records(records: Any, indices: np.ndarray, fields: tuple[str, ...]) -> dict[str, np.ndarray]:
    """``{field: [len(indices), ...] int32}``: the records at ``indices``, read with one ``__getitems__`` call where
    the source has it and there are at least :data:`BATCHED_READ_MIN` of them, stacked per field."""
    keys = [int(i) for i in indices]
    if hasattr(records, "__getitems__") and len(keys) >= BATCHED_READ_MIN:
        rows = records.__getitems__(keys)
    else:
        rows = [records[i] for i in keys]
    return {f: np.asarray([r[f] for r in rows], dtype=np.int32) for f in fields}


class BatchSource:
    """A random-access source of batches (Grain reads one item per batch, which keeps its per-item overhead off the
    per-example path).

    Item ``g`` is global batch ``g``: epoch ``e = g // batches_per_epoch`` visits the records in the order of a
    seeded permutation (``np.random.default_rng([seed, e])``; the identity when ``shuffle`` is off), global batch ``g``
    holds the next ``global_batch`` records of that order (the incomplete last batch of an epoch is dropped, or with
    ``pad_last`` completed with rows that score nothing), and this process keeps rows ``rows`` (ascending indices
    into the global batch) of it. The data of global batch ``g`` therefore depends neither on the number of processes nor on Grain's workers.
    ``masking`` (MLM): ``vocab_size``, ``mask_id``, ``pad_id``, ``special_ids``, ``prob``, ``max_predictions``.
    """

    def __init__(self, records: Any, *, global_batch: int, rows: Sequence[int], shuffle: bool, seed: int,
                 num_epochs: int | None, objective: str, masking: dict[str, Any] | None = None,
                 pad_last: bool = False):
        if objective == "mlm" and masking is None:
            raise ValueError("objective='mlm' needs masking settings (vocab_size, mask_id, pad_id, ...)")
        self.records = records
        self.global_batch = global_batch
        self.rows = np.asarray(rows, np.int64).reshape(-1)
        if not len(self.rows) or np.any(np.diff(self.rows) <= 0) or self.rows[0] < 0 or self.rows[-1] >= global_batch:
            shown = str(self.rows.tolist()[:8])[:-1] + (", ...]" if len(self.rows) > 8 else "]")
            raise ValueError(f"rows={shown}: expected ascending distinct row indices in [0, {global_batch})")
        self.shuffle, self.seed, self.num_epochs = shuffle, seed, num_epochs
        self.objective, self.masking = objective, masking
        self.pad_last = pad_last
        n = len(records)
        self.batches_per_epoch = -(-n // global_batch) if pad_last and n else n // global_batch
        if self.batches_per_epoch < 1:
            raise ValueError(f"{n} examples are fewer than one global batch of {global_batch}")
        if num_epochs is None:
            self._len = (MAX_BATCH_INDEX // self.batches_per_epoch) * self.batches_per_epoch
        else:
            self._len = num_epochs * self.batches_per_epoch
        self.width = len(records[0]["input_ids"])
        self._order_epoch: int | None = None
        self._order: np.ndarray | None = None

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return (f"BatchSource(records={len(self.records)}, global_batch={self.global_batch}, "
                f"rows={_describe_rows(self.rows)}, shuffle={self.shuffle}, seed={self.seed}, "
                f"num_epochs={self.num_epochs}, objective={self.objective!r})")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_order_epoch": None, "_order": None}

    def order(self, epoch: int) -> np.ndarray:
        """The record order of ``epoch`` (cached for the current epoch)."""
        if self._order_epoch != epoch:
            n = len(self.records)
            self._order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
            self._order_epoch = epoch
        return self._order

    def __getitem__(self, g: int) -> dict[str, np.ndarray]:
        if not 0 <= g < self._len:
            raise IndexError(f"batch index {g} out of range [0, {self._len})")
        epoch, b = divmod(int(g), self.batches_per_epoch)
        order = self.order(epoch)
        first = b * self.global_batch
        positions = first + self.rows
        real = int(np.count_nonzero(positions < len(order)))  # rows past the split's end are padding (pad_last)
        fill = 0 if self.objective == "causal" else self.masking["pad_id"]
        ids = np.full((len(positions), self.width), fill, np.int32)
        segments = np.zeros((len(positions), self.width), np.int32)
        if real:
            got = read_records(self.records, order[positions[:real]], ("input_ids", "segment_ids"))
            ids[:real], segments[:real] = got["input_ids"], got["segment_ids"]
        if self.objective == "causal":
            inputs_seg = segments[:, :-1]
            scored = (segments[:, 1:] == inputs_seg) & (inputs_seg > 0)
            return {"input_ids": ids[:, :-1], "targets": np.where(scored, ids[:, 1:], IGNORE_INDEX).astype(np.int32),
                    "segment_ids": np.ascontiguousarray(inputs_seg)}
        m = self.masking
        masked = mask_tokens(ids, example_keys(self.seed, epoch, positions), vocab_size=m["vocab_size"],
                             mask_id=m["mask_id"], special_ids=m["special_ids"], prob=m["prob"],
                             max_predictions=m["max_predictions"])
        return {"input_ids": masked["input_ids"], "attention_mask": (segments > 0).astype(np.int32),
                "token_type_ids": np.zeros_like(ids), "segment_ids": segments, "labels": masked["labels"],
                "masked_positions": masked["masked_positions"], "masked_labels": masked["masked_labels"]}


def _describe_rows(rows: np.ndarray) -> str:
    if len(rows) and rows[-1] - rows[0] + 1 == len(rows):
        return f"[{rows[0]}, {rows[-1] + 1})"
    return str(rows.tolist())


class _From:
    """The batches of ``source`` from index ``start`` on: item ``i`` is ``source[start + i]``."""

    def __init__(self, source: BatchSource, start: int):
        self.source, self.start = source, start

    def __len__(self) -> int:
        return len(self.source) - self.start

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return self.source[self.start + int(i)]

    def __repr__(self) -> str:
        return f"{self.source!r}[{self.start}:]"


class BatchIterator:
    """Batches from a Grain loader; ``position`` is the global batch index of the next batch it yields."""

    def __init__(self, loader: grain.DataLoader, start: int):
        self.loader = loader
        self.position = start
        self._it = iter(loader)

    def __iter__(self) -> "BatchIterator":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._it)
        self.position += 1
        return batch


def _allow_unparsed_absl_flags() -> None:
    # grain's worker processes read an absl flag; outside an absl app the flags are unparsed and reading raises.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def make_loader(cfg: DataConfig, split: str = "train", tokenizer: TextTokenizer | None = None, *,
                sources: dict[str, Any] | None = None, pad_last: bool = False, start: int = 0,
                rows: Sequence[int] | None = None, **overrides: Any):
    """A Grain ``DataLoader`` yielding this process's part of each global batch of ``split``, from global batch
    ``start`` on.

    ``overrides`` replace ``cfg`` fields (e.g. ``num_epochs=1, shuffle=False`` for evaluation). ``sources`` (from
    :func:`~flaxzoo.train.data.packing.prepare`) skips the cache lookup. ``pad_last`` (evaluation, with ``num_epochs``): the
    last partial batch of an epoch is completed with rows that score nothing (targets / labels ``IGNORE_INDEX``,
    segment 0), so the whole split is read, even one smaller than a batch. ``rows``: the rows of every global
    batch this process loads (``flaxzoo.train.sharding.BatchPlacement.rows``); by default ``grain.sharding.ShardByJaxProcess``'s
    block: process ``p`` of ``P`` takes rows ``[p * B / P, (p + 1) * B / P)`` of every global batch of ``B`` records.
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
    if rows is None:
        shard = grain.sharding.ShardByJaxProcess(drop_remainder=True)
        if cfg.batch_size % shard.shard_count:
            raise ValueError(f"batch_size={cfg.batch_size} is not divisible by the {shard.shard_count} JAX processes")
        per_process = cfg.batch_size // shard.shard_count
        rows = range(shard.shard_index * per_process, (shard.shard_index + 1) * per_process)
    if pad_last and cfg.num_epochs is None:
        raise ValueError("pad_last needs num_epochs (an epoch to complete): evaluation reads the split once")
    if len(records) < (1 if pad_last else cfg.batch_size):
        raise ValueError(f"split={split!r} has {len(records)} examples of {cfg.seq_len} tokens: fewer than one batch "
                         f"of batch_size={cfg.batch_size}; lower batch_size or seq_len, or add text")
    if "segment_ids" not in records[0]:
        raise ValueError(f"split={split!r}: records without segment_ids (an old packed dataset); prepare() again")
    masking = None
    if cfg.objective == "mlm":
        if tokenizer is None:
            raise ValueError("objective='mlm' needs the tokenizer (for the [MASK] id and the special tokens)")
        roles = check_tokenizer(tokenizer, "mlm")
        masking = {"vocab_size": tokenizer.vocab_size, "mask_id": roles["mask"], "pad_id": roles["pad"],
                   "special_ids": tuple(tokenizer.special_ids), "prob": cfg.mask_prob,
                   "max_predictions": cfg.predictions}
    source = BatchSource(records, global_batch=cfg.batch_size, rows=rows, shuffle=cfg.shuffle, seed=cfg.seed,
                         num_epochs=cfg.num_epochs, objective=cfg.objective, masking=masking, pad_last=pad_last)
    if not 0 <= start <= len(source):
        raise ValueError(f"start={start}: expected a global batch index in [0, {len(source)}]")
    view = _From(source, start) if start else source
    sampler = grain.samplers.IndexSampler(num_records=len(view), shard_options=grain.sharding.NoSharding(),
                                          shuffle=False, num_epochs=1)
    if cfg.worker_count:
        _allow_unparsed_absl_flags()
    return grain.DataLoader(data_source=view, sampler=sampler, worker_count=cfg.worker_count,
                            worker_buffer_size=cfg.prefetch, shard_options=grain.sharding.NoSharding(),
                            read_options=grain.ReadOptions(num_threads=cfg.read_threads,
                                                           prefetch_buffer_size=cfg.prefetch))


def make_iterator(cfg: DataConfig, split: str = "train", tokenizer: TextTokenizer | None = None, *,
                  sources: dict[str, Any] | None = None, pad_last: bool = False, start: int = 0,
                  rows: Sequence[int] | None = None, **overrides: Any) -> BatchIterator:
    """An iterator of batches (dicts of numpy arrays, see the module docstring) from global batch ``start`` on;
    its ``position`` is the next global batch index (what a checkpoint stores to resume)."""
    loader = make_loader(cfg, split, tokenizer, sources=sources, pad_last=pad_last, start=start, rows=rows,
                         **overrides)
    return BatchIterator(loader, start)
