"""flaxzoo training checkpoints: the orbax format, read and written (a leaf: loading policy lives in
``flaxzoo.models.io``).

``python -m flaxzoo.train`` keeps an orbax ``CheckpointManager`` rooted at ``WORKDIR/checkpoints``; each step directory holds
the items

* ``state``: a ``StandardSave`` of a dict whose ``"params"`` is ``nnx.to_pure_dict(nnx.state(model, nnx.Param))`` (plus
  the optimizer state, step, RNG ... which only training reads),
* ``meta``: a ``JsonSave`` of ``{"format": "flaxzoo", "version": 1, "model_class": ..., "config":
  TransformerConfig.to_dict(), "train_config": {...}, "data_position": ...}`` (the data position: training only;
  checkpoints of earlier releases also hold a ``data`` item of Grain iterator state, which nothing here reads).

``read_meta`` reads ``meta``; ``param_metadata`` / ``restore_params`` read only ``params`` out of ``state`` (a partial
restore: the optimizer state is never opened), onto one local device whatever mesh wrote them, in the layout that
wrote them (per layer, or stacked ``[num_layers, ...]`` with ``scan_layers``). ``save_checkpoint`` writes the same
layout with ``state`` holding ``params`` only, at step 0: what ``flaxzoo convert ... --to flaxzoo``
produces. Building a model from a checkpoint (another class, layout, dtype, vocabulary padding; a LoRA run's merge)
is ``flaxzoo.models.io.sources.WorkdirSource`` through ``from_pretrained``.

Every path is made absolute first (``~`` expanded): orbax's metadata lookup finds nothing under a relative path.
"""

from __future__ import annotations

import contextlib
import pathlib
from typing import Any, Mapping

import jax
import numpy as np
from etils import epath
from flax import nnx

from flaxzoo.models.families import model_classes

__all__ = ["FORMAT", "VERSION", "checkpoint_meta", "find_step_dir", "param_metadata", "quiet_orbax", "read_meta",
           "restore_params", "save_checkpoint"]

FORMAT = "flaxzoo"
VERSION = 1
CHECKPOINT_DIR = "checkpoints"  # under the work directory
STATE, META, DATA = "state", "meta", "data"  # the orbax items of one step

ParamPath = tuple[Any, ...]


def _steps(root: pathlib.Path) -> list[int]:
    """Finished steps under a CheckpointManager root (orbax writes a step under a temporary name, then renames)."""
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / META).is_dir())


def local_path(path: str | pathlib.Path) -> pathlib.Path:
    """``path`` absolute with ``~`` expanded; an object-store URI (``gs://...``) as an ``etils.epath`` path."""
    return epath.Path(path) if "://" in str(path) else pathlib.Path(path).expanduser().absolute()


def find_step_dir(path: str | pathlib.Path) -> pathlib.Path | None:
    """The step directory to load from ``path``: ``path`` itself when it is one, else the latest step of
    ``path/checkpoints`` (a work directory) or of ``path`` (a CheckpointManager root); None when there is none.
    ``path`` may be an object-store URI (``gs://...``: read through ``etils.epath``, as orbax does)."""
    path = local_path(path)
    if (path / META).is_dir() and (path / STATE).is_dir():
        return path
    for root in (path / CHECKPOINT_DIR, path):
        steps = _steps(root)
        if steps:
            return root / str(steps[-1])
    return None


def _ocp():
    import orbax.checkpoint as ocp  # imported on use: orbax is heavy

    return ocp


@contextlib.contextmanager
def quiet_orbax():
    """Silence orbax's absl warnings about reading one item directly (no manager-level metadata file there)."""
    from absl import logging as absl_logging

    level = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)
    try:
        yield
    finally:
        absl_logging.set_verbosity(level)


