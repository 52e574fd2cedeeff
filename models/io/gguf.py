"""GGUF files (llama.cpp): metadata and dequantised tensors.

A GGUF file holds key/value metadata (architecture, sizes, the tokenizer) and tensors under llama.cpp's names
(``token_embd.weight``, ``blk.0.attn_q.weight`` ...), most of them quantised in blocks. This module parses the header
and metadata itself (``read_header``: fast on the tokenizer's large arrays) and dequantises with the ``gguf`` package
(``pip install gguf``: its block formats and ``gguf.dequantize``); which family reads a file is its ``general.architecture``
(``flaxzoo.models.families.gguf_family``), and that family's ``GGUFSpec`` gives the config it describes and its tensor
names (Llama: ``models/families/llama/gguf.py``), so a GGUF loads through the same table-driven path as a Hugging
Face directory.
It stays outside ``models/io/`` because ``load_tokenizer`` reads GGUF tokenizers with it too.

Two facts about Llama GGUFs matter for the numbers:

* Tensor shapes are stored fastest-axis first (``[in, out]`` for a projection). Dequantised and reshaped to the
  reversed shape, a projection is ``[out, in]``, the torch ``nn.Linear`` layout, so Hugging Face's transforms apply.
* llama.cpp's converter permutes the rows of Q and K so that RoPE rotates the interleaved pairs ``(2i, 2i + 1)``
  instead of Hugging Face's ``(i, i + head_dim/2)``. flaxzoo keeps the rows as they are and sets
  ``rope_layout="interleaved"``: the same scores, no permutation on load (``save_pretrained`` permutes on the way out).
"""

from __future__ import annotations

import dataclasses
import pathlib
import struct
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
    """One GGUF file: its metadata (key → Python value) and its tensors (``lazy_tensors()``: name → ``GGUFTensor``).

    The header, metadata and tensor table are parsed here (``read_header``): a tokenizer's arrays of ~50,000 strings
    in a few tens of milliseconds, where ``gguf.GGUFReader`` takes seconds building a numpy view per element. The
    tensor bytes stay memory-mapped; ``gguf.dequantize`` turns them into floats one tensor at a time.
    """

    def __init__(self, path: str | pathlib.Path):
        self.path = pathlib.Path(path).expanduser()
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path} does not exist")
        if not is_gguf(self.path):
            raise ValueError(f"{self.path} is not a GGUF file (it does not start with the bytes {MAGIC!r})")
        self.data = np.memmap(self.path, mode="r")  # the file's bytes, mapped
        try:
            self._fields, self._tensors = read_header(self.data)
        except (ValueError, struct.error, UnicodeDecodeError) as exc:
            raise ValueError(f"{self.path}: cannot read the GGUF file: {exc}") from exc

    # ---------------------------------------------------------------------------------------------------- metadata
    def __contains__(self, key: str) -> bool:
        return key in self._fields

    def get(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key`` (str, int, float, bool or a list of them), or ``default``."""
        return self._fields.get(key, default)

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
        return [t.name for t in self._tensors]

    @property
    def tensor_types(self) -> dict[str, str]:
        """``{name: ggml type name}``, e.g. ``{"blk.0.attn_q.weight": "Q4_1", ...}``."""
        return {t.name: t.kind.name for t in self._tensors}

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

            bar = tqdm(total=len(self._tensors), desc=f"dequantising {self.path.name}", unit="tensor")
        return {t.name: GGUFTensor(self, t, bar) for t in self._tensors}


class GGUFTensor:
    """One tensor of a GGUF file, dequantised to float32 (``[out, in]`` for a projection) on each ``np.asarray``."""

    def __init__(self, file: GGUFFile, tensor: Any, bar: Any = None):
        self.file, self._tensor, self._bar = file, tensor, bar
        self.name = tensor.name
        self.shape = tuple(reversed(tensor.dims))
        self.dtype = np.dtype(np.float32)

    def __repr__(self) -> str:
        return f"GGUFTensor({self.name!r}, shape={self.shape}, {self._tensor.kind.name})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        try:
            data = self._tensor.stored(self.file.data)
            values = _dequantize(_gguf_module(), data, self._tensor.kind).reshape(self.shape)
        except NotImplementedError as exc:
            raise ValueError(f"{self.file.path}: tensor {self.name} has the unsupported GGUF type "
                             f"{self._tensor.kind.name}: {exc}") from exc
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


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One entry of a GGUF tensor table: ``dims`` fastest axis first (GGUF's order), ``offset`` in bytes from the
    start of the file."""

    name: str
    dims: tuple[int, ...]
    kind: Any  # gguf.GGMLQuantizationType
    offset: int
    nbytes: int

    def stored(self, data: np.ndarray) -> np.ndarray:
        """The tensor's bytes in ``data`` (the file's ``uint8`` memory map), as ``gguf.dequantize`` takes them: plain
        floats / integers as their own dtype ``[..., dims[0]]``, block formats as ``uint8 [..., bytes per row]``."""
        raw = data[self.offset:self.offset + self.nbytes]
        shape = tuple(reversed(self.dims))
        if self.kind.name in _PLAIN_TYPES:
            return raw.view(_PLAIN_TYPES[self.kind.name]).reshape(shape)
        return raw.reshape(_gguf_module().quants.quant_shape_to_byte_shape(shape, self.kind))


# GGML storage types of one number per element (the rest are blocks of quantised values).
_PLAIN_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                "I32": np.int32, "I64": np.int64}
_SUPPORTED_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32  # GGUF's, when general.alignment is absent


