"""GGUF files (llama.cpp): metadata and dequantised tensors.

A GGUF file holds key/value metadata (architecture, sizes, the tokenizer) and tensors under llama.cpp's names
(``token_embd.weight``, ``blk.0.attn_q.weight`` ...), most of them quantised in blocks. This module reads both with
the ``gguf`` package (``pip install gguf``); which family reads a file is its ``general.architecture``
(``flaxzoo.models.families.gguf_family``), and that family's ``GGUFSpec`` gives the config it describes and its tensor
names (Llama: ``models/families/llama/gguf.py``), so a GGUF loads through the same table-driven path as a Hugging
Face directory.
It stays outside ``models/hub/`` because ``load_tokenizer`` reads GGUF tokenizers with it too.

Two facts about Llama GGUFs matter for the numbers:

* Tensor shapes are stored fastest-axis first (``[in, out]`` for a projection). Dequantised and reshaped to the
  reversed shape, a projection is ``[out, in]``, the torch ``nn.Linear`` layout, so Hugging Face's transforms apply.
* llama.cpp's converter permutes the rows of Q and K so that RoPE rotates the interleaved pairs ``(2i, 2i + 1)``
  instead of Hugging Face's ``(i, i + head_dim/2)``. flaxzoo keeps the rows as they are and sets
  ``rope_layout="interleaved"``: the same scores, no permutation on load (``save_pretrained`` permutes on the way out).
"""

from __future__ import annotations

import pathlib
from typing import Any, Mapping

import numpy as np

__all__ = ["GGUFFile", "GGUFTensor", "is_gguf"]

MAGIC = b"GGUF"


def _gguf_module():
    try:
        import gguf
    except ImportError as exc:  # an optional dependency: only GGUF files need it
        raise ImportError("reading a GGUF file needs the gguf package: pip install gguf "
                          "(or pip install 'flaxzoo[gguf]')") from exc
    return gguf


def is_gguf(path: pathlib.Path) -> bool:
    """True when ``path`` is a file that starts with the GGUF magic bytes."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == MAGIC


class GGUFFile:
    """One GGUF file: ``metadata`` (key → Python value) and ``tensors()`` (name → dequantised float32 array).

    Large arrays in the metadata (the tokenizer's tokens and merges) are decoded on first access.
    """

    def __init__(self, path: str | pathlib.Path):
        self.path = pathlib.Path(path).expanduser()
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path} does not exist")
        if not is_gguf(self.path):
            raise ValueError(f"{self.path} is not a GGUF file (it does not start with the bytes {MAGIC!r})")
        gguf = _gguf_module()
        try:
            self._reader = gguf.GGUFReader(self.path)
        except Exception as exc:  # the reader raises ValueError / struct errors on damaged files
            raise ValueError(f"{self.path}: cannot read the GGUF file: {exc}") from exc
        self._fields = self._reader.fields
        self._cache: dict[str, Any] = {}

    # ---------------------------------------------------------------------------------------------------- metadata
    def __contains__(self, key: str) -> bool:
        return key in self._fields

    def get(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key`` (str, int, float, bool or a list of them), or ``default``."""
        if key not in self._fields:
            return default
        if key not in self._cache:
            self._cache[key] = self._fields[key].contents()
        return self._cache[key]

    def keys(self) -> list[str]:
        return list(self._fields)

    @property
    def architecture(self) -> str:
        return str(self.get("general.architecture", "unknown"))

    def arch(self, key: str, default: Any = None) -> Any:
        """``{architecture}.{key}``, e.g. ``arch("block_count")`` → ``llama.block_count``."""
        return self.get(f"{self.architecture}.{key}", default)

    # ----------------------------------------------------------------------------------------------------- tensors
    @property
    def tensor_names(self) -> list[str]:
        return [t.name for t in self._reader.tensors]

    @property
    def tensor_types(self) -> dict[str, str]:
        """``{name: ggml type name}``, e.g. ``{"blk.0.attn_q.weight": "Q4_1", ...}``."""
        return {t.name: t.tensor_type.name for t in self._reader.tensors}

    def check_tensor_types(self) -> None:
        """ValueError naming every tensor whose storage type this reader cannot turn into floats."""
        bad = {name: kind for name, kind in self.tensor_types.items() if not _can_dequantize(kind)}
        if bad:
            listed = ", ".join(f"{name} ({kind})" for name, kind in sorted(bad.items())[:10])
            more = f", ... ({len(bad) - 10} more)" if len(bad) > 10 else ""
            raise ValueError(f"{self.path}: unsupported GGUF tensor type(s): {listed}{more}; flaxzoo dequantises "
                             f"{', '.join(supported_tensor_types())}")

    def lazy_tensors(self, *, progress: bool = False) -> dict[str, "GGUFTensor"]:
        """``{name: GGUFTensor}`` for every tensor: its shape now, its float32 values (``np.asarray(t)``, in numpy
        row-major order: a GGUF ``[in, out]`` projection comes out ``[out, in]``) only when asked, so a loader can
        hold one dequantised tensor at a time. Unsupported storage types are reported (all of them, by name) here,
        before anything is dequantised."""
        self.check_tensor_types()
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(self._reader.tensors), desc=f"dequantising {self.path.name}", unit="tensor")
        return {t.name: GGUFTensor(self, t, bar) for t in self._reader.tensors}


