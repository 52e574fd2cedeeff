"""sentence-transformers' pipeline settings, its poolings, and cosine similarity / search over embeddings.

A sentence-transformers folder (all-MiniLM-L6-v2, or anything ``SentenceTransformer.save`` writes) lists its modules
in ``modules.json``: a ``Transformer`` (the encoder flaxzoo loads with ``from_pretrained``), a ``Pooling`` (its
settings in ``<path>/config.json``, e.g. ``1_Pooling/config.json``), optionally ``Dense`` layers (a linear map and
an activation on the pooled vector) and ``Normalize`` (L2). The Transformer's settings are ``max_seq_length`` /
``do_lower_case`` in ``sentence_bert_config.json`` (files written by sentence-transformers < 5) or, in newer files,
the tokenizer's ``model_max_length`` in ``tokenizer_config.json`` (the lower-casing then lives in the saved tokenizer
itself). :func:`read_sentence_config` turns these files into a
:class:`SentenceConfig`; ``flaxzoo.models.inference.sentence_encoder`` (``embed``, ``SentenceEncoder``) applies it.

Poolings (``[batch, seq, hidden]`` hidden states and a ``[batch, seq]`` mask of real tokens, right padding, to
``[batch, hidden]``; several modes are concatenated in the order given, as sentence-transformers does):

* ``cls``: the first token's state;
* ``mean``: the mean over real tokens; ``mean_sqrt_len_tokens``: their sum divided by ``sqrt(count)``;
* ``max``: the elementwise maximum over real tokens;
* ``weightedmean``: the mean weighted by position ``1, 2, ...`` (later tokens count more: SGPT);
* ``lasttoken``: the last real token's state.

This module needs neither torch nor sentence-transformers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from functools import partial

__all__ = ["DENSE_ACTIVATIONS", "DenseLayer", "POOLING_MODES", "SentenceConfig", "pool", "read_dense",
           "read_sentence_config", "search", "similarity"]

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# The flags of pooling configs written before sentence-transformers 5, in the order it concatenates them.
LEGACY_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
MODULE_KINDS = ("Transformer", "Pooling", "Dense", "Normalize")
# A Dense module's activation_function (a torch class path; sentence-transformers' default is Tanh) → its function.
DENSE_ACTIVATIONS = {
    "torch.nn.modules.activation.Tanh": jnp.tanh, "torch.nn.modules.linear.Identity": lambda x: x,
    "torch.nn.modules.activation.ReLU": jax.nn.relu, "torch.nn.modules.activation.Sigmoid": jax.nn.sigmoid,
    "torch.nn.modules.activation.GELU": partial(jax.nn.gelu, approximate=False),
}
DENSE_DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"


@dataclasses.dataclass(frozen=True, eq=False)
class DenseLayer:
    """sentence-transformers' ``Dense`` module: ``activation(x @ weight.T + bias)`` (plus ``x`` or
    ``x @ residual.T`` when it has a residual connection), on pooled vectors ``[batch, in]`` → ``[batch, out]``.

    Attributes:
      weight: ``[out, in]`` float32; bias: ``[out]`` or None; residual: ``[out, in]`` (a projected residual),
      ``"identity"`` (``in == out``) or None; activation: a key of ``DENSE_ACTIVATIONS``.
    """

    weight: np.ndarray
    bias: np.ndarray | None = None
    activation: str = DENSE_DEFAULT_ACTIVATION
    residual: np.ndarray | str | None = None

    def __post_init__(self):
        if self.activation not in DENSE_ACTIVATIONS:
            raise ValueError(f"activation_function={self.activation!r}: expected one of {list(DENSE_ACTIVATIONS)}")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = jnp.asarray(x, jnp.float32)
        out = x @ jnp.asarray(self.weight, jnp.float32).T
        if self.bias is not None:
            out = out + jnp.asarray(self.bias, jnp.float32)
        out = DENSE_ACTIVATIONS[self.activation](out)
        if isinstance(self.residual, str):
            out = out + x
        elif self.residual is not None:
            out = out + x @ jnp.asarray(self.residual, jnp.float32).T
        return np.asarray(out)
HF_LARGE_LENGTH = 10 ** 12  # transformers writes ~1e30 as model_max_length for "no limit"


@dataclasses.dataclass(frozen=True)
class SentenceConfig:
    """How token states become a sentence vector.

    Attributes:
      pooling: the pooling modes (one or more of ``POOLING_MODES``), concatenated in this order: the vector has
        ``len(pooling) * hidden`` dimensions.
      normalize: divide each vector by its L2 norm (sentence-transformers' ``Normalize`` module).
      max_seq_length: tokens kept per text, special tokens included; None: ``embed``'s default rule
        (``flaxzoo.models.inference.text.resolve_max_length``).
      do_lower_case: lower-case the text before the tokenizer's own normalisation (sentence-transformers prepends a
        ``Lowercase`` normaliser).
      source: where the settings were read from (for messages), or None.
      dense: ``Dense`` layers applied in order to the pooled vector, before the normalisation.
    """

    pooling: tuple[str, ...] = ("mean",)
    normalize: bool = True
    max_seq_length: int | None = None
    do_lower_case: bool = False
    source: str | None = None
    dense: tuple[DenseLayer, ...] = ()

    def __post_init__(self):
        pooling = (self.pooling,) if isinstance(self.pooling, str) else tuple(self.pooling)
        object.__setattr__(self, "pooling", check_pooling(pooling, self.source))
        length = self.max_seq_length
        if length is not None and (not isinstance(length, (int, np.integer)) or isinstance(length, bool)
                                   or length < 1):
            raise ValueError(f"max_seq_length={length!r}{where(self.source)}: expected a positive integer or None")


def where(source: str | None) -> str:
    """`` (in SOURCE)`` for messages, or nothing."""
    return "" if source is None else f" (in {source})"


def check_pooling(modes: tuple[str, ...], source: str | None = None) -> tuple[str, ...]:
    """``modes`` when it is a non-empty tuple of known pooling modes; else ValueError naming the value."""
    if not modes:
        raise ValueError(f"pooling=(){where(source)}: expected at least one of {POOLING_MODES}")
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown:
        raise ValueError(f"pooling mode(s) {unknown}{where(source)}: expected one or more of {POOLING_MODES}")
    return modes


def read_json(file: pathlib.Path) -> Any:
    """The JSON value in ``file``; ValueError naming the file when it is not JSON."""
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file}: not valid JSON ({exc})") from exc


def pooling_modes(settings: dict[str, Any], source: str) -> tuple[str, ...]:
    """The modes of a ``Pooling`` module's config: ``pooling_mode`` (a name or a list; sentence-transformers >= 5)
    or the ``pooling_mode_*`` flags (older files; none set means mean, as sentence-transformers reads them)."""
    if "pooling_mode" in settings:
        mode = settings["pooling_mode"]
        modes = (mode,) if isinstance(mode, str) else tuple(mode) if isinstance(mode, list) else None
        if modes is None:
            raise ValueError(f"pooling_mode={mode!r}{where(source)}: expected a mode name or a list of them "
                             f"({POOLING_MODES})")
        return check_pooling(modes, source)
    unknown = sorted(k for k in settings if k.startswith("pooling_mode_") and k not in LEGACY_POOLING_FLAGS)
    if unknown:
        raise ValueError(f"pooling setting(s) {unknown}{where(source)}: expected only {list(LEGACY_POOLING_FLAGS)}")
    return tuple(mode for flag, mode in LEGACY_POOLING_FLAGS.items() if settings.get(flag)) or ("mean",)


def module_kind(entry: Any, source: str) -> str:
    """``Transformer`` / ``Pooling`` / ``Normalize`` from a ``modules.json`` entry's ``type`` (the class path,
    ``sentence_transformers.models.Pooling`` or ``sentence_transformers.sentence_transformer.modules.pooling.Pooling``);
    ValueError for any other module."""
    kind = entry.get("type", "") if isinstance(entry, dict) else ""
    name = kind.rsplit(".", 1)[-1]
    if name not in MODULE_KINDS:
        raise ValueError(f"module {kind or entry!r}{where(source)}: flaxzoo applies only sentence-transformers' "
                         f"{', '.join(MODULE_KINDS)} modules (in that order)")
    return name


def max_seq_length_of(folder: pathlib.Path, transformer: dict[str, Any]) -> int | None:
    """The Transformer module's ``max_seq_length``: its own setting, else the tokenizer's ``model_max_length``
    (newer files keep it there), else None; a "no limit" value (transformers writes ~1e30) is None."""
    length = transformer.get("max_seq_length")
    if length is None and (folder / "tokenizer_config.json").is_file():
        length = read_json(folder / "tokenizer_config.json").get("model_max_length")
    if isinstance(length, float) and length.is_integer():
        length = int(length)
    return None if length is None or (isinstance(length, int) and length >= HF_LARGE_LENGTH) else length


def read_sentence_config(path: str | os.PathLike, *, hidden_size: int | None = None) -> SentenceConfig | None:
    """The sentence-transformers settings of the folder ``path`` (see the module docstring), or None when it has no
    ``modules.json`` (not a sentence-transformers folder).

    ``hidden_size``: when given, a ``Pooling`` config whose ``word_embedding_dimension`` (``embedding_dimension``)
    differs is refused. ValueError (naming the value) for a module other than Transformer, Pooling, Dense, Normalize; a
    pipeline not of the form Transformer, Pooling, Dense..., [Normalize]; an unknown pooling mode; an unreadable file.
    """
    folder = pathlib.Path(path)
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    source = str(modules_file)
    entries = read_json(modules_file)
    if not isinstance(entries, list):
        raise ValueError(f"{source}: expected a list of modules, got {type(entries).__name__}")
    kinds = [module_kind(e, source) for e in entries]
    normalize = len(kinds) > 2 and kinds[-1] == "Normalize"
    dense_count = len(kinds) - 2 - normalize
    if kinds[:2] != ["Transformer", "Pooling"] or any(k != "Dense" for k in kinds[2:2 + dense_count]):
        raise ValueError(f"modules {kinds}{where(source)}: expected Transformer, Pooling, any Dense layers and "
                         "optionally Normalize, in that order")
    transformer_file = folder / entries[0].get("path", "") / "sentence_bert_config.json"
    transformer = read_json(transformer_file) if transformer_file.is_file() else {}
    pooling_file = folder / entries[1].get("path", "") / "config.json"
    if not pooling_file.is_file():
        raise ValueError(f"{pooling_file} is missing: modules.json lists a Pooling module there")
    settings = read_json(pooling_file)
    dimension = settings.get("embedding_dimension", settings.get("word_embedding_dimension"))
    if hidden_size is not None and dimension is not None and dimension != hidden_size:
        raise ValueError(f"embedding_dimension={dimension}{where(str(pooling_file))}: expected the model's "
                         f"hidden_size {hidden_size}")
    modes = pooling_modes(settings, str(pooling_file))
    dense = tuple(read_dense(folder / e.get("path", "")) for e in entries[2:2 + dense_count])
    width = len(modes) * (hidden_size or dimension or 0)
    for layer, entry in zip(dense, entries[2:]):
        if width and layer.weight.shape[1] != width:
            raise ValueError(f"the Dense layer in {folder / entry.get('path', '')} takes {layer.weight.shape[1]} "
                             f"features: expected the {width} its input has")
        width = layer.weight.shape[0]
    return SentenceConfig(pooling=modes, normalize=normalize,
                          max_seq_length=max_seq_length_of(folder, transformer),
                          do_lower_case=bool(transformer.get("do_lower_case", False)), source=str(folder), dense=dense)


def read_dense(folder: pathlib.Path) -> DenseLayer:
    """A ``Dense`` module's layer from its folder: ``config.json`` (``in_features``, ``out_features``, ``bias``,
    ``activation_function``, ``use_residual``) and ``model.safetensors`` (``linear.weight`` / ``linear.bias``,
    ``residual.weight``); a pickled ``pytorch_model.bin`` is refused."""
    from flaxzoo.models.io.files import read_safetensors

    settings = read_json(folder / "config.json") if (folder / "config.json").is_file() else None
    if settings is None or not (folder / "model.safetensors").is_file():
        raise ValueError(f"{folder}: a Dense module needs config.json and model.safetensors (flaxzoo reads no "
                         f"pickled weights); the folder holds {sorted(p.name for p in folder.glob('*'))}")
    tensors = read_safetensors(folder / "model.safetensors")
    weight = np.asarray(tensors["linear.weight"], np.float32)
    shape = (settings.get("out_features"), settings.get("in_features"))
    if weight.shape != shape:
        raise ValueError(f"{folder}: linear.weight has shape {weight.shape}: expected (out_features, in_features) "
                         f"= {shape}")
    bias = tensors.get("linear.bias") if settings.get("bias", True) else None
    residual = None
    if settings.get("use_residual", False):
        residual = "identity" if "residual.weight" not in tensors else np.asarray(tensors["residual.weight"],
                                                                                  np.float32)
    return DenseLayer(weight=weight, bias=None if bias is None else np.asarray(bias, np.float32),
                      activation=settings.get("activation_function", DENSE_DEFAULT_ACTIVATION), residual=residual)


# ------------------------------------------------------------------------------------------------------ pooling
def pool(hidden: jax.Array, mask: jax.Array, modes: tuple[str, ...] = ("mean",)) -> jax.Array:
    """Sentence vectors from token states: ``hidden [batch, seq, dim]`` and ``mask [batch, seq]`` (1 = real token,
    right padding: each row's real tokens come first) → ``[batch, len(modes) * dim]`` float32, the modes'
    vectors concatenated in order (see the module docstring). A row without real tokens gives zeros (max: -inf).
    ValueError for a known (not traced) mask that is not right-padded: ``cls`` and ``lasttoken`` would read padding."""
    if not isinstance(mask, jax.core.Tracer):
        known = np.asarray(mask) != 0
        if (known[:, 1:] & ~known[:, :-1]).any():
            row = int(np.flatnonzero((known[:, 1:] & ~known[:, :-1]).any(axis=1))[0])
            raise ValueError(f"mask row {row} is {known[row].astype(int).tolist()}: expected right padding (each "
                             "row's real tokens first, then zeros)")
    hidden = hidden.astype(jnp.float32)
    real = mask.astype(jnp.float32)[..., None]  # [batch, seq, 1]
    count = real.sum(axis=1)  # [batch, 1]
    out = []
    for mode in check_pooling(tuple(modes)):
        if mode == "cls":
            out.append(hidden[:, 0])
        elif mode == "max":
            out.append(jnp.where(real > 0, hidden, -jnp.inf).max(axis=1))
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            total = (hidden * real).sum(axis=1)
            out.append(total / jnp.maximum(count if mode == "mean" else jnp.sqrt(count), 1e-9))
        elif mode == "weightedmean":
            weights = real * jnp.arange(1, hidden.shape[1] + 1, dtype=jnp.float32)[None, :, None]
            out.append((hidden * weights).sum(axis=1) / jnp.maximum(weights.sum(axis=1), 1e-9))
        else:  # lasttoken
            last = jnp.maximum(count[:, 0].astype(jnp.int32) - 1, 0)
            out.append(jnp.take_along_axis(hidden * real, last[:, None, None], axis=1)[:, 0])
    return jnp.concatenate(out, axis=-1)


# ------------------------------------------------------------------------------------------- similarity / search
def unit_rows(x: np.ndarray, name: str) -> np.ndarray:
    """``x`` as float32 ``[n, d]`` (one vector ``[d]`` becomes ``[1, d]``), each row divided by its L2 norm (a zero
    row stays zero)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2:
        raise ValueError(f"{name} has shape {x.shape}: expected [n, dim] vectors (or one [dim] vector)")
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of every row of ``a [n, d]`` with every row of ``b [m, d]``: ``[n, m]`` float32 (a
    single ``[d]`` vector counts as one row; a zero vector has similarity 0 with everything)."""
    a, b = unit_rows(a, "a"), unit_rows(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a has {a.shape[1]}-dimensional vectors and b {b.shape[1]}-dimensional: expected the same")
    return a @ b.T


def search(query_vectors: np.ndarray, corpus_vectors: np.ndarray, top_k: int = 10
           ) -> tuple[np.ndarray, np.ndarray]:
    """The ``top_k`` corpus rows most similar (cosine) to each query: ``(indices [q, k] int64, scores [q, k]
    float32)``, best first, with ``k = min(top_k, len(corpus))``; equal scores keep the lower index first."""
    if not isinstance(top_k, (int, np.integer)) or isinstance(top_k, bool) or top_k < 1:
        raise ValueError(f"top_k={top_k!r}: expected a positive integer")
    scores = similarity(query_vectors, corpus_vectors)
    k = min(int(top_k), scores.shape[1])
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order.astype(np.int64), np.take_along_axis(scores, order, axis=1)

