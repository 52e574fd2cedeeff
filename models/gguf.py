"""GGUF files (llama.cpp): metadata, dequantised tensors, and the model config they describe.

A GGUF file holds key/value metadata (architecture, sizes, the tokenizer) and tensors under llama.cpp's names
(``token_embd.weight``, ``blk.0.attn_q.weight`` ...), most of them quantised in blocks. This module reads both with
the ``gguf`` package (``pip install gguf``); the name table and the weight layouts live in ``models/hub/llama.py``
beside the Hugging Face Llama table, so a GGUF loads through the same table-driven path as a Hugging Face directory.
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
from typing import Any, Iterator, Mapping

import numpy as np

__all__ = ["GGUFFile", "GGUFTensor", "SUPPORTED_GGUF_ARCHITECTURES", "is_gguf"]

SUPPORTED_GGUF_ARCHITECTURES = ("llama",)
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

    def tensors(self, *, progress: bool = False) -> Iterator[tuple[str, np.ndarray]]:
        """``(name, array)`` for every tensor, dequantised to float32 in numpy (row-major) order.

        A projection stored with GGUF shape ``[in, out]`` comes out as ``[out, in]``. Unsupported storage types are
        reported (all of them, by name) before anything is dequantised.
        """
        self.check_tensor_types()
        gguf = _gguf_module()
        items = self._reader.tensors
        if progress:
            from tqdm.auto import tqdm

            items = tqdm(items, desc=f"dequantising {self.path.name}", unit="tensor")
        for t in items:
            shape = tuple(int(d) for d in reversed(t.shape))
            try:
                values = _dequantize(gguf, t.data, t.tensor_type)
            except NotImplementedError as exc:
                raise ValueError(f"{self.path}: tensor {t.name} has the unsupported GGUF type {t.tensor_type.name}: "
                                 f"{exc}") from exc
            yield t.name, values.reshape(shape)

    def lazy_tensors(self, *, progress: bool = False) -> dict[str, "GGUFTensor"]:
        """``{name: GGUFTensor}`` for every tensor: its shape now, its float32 values (``np.asarray(t)``, the array
        ``tensors()`` yields) only when asked, so a loader can hold one dequantised tensor at a time. Unsupported
        storage types are reported (all of them, by name) here, before anything is dequantised."""
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


# ----------------------------------------------------------------------------------------------------------- config

def _float(value: Any) -> float:
    """A float32 metadata value as the decimal it was written from (``9.99999975e-06`` → ``1e-05``)."""
    return float(str(np.float32(value)))


def llama_hf_config(file: GGUFFile, tensor_names: set[str] | None = None) -> dict[str, Any]:
    """The Hugging Face ``config.json`` a Llama-architecture GGUF describes (in rotate-half terms; the caller
    switches the RoPE layout).

    Raises ValueError for another architecture and for Llama features flaxzoo does not implement (RoPE scaling,
    partial rotary dimensions, mixtures of experts).
    """
    if file.architecture not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(f"{file.path}: unsupported GGUF architecture {file.architecture!r} "
                         f"(general.architecture); flaxzoo loads {list(SUPPORTED_GGUF_ARCHITECTURES)}")
    names = set(file.tensor_names) if tensor_names is None else tensor_names
    required = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")
    missing = [f"llama.{k}" for k in required if file.arch(k) is None]
    if missing:
        raise ValueError(f"{file.path}: GGUF metadata lacks {', '.join(missing)}")
    hidden, heads = int(file.arch("embedding_length")), int(file.arch("attention.head_count"))
    head_dim = int(file.arch("attention.key_length", hidden // heads))
    problems = []
    if file.arch("expert_count", 0):
        problems.append(f"llama.expert_count={file.arch('expert_count')} (mixture of experts)")
    scaling = file.arch("rope.scaling.type", "none")
    if scaling not in ("none", None) or "rope_freqs.weight" in names:
        problems.append(f"llama.rope.scaling.type={scaling!r}" if scaling not in ("none", None) else
                        "rope_freqs.weight (RoPE frequency factors)")
    rotary = file.arch("rope.dimension_count", head_dim)
    if int(rotary) != head_dim:
        problems.append(f"llama.rope.dimension_count={rotary} (partial rotary; head_dim is {head_dim})")
    if problems:
        raise ValueError(f"{file.path}: GGUF features flaxzoo does not implement: " + "; ".join(problems))
    vocab = file.arch("vocab_size")
    if vocab is None:
        tokens = file.get("tokenizer.ggml.tokens")
        vocab = len(tokens) if tokens is not None else None
    if vocab is None:
        raise ValueError(f"{file.path}: GGUF metadata has neither llama.vocab_size nor tokenizer.ggml.tokens")
    token_id = lambda key: (None if file.get(f"tokenizer.ggml.{key}") is None  # noqa: E731
                            else int(file.get(f"tokenizer.ggml.{key}")))
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": int(vocab),
        "hidden_size": hidden, "num_hidden_layers": int(file.arch("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(file.arch("attention.head_count_kv", heads)), "head_dim": head_dim,
        "intermediate_size": int(file.arch("feed_forward_length")),
        "max_position_embeddings": int(file.arch("context_length", 2048)),
        "rope_theta": _float(file.arch("rope.freq_base", 10_000.0)),
        "rms_norm_eps": _float(file.arch("attention.layer_norm_rms_epsilon", 1e-5)),
        "hidden_act": "silu", "attention_bias": "blk.0.attn_q.bias" in names,
        "mlp_bias": "blk.0.ffn_up.bias" in names, "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": token_id("bos_token_id"), "eos_token_id": token_id("eos_token_id"),
        "pad_token_id": token_id("padding_token_id"),
    }


def tokenizer_metadata(file: GGUFFile) -> Mapping[str, Any]:
    """The ``tokenizer.ggml.*`` entries (``model``, ``pre``, ``tokens``, ``merges``, ``token_type``, special ids,
    ``add_bos_token`` ...), keys without the prefix."""
    prefix = "tokenizer.ggml."
    return {key[len(prefix):]: file.get(key) for key in file.keys() if key.startswith(prefix)}
