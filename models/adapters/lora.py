"""LoRA adapters (Hu et al. 2021, arXiv:2106.09685) on flaxzoo's ``Dense`` projections, computed by qwix.

A target ``Dense`` with kernel ``W: in_shape + out_shape`` gets two ``nnx.LoRAParam`` tensors in qwix's layout,
``kernel_lora_a: [prod(in_shape), rank]`` and ``kernel_lora_b: [rank, prod(out_shape)]`` (a leading ``[num_layers]``
when the layers are stored stacked), and computes ``y = x·W + (x·A)·B · alpha / rank``: qwix's ``LoraProvider``
intercepts the ``dot_general`` of that ``Dense`` and adds the low-rank term. ``A`` starts He-uniform and ``B`` zero
(qwix's and the paper's initialisation), so an adapted model starts equal to its base.

Why the adapters are created here and not by qwix's first call: qwix creates them lazily inside the intercepted call,
but the layer stack runs each block as a pure function (``nnx.split`` / ``nnx.merge``, under ``jax.checkpoint`` or
``lax.scan``), where a new attribute would land on a throw-away copy. qwix is therefore applied to each target
``Dense`` on its own (its ``__call__`` intercepted, whichever model method runs it: ``__call__``, ``decode``), and the
adapter tensors are created beforehand with the shapes and logical axes qwix would give them (``A`` takes the base
kernel's first input axis, ``B`` its first output axis), so that sharding follows the base weight's.

``merge_lora`` folds the adapters into plain kernels (an ordinary model, what ``save_pretrained`` writes);
``adapter_tensors`` lists them for PEFT's layout (``models/io/peft.py``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxzoo.models.families import lora_targets, plain_factory
from flaxzoo.models.layers.linear import Dense
from flaxzoo.models.layers.layer_layout import LAYER_AXIS
from flaxzoo.models.modeling import dotted, format_names

BASE_DTYPES = ("float32", "bfloat16", "int8")
LORA_A, LORA_B = "kernel_lora_a", "kernel_lora_b"


class LoraError(ValueError):
    """A LoRA setting that cannot work; ``field`` is ``rank``, ``alpha``, ``targets``, ``base_dtype`` or
    ``train_fully``."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """What to adapt and how: ``rank`` r > 0, ``alpha`` (the update is scaled by ``alpha / rank``), ``targets``
    (target names of the model's family, ``Family.lora_targets``: ``attention``, ``mlp``, ``query`` ... ``head``,
    or regular expressions over dotted module paths such as ``backbone.layers.3.attention.query``), ``base_dtype`` of the adapted projections' frozen weights
    (``"int8"``: QLoRA-style, qwix weight-only int8 with per-channel scales; other parameters keep their dtype)."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = ("attention", "mlp")
    base_dtype: str = "float32"

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, (int, np.integer)) or self.rank <= 0:
            raise LoraError("rank", f"rank={self.rank!r}: expected an integer > 0")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0 \
                or not math.isfinite(self.alpha):
            raise LoraError("alpha", f"alpha={self.alpha!r}: expected a finite number > 0")
        if isinstance(self.targets, str) or not self.targets:
            raise LoraError("targets", f"targets={self.targets!r}: expected a non-empty tuple of names "
                                       f"({', '.join(lora_targets())}) or module-path regular expressions")
        for target in self.targets:
            _pattern(target)
        if self.base_dtype not in BASE_DTYPES:
            raise LoraError("base_dtype", f"base_dtype={self.base_dtype!r}: expected one of {BASE_DTYPES}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def to_dict(self) -> dict[str, Any]:
        return {"rank": int(self.rank), "alpha": float(self.alpha), "targets": list(self.targets),
                "base_dtype": self.base_dtype}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "LoraConfig":
        return cls(rank=values["rank"], alpha=values["alpha"], targets=tuple(values["targets"]),
                   base_dtype=values.get("base_dtype", "float32"))


def _pattern(target: str, targets: Mapping[str, str] | None = None) -> re.Pattern:
    """The regular expression of a target: a name of ``targets`` (a model's ``families.lora_targets(model)``; by
    default every family's names), or the target itself."""
    targets = lora_targets() if targets is None else targets
    if not isinstance(target, str) or not target.strip():
        raise LoraError("targets", f"target {target!r}: expected a name ({', '.join(targets)}) or a "
                                   "module-path regular expression")
    try:
        return re.compile(targets.get(target, target))
    except re.error as exc:
        raise LoraError("targets", f"target {target!r} is neither a known name ({', '.join(targets)}) nor "
                                   f"a valid regular expression: {exc}") from None


# ------------------------------------------------------------------------------------------------ finding targets
def dense_modules(model: nnx.Module) -> dict[str, Dense]:
    """``{dotted module path: Dense}`` of every projection of ``model`` (stacked layers: one path, no index)."""
    return {dotted(path): module for path, module in nnx.iter_modules(model) if isinstance(module, Dense)}


def target_paths(model: nnx.Module, targets: Sequence[str]) -> list[str]:
    """The dotted paths of the ``Dense`` modules ``targets`` select; a target that selects none is an error that
    lists the paths it could have matched."""
    paths = dense_modules(model)
    chosen: set[str] = set()
    for target in targets:
        pattern = _pattern(target, lora_targets(model))
        hits = {p for p in paths if pattern.search(p)}
        if not hits:
            raise LoraError("targets", f"LoRA target {target!r} matches no projection of this "
                                       f"{type(model).__name__}; the module paths it could match: "
                                       f"{format_names(paths, limit=40)}")
        chosen |= hits
    return sorted(chosen)


def _parent_and_name(model: nnx.Module, path: str) -> tuple[Any, str | int]:
    *parent_keys, name = path.split(".")
    parent = model
    for key in parent_keys:
        parent = parent[int(key)] if key.isdigit() else getattr(parent, key)
    return parent, (int(name) if name.isdigit() else name)


def _set_child(parent: Any, name: str | int, module: nnx.Module) -> None:
    if isinstance(name, int):
        parent[name] = module
    else:
        setattr(parent, name, module)


def _stacked(dense: Dense) -> int:
    """The number of stacked layers of a ``Dense`` inside scanned layers (its kernel has a leading layer axis), or 0."""
    kernel = dense.kernel
    extra = kernel.ndim - len(dense.in_shape) - len(dense.out_shape)
    return kernel.shape[0] if extra == 1 else 0


# ------------------------------------------------------------------------------------------------------- applying
def lora_shapes(dense: Dense, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """qwix's shapes of ``(A, B)`` for ``dense``: ``[prod(in), rank]``, ``[rank, prod(out)]`` (``[layers]`` first)."""
    layers = _stacked(dense)
    lead = (layers,) if layers else ()
    return (*lead, math.prod(dense.in_shape), rank), (*lead, rank, math.prod(dense.out_shape))


def _lora_axes(dense: Dense) -> tuple[tuple, tuple] | tuple[None, None]:
    axes = dense.kernel.get_metadata().get("out_sharding")
    if axes is None:
        return None, None
    layers = _stacked(dense)
    lead, own = (tuple(axes[:1]), tuple(axes[1:])) if layers else ((), tuple(axes))
    return (*lead, own[0], None), (*lead, None, own[len(dense.in_shape)])


def _intercepted(dense: Dense, lora: LoraConfig) -> Dense:
    """``dense`` (a copy) whose ``__call__`` runs under qwix's LoRA provider (a rule for this module only)."""
    import qwix

    rule = qwix.LoraRule(module_path=".*", rank=lora.rank, alpha=float(lora.alpha),
                         weight_qtype=jnp.int8 if lora.base_dtype == "int8" else None)
    # No init call and no RNG: the adapter tensors are created by apply_lora (qwix's lazy creation would be lost).
    return qwix.quantize_model(dense, qwix.LoraProvider([rule]), skip_nnx_init=True)


def apply_lora(model: nnx.Module, lora: LoraConfig, *, seed: int = 0) -> nnx.Module:
    """``model`` with LoRA adapters on the projections ``lora.targets`` selects (changed in place and returned).

    The base parameters keep their values. ``lora.base_dtype`` applies to the adapted projections only, whose
    weights stay frozen: ``"bfloat16"`` stores their kernels and biases in bfloat16, ``"int8"`` quantises their
    kernels with qwix. Everything else keeps its dtype, so a head trained fully (``train_fully``: a classifier, a
    pooler) trains in float32 with float32 optimizer moments. Each adapter's ``A`` is drawn from ``seed`` and the
    module path, ``B`` is zero. Works on concrete and abstract (``nnx.eval_shape``) models, per-layer or stacked.
    """
    if any(LORA_A in vars(m) for m in dense_modules(model).values()):
        raise LoraError("targets", "this model already has LoRA adapters; merge them first (flaxzoo.models.adapters.lora.merge_lora)")
    init_a = jax.nn.initializers.he_uniform(in_axis=-2, out_axis=-1)
    key = jax.random.key(seed)
    for path in target_paths(model, lora.targets):
        parent, name = _parent_and_name(model, path)
        dense: Dense = getattr(parent, name) if isinstance(name, str) else parent[name]
        a_shape, b_shape = lora_shapes(dense, lora.rank)
        a_axes, b_axes = _lora_axes(dense)
        if lora.base_dtype == "int8":
            from flaxzoo.models.adapters.quantize import quantize_dense  # the int8 weight layout lives in one place

            dense = quantize_dense(dense)
        elif lora.base_dtype == "bfloat16":
            _to_bfloat16(dense)
        # One key per (module, layer), the same whether the layers are stored per layer or stacked.
        module_key, layer = _module_key(key, path)
        if len(a_shape) == 3:
            keys = jax.vmap(lambda i: jax.random.fold_in(module_key, i))(jnp.arange(a_shape[0]))
            a = jax.vmap(lambda k: init_a(k, a_shape[1:], jnp.float32))(keys)
        else:
            a = init_a(jax.random.fold_in(module_key, layer), a_shape, jnp.float32)
        adapted = _intercepted(dense, lora)
        metadata = {} if a_axes is None else {"out_sharding": a_axes, "eager_sharding": False}
        setattr(adapted, LORA_A, nnx.LoRAParam(a, **metadata))
        metadata = {} if b_axes is None else {"out_sharding": b_axes, "eager_sharding": False}
        setattr(adapted, LORA_B, nnx.LoRAParam(jnp.zeros(b_shape, jnp.float32), **metadata))
        _set_child(parent, name, adapted)
    model.lora_config = lora  # static: recorded in the graph, read back by merge_lora and the checkpoint writer
    return model


def _to_bfloat16(dense: Dense) -> None:
    """Store an adapted (frozen) projection's float kernel and bias in bfloat16, in place."""
    for name in ("kernel", "bias"):
        var = getattr(dense, name, None)
        if isinstance(var, nnx.Param) and not isinstance(var, nnx.LoRAParam) \
                and jnp.issubdtype(var.get_value().dtype, jnp.floating):
            var.set_value(var.get_value().astype(jnp.bfloat16))


_LAYER_INDEX = re.compile(r"(^|\.)layers\.(\d+)(?=\.)")


def _module_key(key: jax.Array, path: str) -> tuple[jax.Array, int]:
    """The key of a module path without its layer index (``layers.3.mlp.up`` → ``layers.mlp.up``), and the index."""
    import zlib

    match = _LAYER_INDEX.search(path)
    layer = int(match.group(2)) if match else 0
    canonical = _LAYER_INDEX.sub(r"\1layers", path)
    return jax.random.fold_in(key, zlib.crc32(canonical.encode())), layer


def has_lora(model: nnx.Module) -> bool:
    """Whether ``model`` carries LoRA adapters."""
    return any(isinstance(v, nnx.LoRAParam) for _, v in nnx.to_flat_state(nnx.state(model)))


def lora_config_of(model: nnx.Module) -> LoraConfig | None:
    """The ``LoraConfig`` recorded on an adapted model by ``apply_lora`` (None: not adapted)."""
    return getattr(model, "lora_config", None)


def lora_param_count(model: nnx.Module) -> int:
    """The number of adapter values (``A`` and ``B`` of every target)."""
    return int(sum(np.prod(v.get_value().shape) for _, v in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))))