class GGUFTensor:
    """One tensor of a GGUF file, dequantised to float32 (``[out, in]`` for a projection) on each ``np.asarray``."""

    def __init__(self, file: GGUFFile, tensor: Any, bar: Any = None):
        self.file, self._tensor, self._bar = file, tensor, bar
        self.name = tensor.name
        self.shape = tuple(int(d) for d in reversed(tensor.shape))
        self.dtype = np.dtype(np.float32)

    def __repr__(self) -> str:
        return f"GGUFTensor({self.name!r}, shape={self.shape}, {self._tensor.tensor_type.name})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        try:
            values = _dequantize(_gguf_module(), self._tensor.data, self._tensor.tensor_type).reshape(self.shape)
        except NotImplementedError as exc:
            raise ValueError(f"{self.file.path}: tensor {self.name} has the unsupported GGUF type "
                             f"{self._tensor.tensor_type.name}: {exc}") from exc
        if self._bar is not None:
            self._bar.update(1)
        return values if dtype is None else values.astype(dtype, copy=False)


# Storage types that hold plain numbers rather than quantised blocks, read with a numpy view.
_FLOAT_VIEWS = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def _can_dequantize(kind: str) -> bool:
    return kind in supported_tensor_types()


def supported_tensor_types() -> tuple[str, ...]:
    """The GGML storage types this installation can read: plain floats plus what ``gguf.dequantize`` implements."""
    gguf = _gguf_module()
    quantized = getattr(gguf.quants, "_type_traits", {})  # the gguf package's registry of block formats
    names = set(_FLOAT_VIEWS) | {q.name for q in quantized}
    return tuple(sorted(names, key=lambda n: gguf.GGMLQuantizationType[n].value))


def _dequantize(gguf: Any, data: np.ndarray, kind: Any) -> np.ndarray:
    if kind.name in _FLOAT_VIEWS:
        return np.asarray(data.view(_FLOAT_VIEWS[kind.name]), dtype=np.float32)
    return np.asarray(gguf.dequantize(data, kind), dtype=np.float32)


def tokenizer_metadata(file: GGUFFile) -> Mapping[str, Any]:
    """The ``tokenizer.ggml.*`` entries (``model``, ``pre``, ``tokens``, ``merges``, ``token_type``, special ids,
    ``add_bos_token`` ...), keys without the prefix."""
    prefix = "tokenizer.ggml."
    return {key[len(prefix):]: file.get(key) for key in file.keys() if key.startswith(prefix)}
