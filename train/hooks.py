"""What every training task shares around its step: the stop signal (SIGTERM / SIGINT, agreed across processes),
the metrics writer (``metrics.jsonl`` and TensorBoard), the non-finite loss check's error, the compilation cache and
the lines printed by process 0. The pre-training loop (``train/pretrain.py``) and the fine-tuner
(``train/finetune/trainer.py``) run their steps with these.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from typing import Any

import jax
from etils import epath
from tqdm.auto import tqdm

from flaxzoo.train import multihost
from flaxzoo.train.checkpoint import is_remote

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """The loss or the gradient norm of a step is NaN or infinite."""

    def __init__(self, step: int, metrics: dict[str, float], last_checkpoint: int | None):
        self.step, self.metrics, self.last_checkpoint = step, metrics, last_checkpoint
        kept = (f"the last good checkpoint is step {last_checkpoint}" if last_checkpoint is not None
                else "no checkpoint was written")
        super().__init__(f"non-finite training loss at step {step} (loss={metrics.get('loss')}, grad_norm="
                         f"{metrics.get('grad_norm')}); stopping: {kept}")


def is_main() -> bool:
    return jax.process_index() == 0


def say(message: str) -> None:
    """A line on stdout from process 0, kept clear of the progress bar."""
    if is_main():
        tqdm.write(message, file=sys.stdout)
        sys.stdout.flush()


def say_everywhere(message: str) -> None:
    """A line on stdout from every process (prefixed ``process i:`` when there are several)."""
    if multihost.is_multi_process():
        message = f"process {jax.process_index()}: {message}"
    tqdm.write(message, file=sys.stdout)
    sys.stdout.flush()


def setup_compilation_cache(cfg: Any) -> str | None:
    """JAX's persistent compilation cache in ``cfg.cache_dir()`` (None: off; a local path or an object store that
    ``flaxzoo.train.storage`` accepts); returns the directory."""
    directory = cfg.cache_dir()
    if directory:
        epath.Path(directory).mkdir(parents=True, exist_ok=True)  # gs:// / s3:// too: JAX reads it through epath
        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory


def _has_module(name: str) -> bool:
    try:
        return bool(name) and importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _summary_writer_class() -> type:
    """tensorboardX's ``SummaryWriter``, imported without torch when torch is not loaded already: tensorboardX's writer
    imports torch (1.5 s of CPU) only to accept torch tensors, and the rows written here hold Python numbers."""
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX catches
    try:
        from tensorboardX import SummaryWriter
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return SummaryWriter


class MetricsWriter:
    """``metrics.jsonl`` (one JSON object per logged step) and TensorBoard events, on process 0 only.

    On resume from step ``start_step`` rows after it (written by the interrupted run past its last checkpoint) are
    dropped, and TensorBoard purges its events after it, so both show the resumed trajectory once. On an object
    store (``gs://``, ``s3://``: no appends, about one write per second per object) the whole file is rewritten at
    most every :attr:`REMOTE_FLUSH_S` seconds and at the end; TensorBoard events go through
    tensorboardX's own ``gs://`` / ``s3://`` writers where their client libraries are installed, else are skipped
    with a warning.
    """

    REMOTE_FLUSH_S = 10.0

    def __init__(self, workdir: epath.Path, start_step: int):
        self.enabled = is_main()
        self.flushed_at = time.monotonic()
        self.path = workdir / "metrics.jsonl"
        self.tb = None
        self.file = None
        self.lines: list[str] = []
        if not self.enabled:
            return
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= start_step:
                        self.lines.append(line)
                except ValueError:  # a line cut short by a killed process
                    continue
            self.path.write_text("".join(line + "\n" for line in self.lines))
        if not is_remote(self.path):
            self.file = open(self.path, "a", buffering=1)
        if is_remote(workdir) and not _has_module({"gs": "google.cloud.storage", "s3": "boto3"}.get(
                str(workdir).split("://")[0], "")):
            log.warning("no TensorBoard events in %s: tensorboardX writes gs:// with google-cloud-storage and s3:// "
                        "with boto3 installed", workdir)
            return
        self.tb = _summary_writer_class()(str(workdir / "tensorboard"), purge_step=start_step + 1 if start_step else None)

    def write(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = json.dumps(row)
        if self.file is not None:
            self.file.write(line + "\n")
        else:
            self.lines.append(line)
            if time.monotonic() - self.flushed_at >= self.REMOTE_FLUSH_S:
                self.flush()
        if self.tb is not None:
            step = row["step"]
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    group = "eval" if key.startswith("val_") else "train"
                    self.tb.add_scalar(f"{group}/{key.removeprefix('val_')}", value, step)

    def flush(self) -> None:
        """Rewrite the object-store copy of ``metrics.jsonl`` with every row so far."""
        if self.enabled and self.file is None:
            self.path.write_text("".join(item + "\n" for item in self.lines))
            self.flushed_at = time.monotonic()

    def text(self, tag: str, text: str, step: int) -> None:
        if self.enabled and self.tb is not None:
            self.tb.add_text(tag, text, step)

    def close(self) -> None:
        if not self.enabled:
            return
        if self.file is not None:
            self.file.close()
        else:
            self.flush()
        if self.tb is not None:
            self.tb.close()


class StopSignal:
    """Turns the first SIGTERM / SIGINT into a request to stop after the current step (a second one acts as
    usual: SIGINT raises KeyboardInterrupt, SIGTERM terminates).

    With several processes the stop is agreed: SIGTERM is left to JAX's preemption notifier (installed by
    ``jax.distributed.initialize``; it only records the notice, so later SIGTERMs do not end the process either), a
    SIGINT is passed on to it as a SIGTERM to this process, and :meth:`agreed` is true on every process at the same
    step (:func:`flaxzoo.train.multihost.preemption_agreed`), however many processes got a signal and when. A second
    SIGINT raises KeyboardInterrupt in that process alone; the others then end on the runtime's lost-process error.
    """

    def __init__(self) -> None:
        self.name: str | None = None
        self._previous: dict[int, Any] = {}
        self.multi_process = multihost.is_multi_process()

    def __enter__(self) -> "StopSignal":
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT,) if self.multi_process else (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        del frame
        self.name = signal.Signals(signum).name
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
        if self.multi_process:
            os.kill(os.getpid(), signal.SIGTERM)  # JAX's notifier starts the agreement

    def agreed(self, step: int) -> bool:
        """Whether to stop after ``step`` (call once per step; with several processes, on all of them)."""
        if self.multi_process:
            if multihost.preemption_agreed(step):
                self.name = self.name or "SIGTERM"
                return True
            return False
        return self.name is not None

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