# -------------------------------------------------------------------------------------------------------- merging
def lora_delta(a: Any, b: Any, in_shape: Sequence[int], out_shape: Sequence[int], scale: float) -> Any:
    """The kernel update ``(A · B) · scale`` reshaped to ``[(layers,) *in_shape, *out_shape]`` (numpy or jax)."""
    xp = np if isinstance(a, np.ndarray) else jnp
    product = xp.matmul(a, b) * scale
    return product.reshape(*product.shape[:-2], *in_shape, *out_shape)


def float_kernel(dense: Dense) -> jax.Array:
    """``dense``'s kernel as a float array, dequantised when qwix holds it as int8 (a ``WithAux`` of a ``QArray``)."""
    kernel = dense.kernel
    if isinstance(kernel, nnx.Variable):
        return kernel.get_value()
    import qwix

    array = getattr(kernel, "array", kernel)
    return qwix.dequantize(jax.tree.map(lambda x: x.get_value() if isinstance(x, nnx.Variable) else x, array,
                                        is_leaf=lambda x: isinstance(x, nnx.Variable)))


def adapter_tensors(model: nnx.Module) -> dict[str, tuple[Dense, Any, Any]]:
    """``{dotted path: (dense, A, B)}`` of every adapted projection (values as the model holds them)."""
    out = {}
    for path, dense in dense_modules(model).items():
        if isinstance(getattr(dense, LORA_A, None), nnx.LoRAParam):
            out[path] = (dense, getattr(dense, LORA_A).get_value(), getattr(dense, LORA_B).get_value())
    return out


