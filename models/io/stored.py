"""Stored tensors read a box at a time: the tensors of a Hugging Face directory's safetensors files (single or
sharded with an index), each read through ``safe_open(file, "np").get_slice(name)[...]``, and the :class:`Read`
record every read reports to a loader's ``on_read`` hook.

safetensors' numpy API has no bfloat16 nor float8 (``flaxzoo.models.io.files.read_safetensors`` says the same): a box
of such a tensor is read from a read-only ``np.memmap`` of the tensor's bytes (offsets from the file's header),
viewed as the ``ml_dtypes`` type, which touches only the pages the box lies on.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any, Callable, NamedTuple

import numpy as np
from safetensors import safe_open

__all__ = ["Read", "SafetensorsFiles", "StoredTensor"]

_ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


class Read(NamedTuple):
    """One read of a stored tensor: its name (the loader's naming), the box read (one slice per stored axis), how
    many elements that is, and ``exact``: False when the whole tensor was read because the shard's part of it could
    not be told (a transform that is not a rearrangement of axes, a GGUF tensor, a pickle)."""

    tensor: str
    index: tuple[slice, ...]
    elements: int
    exact: bool


OnRead = Callable[[Read], None]


class StoredTensor:
    """One tensor of a safetensors file: ``shape`` and ``dtype`` now, values a box at a time (:meth:`read`), or whole
    through ``np.asarray``."""

    def __init__(self, files: "SafetensorsFiles", file: pathlib.Path, key: str, name: str, info: dict[str, Any]):
        self.files, self.file, self.key, self.name = files, file, key, name
        self.shape = tuple(int(d) for d in info["shape"])
        self.stored_dtype = info["dtype"]
        self.offsets = tuple(info["data_offsets"])

    def __repr__(self) -> str:
        return f"StoredTensor({self.name!r}, shape={self.shape}, {self.stored_dtype}, {self.file.name})"

    def read(self, index: tuple[slice, ...], exact: bool = True) -> np.ndarray:
        """``tensor[index]`` (one unit-step slice per axis), reported to the files' ``on_read``."""
        if self.stored_dtype in _ML_DTYPES:
            import ml_dtypes  # a JAX dependency

            dtype = np.dtype(getattr(ml_dtypes, _ML_DTYPES[self.stored_dtype]))
            begin = self.files.data_start(self.file) + self.offsets[0]
            data = np.memmap(self.file, dtype=dtype, mode="r", offset=begin, shape=self.shape)
            value = np.array(data[index])
            del data
        else:
            value = self.files.handle(self.file).get_slice(self.key)[index]
            value = np.asarray(value).reshape([len(range(*s.indices(d))) for s, d in zip(index, self.shape)])
        if self.files.on_read is not None:
            self.files.on_read(Read(self.name, tuple(index), int(math.prod(value.shape)), exact))
        return value

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        value = self.read(tuple(slice(0, d) for d in self.shape), exact=False)
        return value if dtype is None else value.astype(dtype)


class SafetensorsFiles:
    """The safetensors files of one checkpoint, opened on demand. :meth:`release` closes them (their memory maps go,
    and with them the pages they brought in): a loader calls it after each parameter, so that the mapped pages of the
    whole checkpoint never count against the process at once."""

    def __init__(self, files: list[pathlib.Path], rename: Callable[[str], str] | None = None,
                 on_read: OnRead | None = None):
        self.paths, self.on_read = list(files), on_read
        self._handles: dict[pathlib.Path, Any] = {}
        self._data_start: dict[pathlib.Path, int] = {}
        self.tensors: dict[str, StoredTensor] = {}
        for file in self.paths:
            with open(file, "rb") as raw:
                size = int.from_bytes(raw.read(8), "little")
                header = json.loads(raw.read(size))
            self._data_start[file] = 8 + size
            for key, info in header.items():
                if key == "__metadata__":
                    continue
                name = rename(key) if rename is not None else key
                self.tensors[name] = StoredTensor(self, file, key, name, info)

    def data_start(self, file: pathlib.Path) -> int:
        """The byte offset of ``file``'s first tensor (after its header)."""
        return self._data_start[file]

    def handle(self, file: pathlib.Path) -> Any:
        """``safe_open(file, "np")``, opened once until :meth:`release`."""
        if file not in self._handles:
            self._handles[file] = safe_open(file, framework="np")
        return self._handles[file]

    def release(self) -> None:
        """Close every open file."""
        handles, self._handles = self._handles, {}
        for h in handles.values():
            exit_ = getattr(h, "__exit__", None)
            if exit_ is not None:
                exit_(None, None, None)