def read_meta(step_dir: pathlib.Path) -> dict[str, Any]:
    """The ``meta`` item of a step, checked to be a flaxzoo checkpoint of a version this code reads."""
    ocp = _ocp()
    step_dir = local_path(step_dir)
    with quiet_orbax(), ocp.Checkpointer(ocp.JsonCheckpointHandler()) as checkpointer:
        meta = checkpointer.restore(step_dir / META, args=ocp.args.JsonRestore())
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"{step_dir / META} is not flaxzoo checkpoint metadata (format={found!r}, expected "
                         f"{FORMAT!r})")
    if int(meta.get("version", 0)) > VERSION:
        raise ValueError(f"{step_dir}: flaxzoo checkpoint version {meta['version']} is newer than this code reads "
                         f"({VERSION}); upgrade flaxzoo")
    for key in ("model_class", "config"):
        if key not in meta:
            raise ValueError(f"{step_dir / META} lacks {key!r}")
    if meta["model_class"] not in model_classes():
        raise ValueError(f"{step_dir}: unknown model_class {meta['model_class']!r}; expected one of "
                         f"{sorted(model_classes())}")
    return meta


def checkpoint_meta(model: nnx.Module, train_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``meta`` item describing ``model`` (the training code adds its own ``train_config``)."""
    return {"format": FORMAT, "version": VERSION, "model_class": type(model).__name__,
            "config": model.config.to_dict(), "train_config": dict(train_config or {})}


def param_metadata(step_dir: str | pathlib.Path) -> dict[ParamPath, Any]:
    """``{path: metadata (.shape, .dtype)}`` of the stored parameters (in the layout that wrote them), read from the
    ``state`` item's metadata; no array is read."""
    ocp = _ocp()
    step_dir = local_path(step_dir)
    with quiet_orbax(), ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as checkpointer:
        tree = checkpointer.metadata(step_dir / STATE)
    tree = getattr(tree, "item_metadata", tree)
    tree = getattr(tree, "tree", tree)
    if not isinstance(tree, Mapping) or "params" not in tree:
        raise ValueError(f"{step_dir / STATE} holds no 'params' entry")
    flat = jax.tree_util.tree_flatten_with_path(tree["params"], is_leaf=lambda x: hasattr(x, "shape"))[0]
    return {tuple(_key(k) for k in path): leaf for path, leaf in flat}


def _key(entry: Any) -> Any:
    key = getattr(entry, "key", getattr(entry, "idx", getattr(entry, "name", entry)))
    return int(key) if isinstance(key, str) and key.isdigit() else key


def restore_params(step_dir: str | pathlib.Path, stored: Mapping[ParamPath, Any] | None = None
                   ) -> dict[ParamPath, jax.Array]:
    """The stored parameters ``{path: array}`` in the layout and dtype that wrote them, on one local device whatever
    mesh wrote them. ``stored``: their ``param_metadata`` when the caller has it."""
    ocp = _ocp()
    step_dir = local_path(step_dir)
    stored = param_metadata(step_dir) if stored is None else stored
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target: dict[Any, Any] = {}
    for p, leaf in stored.items():
        node = target
        for k in p[:-1]:
            node = node.setdefault(k, {})
        node[p[-1]] = jax.ShapeDtypeStruct(tuple(leaf.shape), np.dtype(leaf.dtype), sharding=device)
    item = {"params": target}
    with quiet_orbax(), ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as checkpointer:
        restored = checkpointer.restore(step_dir / STATE, args=ocp.args.PyTreeRestore(
            item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True))
    return {tuple(_key(k) for k in p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(restored["params"])[0]}


def save_checkpoint(model: nnx.Module, workdir: str | pathlib.Path, *, step: int = 0,
                    train_config: Mapping[str, Any] | None = None) -> pathlib.Path:
    """Write ``model`` as a flaxzoo checkpoint under ``workdir/checkpoints/<step>`` (items ``state`` with ``params``
    only, and ``meta``); returns the step directory. Refuses a step that already exists."""
    ocp = _ocp()
    root = pathlib.Path(workdir).expanduser().absolute() / CHECKPOINT_DIR
    if (root / str(step)).exists():
        raise FileExistsError(f"{root / str(step)} already exists; choose another directory")
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    with ocp.CheckpointManager(root) as manager:
        manager.save(step, args=ocp.args.Composite(**{
            STATE: ocp.args.StandardSave({"params": params}),
            META: ocp.args.JsonSave(checkpoint_meta(model, train_config))}))
        manager.wait_until_finished()
    return root / str(step)