def merge_lora(model: nnx.Module, scale: float | None = None) -> nnx.Module:
    """A plain model (no qwix, no adapters, float kernels) whose kernels are ``W + A·B·alpha/rank``: what the
    adapted ``model`` computes, as an ordinary model to save or convert. ``scale``: ``alpha / rank`` (default: the
    model's ``lora_config``). Kernels quantised to int8 (QLoRA) are dequantised first."""
    from flaxzoo.models.modeling import assemble_model

    config = model.config
    if scale is None:
        lora = lora_config_of(model)
        if lora is None:
            raise ValueError("merge_lora: the model has no lora_config; pass scale=alpha/rank")
        scale = lora.scale
    adapters = adapter_tensors(model)
    values = {}
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))):
        values[path] = variable.get_value()
    for path, dense in dense_modules(model).items():
        keys = tuple(int(k) if k.isdigit() else k for k in path.split("."))
        kernel = float_kernel(dense)  # int8 (QLoRA) kernels: dequantised; their leaves are replaced by this one
        values = {p: v for p, v in values.items() if p[:len(keys) + 1] != (*keys, "kernel")}
        if path in adapters:
            _, a, b = adapters[path]
            kernel = kernel.astype(jnp.float32) + lora_delta(a, b, dense.in_shape, dense.out_shape, scale)
        values[(*keys, "kernel")] = kernel
    param_dtype = jnp.dtype(config.param_dtype)
    values = {p: jnp.asarray(v, param_dtype) if jnp.issubdtype(jnp.asarray(v).dtype, jnp.floating) else v
              for p, v in values.items()}
    return assemble_model(config, plain_factory(model), values)


