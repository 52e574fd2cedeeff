"""What every notebook in ``notebooks/`` shares: its mode, its devices, its work directory, the figures it reports.

A notebook calls :func:`setup` once, after its install cell::

    from flaxzoo.train.tools.notebook import figure, setup
    nb = setup("02_train_gpt")          # prints the JAX backend and devices; nb.small, nb.workdir
    figure("val_perplexity", 68.4)      # a line '[figure] val_perplexity = 68.4' docs/notebooks.md's table is checked against

``SMALL=1`` in the environment (CI sets it) asks each notebook to keep its CPU run to minutes; unset or ``0`` is the
normal run. ``FLAXZOO_NOTEBOOK_RUNS`` moves the work directories (default ``notebook_runs/`` in the current
directory). JAX picks the accelerator itself (GPU or TPU when its plugin is installed, else CPU); the compiled
programs are kept in JAX's persistent compilation cache (``$FLAXZOO_JAX_CACHE`` or ``~/.cache/flaxzoo/jax``), as
``python -m flaxzoo.train`` keeps them.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import pathlib
import shutil
import warnings

from flaxzoo.train.config import compilation_cache_path

SMALL_VALUES = {"": False, "0": False, "false": False, "no": False, "1": True, "true": True, "yes": True}
FIGURE_PREFIX = "[figure]"


def small_mode(environ: dict[str, str] | None = None) -> bool:
    """``SMALL`` from the environment: ``1`` / ``true`` / ``yes`` or ``0`` / ``false`` / ``no`` / unset."""
    value = (os.environ if environ is None else environ).get("SMALL", "")
    key = value.strip().lower()
    if key not in SMALL_VALUES:
        raise ValueError(f"SMALL={value!r}: expected 1 / true / yes (the short CPU run) or 0 / false / no / unset")
    return SMALL_VALUES[key]


@dataclasses.dataclass(frozen=True)
class NotebookSetup:
    name: str
    small: bool
    backend: str  # "cpu" / "gpu" / "tpu"
    device_count: int
    workdir: pathlib.Path  # this notebook's own folder under FLAXZOO_NOTEBOOK_RUNS

    def pick(self, small: object, normal: object) -> object:
        """``small`` in SMALL mode, else ``normal``."""
        return small if self.small else normal


def setup(name: str, *, cpu_devices: int | None = None) -> NotebookSetup:
    """Read the mode, turn on the persistent compilation cache, say which devices JAX found, make the work folder.

    ``cpu_devices=N`` runs JAX on N simulated CPU devices instead of the accelerator (the sharding notebook): it must
    come before anything starts JAX's backends, so a kernel that already ran JAX is told to restart."""
    small = small_mode()
    # tqdm.auto warns in a kernel without ipywidgets, then draws its text bar: the text bar is what we want.
    warnings.filterwarnings("ignore", message="IProgress not found")
    import jax

    try:
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError:  # a later jax moved it: then JAX itself refuses a device count set too late
        def backends_are_initialized() -> bool:
            return False

    if cpu_devices is not None:
        if not isinstance(cpu_devices, int) or isinstance(cpu_devices, bool) or cpu_devices < 1:
            raise ValueError(f"cpu_devices={cpu_devices!r}: expected a positive integer")
        if backends_are_initialized():
            if jax.default_backend() != "cpu" or jax.device_count() != cpu_devices:
                raise RuntimeError(f"JAX already started on {jax.device_count()} {jax.default_backend()} device(s); "
                                   f"restart the kernel to get {cpu_devices} simulated CPU devices")
        else:
            jax.config.update("jax_platforms", "cpu")
            jax.config.update("jax_num_cpu_devices", cpu_devices)
    jax.config.update("jax_compilation_cache_dir", compilation_cache_path(True, ""))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    backend = jax.default_backend()
    devices = jax.devices()
    workdir = pathlib.Path(os.environ.get("FLAXZOO_NOTEBOOK_RUNS", "notebook_runs")).resolve() / name
    workdir.mkdir(parents=True, exist_ok=True)
    if backend == "cpu" and cpu_devices is None and shutil.which("nvidia-smi"):
        print("note: this machine has an NVIDIA GPU but JAX runs on the CPU: pip install -U 'jax[cuda12]', then "
              "restart the kernel")
    kinds = sorted({d.device_kind for d in devices})
    print(f"{name}: {'SMALL' if small else 'normal'} mode; JAX {jax.__version__} on {backend} "
          f"({len(devices)} x {', '.join(kinds)}); work folder {workdir}")
    return NotebookSetup(name, small, backend, len(devices), workdir)


def format_figure(value: object) -> str:
    """Integers whole, other numbers to 4 significant digits, strings quoted (``' Paris.'``: spaces show)."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        raise ValueError(f"figure value {value!r}: expected a number or a string")
    if isinstance(value, numbers.Integral):
        return str(int(value))
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"figure value {value}: expected a finite number")
    return f"{value:.4g}"


def figure(name: str, value: object) -> None:
    """Print one reported figure as ``[figure] NAME = VALUE``.

    docs/notebooks.md's table lists these; ``tests/test_notebooks.py`` checks that a SMALL-mode run prints the
    same values (within the digits the table gives)."""
    if not name or any(c.isspace() for c in name) or "=" in name:
        raise ValueError(f"figure name {name!r}: expected one word without '='")
    print(f"{FIGURE_PREFIX} {name} = {format_figure(value)}")