def read_header(data: np.ndarray) -> tuple[dict[str, Any], list[TensorInfo]]:
    """``(metadata, tensor table)`` of a little-endian GGUF file (v2 / v3) whose bytes are ``data`` (``uint8``).

    Strings are decoded as UTF-8, arrays become lists (nested for arrays of arrays). ValueError for another
    version, a big-endian file, an unknown value or tensor type, duplicate keys or names, a file cut short.
    """
    gguf = _gguf_module()
    buffer = memoryview(data)
    value_types = gguf.GGUFValueType
    scalar_formats = {value_types.UINT8: "B", value_types.INT8: "b", value_types.UINT16: "H",
                      value_types.INT16: "h", value_types.UINT32: "I", value_types.INT32: "i",
                      value_types.FLOAT32: "f", value_types.BOOL: "?", value_types.UINT64: "Q",
                      value_types.INT64: "q", value_types.FLOAT64: "d"}
    offset = 0

    def take(fmt: str) -> Any:
        nonlocal offset
        (value,) = struct.unpack_from("<" + fmt, buffer, offset)
        offset += struct.calcsize("<" + fmt)
        return value

    def take_string() -> str:
        nonlocal offset
        length = take("Q")
        if offset + length > len(buffer):
            raise ValueError(f"a string of {length} bytes at offset {offset} runs past the end of the file")
        text = bytes(buffer[offset:offset + length]).decode("utf-8")
        offset += length
        return text

    def value_type(raw: int) -> Any:
        try:
            return value_types(raw)
        except ValueError:
            raise ValueError(f"unknown GGUF value type {raw} at offset {offset - 4}") from None

    def take_value(kind: Any) -> Any:
        nonlocal offset
        if kind == value_types.STRING:
            return take_string()
        if kind == value_types.ARRAY:
            item_kind, count = value_type(take("I")), take("Q")
            if item_kind in scalar_formats:  # one numpy read for the whole array
                dtype = np.dtype("<" + scalar_formats[item_kind])
                if offset + count * dtype.itemsize > len(buffer):
                    raise ValueError(f"an array of {count} values at offset {offset} runs past the end of the file")
                values = np.frombuffer(buffer, dtype, count, offset)
                offset += count * dtype.itemsize
                return values.tolist()
            return [take_value(item_kind) for _ in range(count)]
        return take(scalar_formats[kind])

    take("4s")  # the magic, checked by is_gguf
    version = take("I")
    if version not in _SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0:
            raise ValueError("a big-endian GGUF file; flaxzoo reads little-endian ones (llama.cpp's default)")
        raise ValueError(f"GGUF version {version}; expected one of {list(_SUPPORTED_VERSIONS)}")
    tensor_count, field_count = take("Q"), take("Q")
    fields: dict[str, Any] = {}
    for _ in range(field_count):
        key = take_string()
        if key in fields:
            raise ValueError(f"the key {key!r} is stored twice")
        fields[key] = take_value(value_type(take("I")))
    table = []
    for _ in range(tensor_count):
        name = take_string()
        dims = tuple(take("Q") for _ in range(take("I")))
        raw_kind, relative = take("I"), take("Q")
        try:
            kind = gguf.GGMLQuantizationType(raw_kind)
        except ValueError:
            raise ValueError(f"tensor {name} has the unknown GGML type {raw_kind}") from None
        table.append((name, dims, kind, relative))
    alignment = fields.get("general.alignment", _DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment={alignment!r}: expected a power of two")
    start = -(-offset // alignment) * alignment
    names = [name for name, *_ in table]
    if len(set(names)) != len(names):
        raise ValueError(f"tensor names stored twice: {sorted({n for n in names if names.count(n) > 1})}")
    tensors = []
    for name, dims, kind, relative in table:
        block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
        nbytes = int(np.prod(dims, dtype=np.int64)) * type_size // block_size
        if start + relative + nbytes > len(buffer):
            raise ValueError(f"tensor {name} ({nbytes} bytes at offset {start + relative}) runs past the end of the "
                             f"file ({len(buffer)} bytes)")
        tensors.append(TensorInfo(name, dims, kind, start + relative, nbytes))
    return fields, tensors


def tokenizer_metadata(file: GGUFFile) -> Mapping[str, Any]:
    """The ``tokenizer.ggml.*`` entries (``model``, ``pre``, ``tokens``, ``merges``, ``token_type``, special ids,
    ``add_bos_token`` ...), keys without the prefix."""
    prefix = "tokenizer.ggml."
    return {key[len(prefix):]: file.get(key) for key in file.keys() if key.startswith(prefix)}