def check_train_fully(model: nnx.Module, train_fully: Iterable[str]) -> None:
    """LoraError for a ``train_fully`` entry that selects no parameter (the message lists the module paths)."""
    modules = sorted({dotted(p[:-1]) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))
                      if not isinstance(v, nnx.LoRAParam)})
    for name in train_fully:
        pattern = _pattern(name, lora_targets(model))
        if not any(pattern.search(m) for m in modules):
            raise LoraError("train_fully", f"{name!r} matches no module with parameters; the module paths: "
                                           f"{format_names(modules, limit=40)}")


def in_train_fully(path: Sequence, train_fully: Iterable[str]) -> bool:
    """Whether the parameter at ``path`` (keys, its name last) is under a module ``train_fully`` selects."""
    return any(_pattern(t).search(dotted(tuple(path)[:-1])) for t in train_fully)


def frozen_and_trainable(train_fully: Iterable[str] = ()) -> nnx.filterlib.Filter:
    """The ``nnx`` filter of what LoRA training updates: the adapters, plus every parameter under a module whose
    dotted path ``train_fully``'s regular expressions match (a fresh classifier head, say)."""
    train_fully = tuple(train_fully)

    def fully(path, variable) -> bool:
        return isinstance(variable, nnx.Param) and in_train_fully(path, train_fully)

    return nnx.Any(nnx.LoRAParam, fully) if train_fully else nnx.LoRAParam


__all__ = ["BASE_DTYPES", "LoraConfig", "LoraError", "adapter_tensors", "apply_lora",
           "check_train_fully", "dense_modules", "frozen_and_trainable", "in_train_fully", "has_lora", "lora_config_of", "lora_delta", "lora_param_count",
           "lora_shapes", "merge_lora", "target_paths", "LAYER_AXIS"]
