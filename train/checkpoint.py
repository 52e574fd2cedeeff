"""Training checkpoints: an orbax ``CheckpointManager`` with async saves, exact resume, damage detection.

Layout (a contract: ``from_pretrained`` reads training checkpoints with it)::

    WORKDIR/
      checkpoints/                 orbax CheckpointManager root; one directory per saved step, the last N kept
        <step>/
          state/                   ocp.args.StandardSave of a dict:
                                     "params":    the model's nnx.Param state as a pure nested dict,
                                                  nnx.state(model, nnx.Param).to_pure_dict() (layer lists have int
                                                  keys 0..L-1; restored without a target they come back as "0"...)
                                     "opt_state": the optax state (train/optim.py's chain)
                                     "step":      int32, the number of optimizer updates done
                                     "rng":       uint32[2], jax.random.key_data of the run's base key
          meta/                    ocp.args.JsonSave of {"format": "flaxzoo", "version": 1,
                                     "model_class": "GPTForCausalLM" | "BertForMaskedLM" | ...,
                                     "config": TransformerConfig.to_dict(),
                                     "train_config": the ml_collections config as a dict,
                                     "step": <step>, "tokenizer": "tokenizer.json" (relative to WORKDIR),
                                     "data": DataConfig.to_dict(),
                                     "data_position": the next global batch to read (= step)}
      damaged_checkpoints/<step>   a checkpoint that failed to restore, moved here (never deleted)
      tokenizer.json               the run's tokenizer
      metrics.jsonl, tensorboard/  logs (train/pretrain.py)

To read the parameters elsewhere: build the abstract model from ``meta["config"]`` and ``meta["model_class"]``,
take ``nnx.state(abstract, nnx.Param).to_pure_dict()`` as the restore target of ``state.params`` (or restore without a
target and turn the string layer keys back into ints), then ``nnx.merge``: ``from_pretrained`` (``flaxzoo.models.io.sources.WorkdirSource``,
behind :func:`load_params` too) does this.

The data position is a plain number: global batch ``g`` of the input pipeline is a pure function of ``g`` and the
data settings (``flaxzoo.train.data.loader``), so resuming reads ``data_position`` and starts the iterator there; nothing of
Grain's iterator internals is stored. A checkpoint of the earlier layout (a ``data/`` item holding Grain iterator
state, no ``data_position``) resumes at its step, which is where that loop's iterator stood.

``WORKDIR`` is a local path or an object-store URI (``gs://bucket/run``): paths go through ``etils.epath``, which
orbax takes as is (:func:`resolve_workdir`).

**Several processes** decide every restore together. Process 0 lists the steps; each process reads its part of a
candidate (meta, then its shards of the state) with up to :data:`READ_ATTEMPTS` attempts (a transient NFS / FUSE
error is retried after 1, then 2 seconds); then the outcomes are gathered and the candidate is taken only if it read
back on every process. A checkpoint unreadable on any process is damaged for all: process 0 alone moves it aside,
every process waits at the same barrier, and all try the previous step. The reads use orbax's handlers directly
(``StandardCheckpointHandler`` / ``JsonCheckpointHandler``), not ``CheckpointManager.restore``, whose closing barrier
a process that failed would never reach.

Saves are asynchronous: ``save`` returns once the arrays are copied off the devices, and the files are written in
a background thread while training goes on; a step directory appears only when complete (orbax writes to a
temporary directory and renames it). Restores build the target from the current mesh, so a checkpoint written on
any mesh or device count restores on any other.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from flaxzoo.train import multihost

log = logging.getLogger(__name__)

FORMAT = "flaxzoo"
VERSION = 1
READ_ATTEMPTS = 3  # reads of a checkpoint before it is called damaged
RETRY_DELAY_S = 1.0  # before the second attempt; doubled before each later one
_OK, _DAMAGED, _INCOMPATIBLE = 0, 1, 2  # a process's outcome of reading one checkpoint
ITEMS = ("state", "meta")
# Data settings that decide which records global batch g holds: a resumed run must have the same ones.
DATA_POSITION_FIELDS = ("source", "paths", "text_field", "tokenizer", "vocab_size", "lowercase", "tokenizer_max_docs",
                        "seq_len", "batch_size", "objective", "mask_prob", "max_predictions", "val_fraction", "seed",
                        "shuffle")


class CheckpointError(RuntimeError):
    """No usable checkpoint (all damaged), or one written by a different model."""


class _NotFinite(ValueError):
    """Restored values that are NaN / infinite: damaged bytes (a retry reads the same)."""


def is_remote(path: Any) -> bool:
    """Whether ``path`` is an object-store URI (``gs://``, ``s3://``, ...) rather than a local path."""
    return "://" in os.fspath(path)


def resolve_workdir(workdir: str | os.PathLike) -> epath.Path:
    """``workdir`` as an ``epath.Path``: URIs as given, local paths made absolute (``~`` expanded)."""
    text = os.fspath(workdir)
    return epath.Path(text if is_remote(text) else os.path.abspath(os.path.expanduser(text)))


@dataclasses.dataclass
class Restored:
    state: Any
    step: int
    meta: dict[str, Any]
    damaged: list[tuple[int, str]]  # (step, reason) of the checkpoints skipped on the way
    data_position: int = 0  # the next global batch of the train data to read


def _leaf_name(path) -> str:
    parts = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
        else:
            parts.append(str(entry))
    return ".".join(parts)


def _param_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    return {_leaf_name(path): tuple(leaf.shape) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _item_handlers() -> dict[str, Any]:
    return {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}


# Exceptions that mean a bug or a wrong call, not damaged files: never a reason to set a checkpoint aside.
_NOT_DAMAGE = (TypeError, AttributeError, NameError, AssertionError, NotImplementedError, ImportError,
               RecursionError, MemoryError, KeyboardInterrupt)


class Checkpointer:
    """Saves and restores ``{state, meta}`` under ``workdir/checkpoints``, keeping the last ``keep``."""

    def __init__(self, workdir: str | os.PathLike, *, keep: int = 3, async_save: bool = True,
                 directory: str = "checkpoints"):
        """``directory``: the folder of ``workdir`` the steps go in (the fine-tuner keeps its training state in
        ``train_checkpoints``, beside the exported classifier in ``checkpoints``)."""
        self.workdir = resolve_workdir(workdir)
        self.directory = self.workdir / directory
        self.damaged_directory = self.workdir / f"damaged_{directory}"
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save,
                                               cleanup_tmp_directories=True, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=_item_handlers())

    # ------------------------------------------------------------------------------------------------------ save
    def save(self, step: int, state: Any, data_position: int, meta: dict[str, Any]) -> None:
        """Start saving ``state`` (device arrays) and ``meta`` as step ``step``; ``data_position``: the next global
        batch of the train data (the iterator's ``position``; ``step`` in the training loop)."""
        if step in self.manager.all_steps():
            return
        if isinstance(data_position, bool) or not isinstance(data_position, (int, np.integer)) or data_position < 0:
            raise TypeError(f"data_position={data_position!r}: expected the next global batch index (an int >= 0)")
        meta = {"format": FORMAT, "version": VERSION, **meta, "step": int(step), "data_position": int(data_position)}
        self.manager.save(step, force=True, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))

    def wait(self) -> None:
        """Block until every started save is on disk."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    # --------------------------------------------------------------------------------------------------- restore
    def restore_latest(self, target: Any, *, model_class: str, config: dict[str, Any],
                       data: dict[str, Any] | None = None, base: dict[str, Any] | None = None) -> Restored | None:
        """Restore the newest checkpoint that reads back whole (on every process), or None when there is none.

        ``target``: the train state as ``jax.ShapeDtypeStruct`` with the shardings wanted now. ``data``: this run's
        ``DataConfig.to_dict()``; a checkpoint whose data settings put other records in its batches
        (:data:`DATA_POSITION_FIELDS`) raises :class:`CheckpointError`. ``Restored.data_position`` is where the train
        data resumes (``make_iterator(..., start=data_position)``). A checkpoint that fails to read (after
        :data:`READ_ATTEMPTS` attempts, on any process) is *damaged*: it is reported, moved to
        ``damaged_checkpoints/`` (so that it is neither retried nor counted among the kept ones) and the previous one
        is tried. When checkpoints exist but none reads back, raises :class:`CheckpointError` (a fresh start would
        silently throw the run away). A checkpoint of a different model raises :class:`CheckpointError` untouched.
        With several processes every decision is taken together (module docstring). ``base``: the pretrained
        weights this run starts from (``{"path", "fingerprint"}``; LoRA keeps them out of the checkpoint): a
        checkpoint written on other base weights (another fingerprint) raises :class:`CheckpointError`.
        """
        damaged: list[tuple[int, str]] = []
        for step in multihost.from_process_zero(sorted(self.manager.all_steps(), reverse=True)):
            outcome, result = self._read(step, target, model_class, config, data, base)
            outcomes = multihost.gather([outcome])[:, 0]
            if (outcomes == _INCOMPATIBLE).any():
                if outcome == _INCOMPATIBLE:
                    raise result
                raise CheckpointError(f"{self.directory / str(step)} does not fit this run on process(es) "
                                      f"{np.flatnonzero(outcomes == _INCOMPATIBLE).tolist()} (see their message)")
            if (outcomes == _DAMAGED).any():
                where = np.flatnonzero(outcomes == _DAMAGED).tolist()
                reason = result if outcome == _DAMAGED else "unreadable on another process"
                if multihost.is_multi_process():
                    reason += f" (unreadable on process(es) {where})"
                log.error("checkpoint at step %d is damaged (%s); moving it to %s and trying the previous one",
                          step, reason, self.damaged_directory)
                damaged.append((step, reason))
                self._quarantine(step)
                continue
            result.damaged = damaged
            return result
        if damaged:
            steps = ", ".join(str(s) for s, _ in damaged)
            raise CheckpointError(
                f"no good checkpoint in {self.directory}: step(s) {steps} are damaged ({damaged[0][1]}); they were "
                f"moved to {self.damaged_directory}. Remove that folder and rerun to start afresh, or point "
                "--workdir elsewhere")
        return None

    def _read(self, step: int, target: Any, model_class: str, config: dict[str, Any],
              data: dict[str, Any] | None, base: dict[str, Any] | None = None) -> tuple[int, Any]:
        """This process's outcome of reading checkpoint ``step``: ``(_OK, Restored)``, ``(_DAMAGED, reason)`` or
        ``(_INCOMPATIBLE, CheckpointError)``; transient errors are retried."""
        reason = ""
        for attempt in range(READ_ATTEMPTS):
            try:
                meta = self._read_meta(step)
                self._check_compatible(step, meta, target, model_class, config)
                self._check_base(step, meta, base)
                position = self._data_position(step, meta, data)
                state = self._read_state(step, target)
                return _OK, Restored(state=state, step=step, meta=meta, damaged=[], data_position=position)
            except CheckpointError as exc:
                return _INCOMPATIBLE, exc
            except _NOT_DAMAGE:
                raise
            except Exception as exc:  # orbax / tensorstore / JSON / OS errors: the files are damaged or unreachable
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                if isinstance(exc, _NotFinite) or attempt == READ_ATTEMPTS - 1:
                    break
                delay = RETRY_DELAY_S * 2 ** attempt
                log.warning("reading checkpoint %d failed (%s); attempt %d of %d in %.0f s", step, reason,
                            attempt + 2, READ_ATTEMPTS, delay)
                time.sleep(delay)
        return _DAMAGED, reason

    def _read_meta(self, step: int) -> dict[str, Any]:
        meta = ocp.JsonCheckpointHandler().restore(self.directory / str(step) / "meta", args=ocp.args.JsonRestore())
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"meta of step {step} is not a {FORMAT} checkpoint description")
        return meta

    def _check_compatible(self, step: int, meta: dict[str, Any], target: Any, model_class: str,
                          config: dict[str, Any]) -> None:
        if meta.get("model_class") != model_class:
            raise CheckpointError(f"{self.directory / str(step)} holds a {meta.get('model_class')} but this run "
                                  f"trains a {model_class}; use another --workdir")
        handler = ocp.StandardCheckpointHandler()
        try:
            stored = handler.metadata(self.directory / str(step) / "state")
        finally:
            handler.close()
        stored_tree = getattr(stored, "tree", stored)
        want = _param_shapes(target["params"])
        have = _param_shapes(stored_tree["params"])
        if want != have:
            diffs = [f"{k}: checkpoint {have.get(k)} vs model {want.get(k)}"
                     for k in sorted(set(want) | set(have)) if want.get(k) != have.get(k)]
            changed = {k: (meta["config"].get(k), v) for k, v in config.items()
                       if k in meta.get("config", {}) and meta["config"][k] != v}
            raise CheckpointError(
                f"{self.directory / str(step)} was written by a different model (config changes {changed}; "
                f"parameters {diffs[:3]}{' ...' if len(diffs) > 3 else ''}); use another --workdir to start a new run")

    def _check_base(self, step: int, meta: dict[str, Any], base: dict[str, Any] | None) -> None:
        stored = meta.get("base")
        if (stored or {}).get("fingerprint") == (base or {}).get("fingerprint"):
            return
        where = self.directory / str(step)
        if stored is None:
            raise CheckpointError(f"{where} was trained from a random initialisation, but this run starts from "
                                  f"{base['path']}; use another --workdir")
        if base is None:
            raise CheckpointError(f"{where} was trained from {stored['path']} ({stored['fingerprint']}), but this "
                                  "run has no init_from; set init_from to that base or use another --workdir")
        raise CheckpointError(f"{where} was trained on other base weights: {stored['path']} "
                              f"({stored['fingerprint']}), but init_from={base['path']} is {base['fingerprint']}; "
                              "resume with the same base, or use another --workdir")

    def _data_position(self, step: int, meta: dict[str, Any], data: dict[str, Any] | None) -> int:
        if data is not None and isinstance(meta.get("data"), dict):
            stored = meta["data"]
            changed = {k: (stored[k], data[k]) for k in DATA_POSITION_FIELDS
                       if k in stored and k in data and _plain(stored[k]) != _plain(data[k])}
            if changed:
                raise CheckpointError(
                    f"the data pipeline of {self.directory / str(step)} differs from this run's (checkpoint vs now: "
                    f"{changed}); restore the data settings (batch_size, seq_len, data.*) or use another --workdir")
        position = meta.get("data_position")
        if position is None:  # the earlier layout kept Grain iterator state; its loop stood at the step
            log.info("checkpoint at step %d has no data_position (an earlier layout): the data resumes at batch %d",
                     step, step)
            return int(step)
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"meta of step {step} holds data_position={position!r}; expected an int >= 0")
        return position

    def _read_state(self, step: int, target: Any) -> Any:
        handler = ocp.StandardCheckpointHandler()
        try:
            state = handler.restore(self.directory / str(step) / "state", args=ocp.args.StandardRestore(target))
        finally:
            handler.close()
        for leaf in jax.tree.leaves(state):
            if not np.issubdtype(leaf.dtype, np.floating):
                continue
            # A restored array that is not finite can only come from damaged bytes: saves are refused for NaNs.
            # Checked on this process's shards only: a check over the global array would be a collective, which a
            # process whose read failed never joins.
            if not all(np.isfinite(np.asarray(shard.data)).all() for shard in leaf.addressable_shards):
                raise _NotFinite(f"step {step} holds non-finite values")
        return state

    def _quarantine(self, step: int) -> None:
        """Process 0 moves step ``step`` to ``damaged_checkpoints/``; every process waits for it at one barrier."""
        source = self.directory / str(step)
        if jax.process_index() == 0 and source.exists():
            self.damaged_directory.mkdir(parents=True, exist_ok=True)
            destination = self.damaged_directory / str(step)
            if destination.exists():
                destination = self.damaged_directory / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
            source.rename(destination)
        multihost.barrier(f"flaxzoo_quarantine_{step}")
        self.manager.reload()


def _plain(value: Any) -> Any:
    """JSON's view of a value (tuples are lists there)."""
    return list(value) if isinstance(value, tuple) else value


def read_meta(workdir: str | os.PathLike, step: int | None = None) -> tuple[int, dict[str, Any]]:
    """``(step, meta)`` of the checkpoint ``step`` (default: the latest) in ``workdir``."""
    directory = resolve_workdir(workdir) / "checkpoints"
    with ocp.CheckpointManager(directory, item_handlers=_item_handlers(),
                               options=ocp.CheckpointManagerOptions(create=False, read_only=True)) as manager:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {directory}")
        meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    return step, meta


def load_params(workdir: str | os.PathLike, step: int | None = None):
    """``(model, step)``: the model of a training checkpoint (default: the latest), on the default device.

    The reading itself is ``from_pretrained``'s (``flaxzoo.models.io.sources.WorkdirSource``), pointed at one step.
    """
    from flaxzoo.models.io import from_pretrained

    step, _ = read_meta(workdir, step)
    return from_pretrained(resolve_workdir(workdir) / "checkpoints" / str(step)), step
