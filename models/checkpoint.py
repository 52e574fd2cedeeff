"""flaxzoo training checkpoints, read as models (and written, for conversions).

``python -m train`` keeps an orbax ``CheckpointManager`` rooted at ``WORKDIR/checkpoints``; each step directory holds
the items

* ``state``: a ``StandardSave`` of a dict whose ``"params"`` is ``nnx.state(model, nnx.Param).to_pure_dict()`` (plus
  the optimizer state, step, RNG ... which only training reads),
* ``meta``: a ``JsonSave`` of ``{"format": "flaxzoo", "version": 1, "model_class": ..., "config":
  TransformerConfig.to_dict(), "train_config": {...}}``,
* ``data``: the Grain iterator state (training only).

Loading a model reads ``meta`` and only ``params`` out of ``state`` (a partial restore: the optimizer state and the
data item are never opened), onto the local devices whatever mesh wrote them. ``save_checkpoint`` writes the same
layout with ``state`` holding ``params`` only, at step 0: what ``python -m models.convert ... --to flaxzoo`` produces.
"""

from __future__ import annotations

import contextlib
import pathlib
from typing import Any, Mapping

import jax
import numpy as np
from flax import nnx

from models.config import TransformerConfig
from models.modeling import MODEL_CLASSES

__all__ = ["FORMAT", "VERSION", "checkpoint_meta", "find_step_dir", "load_checkpoint", "read_meta", "save_checkpoint"]

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


def find_step_dir(path: str | pathlib.Path) -> pathlib.Path | None:
    """The step directory to load from ``path``: ``path`` itself when it is one, else the latest step of
    ``path/checkpoints`` (a work directory) or of ``path`` (a CheckpointManager root); None when there is none."""
    path = pathlib.Path(path)
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
def _quiet():
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
    with _quiet(), ocp.Checkpointer(ocp.JsonCheckpointHandler()) as checkpointer:
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
    if meta["model_class"] not in MODEL_CLASSES:
        raise ValueError(f"{step_dir}: unknown model_class {meta['model_class']!r}; expected one of "
                         f"{sorted(MODEL_CLASSES)}")
    return meta


def checkpoint_meta(model: nnx.Module, train_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``meta`` item describing ``model`` (the training code adds its own ``train_config``)."""
    return {"format": FORMAT, "version": VERSION, "model_class": type(model).__name__,
            "config": model.config.to_dict(), "train_config": dict(train_config or {})}


def _stored_params(step_dir: pathlib.Path) -> dict[ParamPath, Any]:
    """``{path: metadata (shape, dtype)}`` of the stored parameters, read from the ``state`` item's metadata."""
    ocp = _ocp()
    with _quiet(), ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as checkpointer:
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


def load_checkpoint(path: str | pathlib.Path, *, cls: type | str | None = None, dtype: Any = None) -> nnx.Module:
    """The model of a flaxzoo training checkpoint (latest step), in eval mode; only its parameters are read.

    ``cls`` may name the stored class (a check); ``dtype`` overrides the stored config's dtypes.
    """
    from models.hub import _names, _with_dtype, assemble_model, bert_without_pooler

    ocp = _ocp()
    step_dir = find_step_dir(path)
    if step_dir is None:
        raise ValueError(f"{path} holds no flaxzoo checkpoint step (expected checkpoints/<step>/{{state,meta}})")
    meta = read_meta(step_dir)
    model_cls = MODEL_CLASSES[meta["model_class"]]
    if cls is not None and (cls if isinstance(cls, str) else getattr(cls, "__name__", cls)) != model_cls.__name__:
        raise ValueError(f"{step_dir} holds a {model_cls.__name__}; cls={cls!r} does not match (flaxzoo checkpoints "
                         "load as the class that was trained)")
    config = _with_dtype(TransformerConfig.from_dict(meta["config"]), dtype)
    stored = _stored_params(step_dir)
    factory = model_cls
    if model_cls.__name__ == "BertModel" and not any(p[0] == "pooler" for p in stored):
        factory = bert_without_pooler
    expected = {path: var.get_value() for path, var in
                nnx.to_flat_state(nnx.state(nnx.eval_shape(lambda: factory(config, rngs=nnx.Rngs(0))), nnx.Param))}
    dotted = lambda paths: _names([".".join(map(str, p)) for p in paths])  # noqa: E731
    missing, unexpected = set(expected) - set(stored), set(stored) - set(expected)
    problems = ([f"missing parameters: {dotted(missing)}"] if missing else []) + \
               ([f"unexpected parameters: {dotted(unexpected)}"] if unexpected else [])
    problems += [f"{'.'.join(map(str, p))}: expected shape {tuple(expected[p].shape)}, found {tuple(stored[p].shape)}"
                 for p in sorted(set(expected) & set(stored), key=str)
                 if tuple(stored[p].shape) != tuple(expected[p].shape)]
    if problems:
        raise ValueError(f"{step_dir}: the checkpoint does not match its {model_cls.__name__} config; "
                         + "; ".join(problems))

    # Restore onto one local device whatever mesh wrote the arrays, in the stored dtype (cast when assembling).
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target: dict[Any, Any] = {}
    for p, leaf in stored.items():
        node = target
        for k in p[:-1]:
            node = node.setdefault(k, {})
        node[p[-1]] = jax.ShapeDtypeStruct(tuple(leaf.shape), np.dtype(leaf.dtype), sharding=device)
    item = {"params": target}
    with _quiet(), ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as checkpointer:
        restored = checkpointer.restore(step_dir / STATE, args=ocp.args.PyTreeRestore(
            item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True))
    values = {tuple(_key(k) for k in path): leaf
              for path, leaf in jax.tree_util.tree_flatten_with_path(restored["params"])[0]}
    return assemble_model(config, factory, values)


def save_checkpoint(model: nnx.Module, workdir: str | pathlib.Path, *, step: int = 0,
                    train_config: Mapping[str, Any] | None = None) -> pathlib.Path:
    """Write ``model`` as a flaxzoo checkpoint under ``workdir/checkpoints/<step>`` (items ``state`` with ``params``
    only, and ``meta``); returns the step directory. Refuses a step that already exists."""
    ocp = _ocp()
    root = pathlib.Path(workdir).expanduser().absolute() / CHECKPOINT_DIR
    if (root / str(step)).exists():
        raise FileExistsError(f"{root / str(step)} already exists; choose another directory")
    params = nnx.state(model, nnx.Param).to_pure_dict()
    with ocp.CheckpointManager(root) as manager:
        manager.save(step, args=ocp.args.Composite(**{
            STATE: ocp.args.StandardSave({"params": params}),
            META: ocp.args.JsonSave(checkpoint_meta(model, train_config))}))
        manager.wait_until_finished()
    return root / str(step)
