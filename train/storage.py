"""Where a run may read and write: local paths everywhere; object-store URIs (``gs://``, ``s3://``) where the code
behind a key reads them through ``etils.epath`` and their client library is installed.

=========================  ======================================================================================
key                        object stores
=========================  ======================================================================================
``--workdir``              yes: checkpoints (orbax), ``metrics.jsonl``, TensorBoard events, the tokenizer
``compilation_cache_dir``  yes: JAX's persistent compilation cache reads and writes through ``epath``
``data.data_dir``          no: TFDS preparation, file locks and the tokenizer cache use local files (a mounted
                           bucket, e.g. GCS FUSE, is a local path)
``init_from``              no: safetensors and GGUF are memory-mapped from local files (copy the checkpoint first)
=========================  ======================================================================================

:func:`check_paths` refuses what cannot work with one :class:`~flaxzoo.train.config.ConfigError` naming the key,
before any data work: an unknown scheme, an object store behind a key that reads local files, a missing client
library (``gcsfs`` for ``gs://``, ``s3fs`` for ``s3://``, as ``epath`` asks), an ``init_from`` that names no
local path, packaged model or Hub id (:func:`check_init_from`).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from flaxzoo.train.config import ConfigError

CLIENTS = {"gs": "gcsfs", "s3": "s3fs"}  # the fsspec package epath needs for each scheme (or TensorFlow's gfile)
REMOTE_OK = ("workdir", "compilation_cache_dir")


def is_uri(path: Any) -> bool:
    """Whether ``path`` names an object store (``scheme://...``) rather than a local file."""
    return "://" in os.fspath(path)


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_path(value: Any, key: str) -> None:
    """Raise :class:`ConfigError` on ``key`` when ``value`` is a URI this run cannot use (see the module table)."""
    if not value or not is_uri(value):
        return
    text = os.fspath(value)
    scheme = text.split("://", 1)[0]
    if scheme not in CLIENTS:
        raise ConfigError(key, f"{text!r}: no storage of scheme {scheme}://; expected a local path, gs://... or "
                               "s3://...")
    if key.split(".")[-1] not in REMOTE_OK:
        raise ConfigError(key, f"{text!r}: {key} is read as local files; expected a local or mounted path (a bucket "
                               "mounted with GCS FUSE / mountpoint-s3 is one), or copy it to local disk first")
    client = CLIENTS[scheme]
    if not (installed(client) or installed("tensorflow")):
        raise ConfigError(key, f"{text!r}: {scheme}:// paths need the {client} package (pip install {client}), which "
                               "is not installed")


def check_paths(workdir: Any, *, data_dir: Any = "", init_from: Any = "", compilation_cache_dir: Any = "",
                local_workdir: bool = False) -> None:
    """:func:`check_path` for every path a run touches; ``local_workdir``: the task writes its work directory as
    local files (fine-tuning's reports), so an object store is refused there too."""
    if local_workdir and workdir and is_uri(workdir):
        raise ConfigError("workdir", f"{os.fspath(workdir)!r}: fine-tuning writes its reports (eval/) as local files; "
                                     "expected a local or mounted path")
    check_path(workdir, "workdir")
    check_path(compilation_cache_dir, "compilation_cache_dir")
    check_path(data_dir, "data.data_dir")
    check_path(init_from, "init_from")
    check_init_from(init_from)


def check_init_from(value: Any) -> None:
    """Raise :class:`ConfigError` on ``init_from`` when it names nothing: no local path, packaged model or Hub id
    (``org/name``). ``""`` and fine-tuning's ``"scratch"`` name no source; a Hub id is not fetched here."""
    from flaxzoo.models.io.files import is_hub_repo, missing_source_error
    from flaxzoo.models.io.packaged import PACKAGED

    if not value or is_uri(value):
        return
    text = os.fspath(value)
    if text == "scratch" or text.lower() in PACKAGED or os.path.exists(os.path.expanduser(text)) or is_hub_repo(text):
        return
    raise ConfigError("init_from", str(missing_source_error(text)))


__all__ = ["CLIENTS", "check_init_from", "check_path", "check_paths", "installed", "is_uri"]
