"""Sources: one object per checkpoint format, each with the same small interface (:class:`Source`):

* ``describe()`` → ``(TransformerConfig, class)`` from the config alone, no weight read;
* ``read()`` → ``{name: array}`` in the source's own naming (Hugging Face and GGUF files; a flaxzoo work directory is
  restored by orbax straight into its shardings, ``flaxzoo.models.io.sharded_workdir``);
* ``plan(config, class, names)`` → the weight table the loader (``flaxzoo.models.io.sharded``) places through;
* ``files()`` / ``fingerprint()`` → the files that make up the weights and a hash of them (what training records, so
  that resuming or merging adapters onto other base weights is refused).

``HFSource`` (a Hugging Face directory; a Hub id is fetched into the Hugging Face cache first), ``GGUFSource`` (a
llama.cpp file), ``WorkdirSource`` (a flaxzoo training checkpoint: work directory, ``checkpoints/`` or one step) and
``LoraRunSource`` (a LoRA run's work directory: base weights + adapters; the loader loads the base and merges).
:func:`open_source` is the one place that decides which a path is. Sources only describe; the one loader
(``flaxzoo.models.io.sharded``) reads them.

What a path names, in order: an existing local path (relative, ``./``, ``~/`` and absolute paths alike: made absolute
first); else a packaged model's name (``flaxzoo.models.io.packaged.PACKAGED``: ``"smollm2-135m-instruct"``,
``"all-minilm-l6-v2"``; a local path of that name wins); else a Hugging Face Hub id (``org/name``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import re
from typing import Any, Callable, Collection

import jax
from flax import nnx

from flaxzoo.models.io.checkpoint import find_step_dir, read_meta, restore_params
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families import family_and_class, family_of_class, factory_for, gguf_config, model_classes
from flaxzoo.models.families.base import Entry, ParamPath, WeightMap, dotted, format_names, param_path
from flaxzoo.models.io.gguf import GGUFFile, is_gguf
from flaxzoo.models.io.files import (PICKLE, PICKLE_INDEX, SAFETENSORS, SAFETENSORS_INDEX, PathLike, is_hub_id,
                                      listing, read_config, read_weights, resolve_pretrained, stored_tensor_names,
                                      weight_files)
from flaxzoo.models.adapters.lora import LoraConfig, apply_lora
from flaxzoo.models.modeling import abstract_params, assemble_model, per_layer_shapes

__all__ = ["GGUFSource", "HFSource", "LoraRunSource", "Plan", "Source", "WorkdirSource", "fingerprint_files",
           "open_source"]

FINGERPRINT_CHUNK = 1 << 22  # bytes read at a time
HF_WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json")


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a source's tensors become one model's parameters.

    ``factory``: what builds the model (``factory(config, rngs=...)``). ``weights``: the table from the source's
    tensor names to the model's per-layer parameter paths (with what may be lacking, skipped or tied). ``vocab_rows``:
    the rows the source's vocabulary tables hold (``config.vocab_size`` for Hugging Face / GGUF; a flaxzoo checkpoint:
    its stored padded size). ``where``: how errors and warnings name the source."""

    factory: Callable[..., nnx.Module]
    weights: WeightMap
    vocab_rows: int
    where: str


class Source:
    """One checkpoint in one format (the subclasses below).

    ``kind``: ``"hf"``, ``"gguf"`` or ``"flaxzoo"``. ``root``: the local path it was opened at. ``default_scan_layers``:
    the layer layout built when the caller asks for none (None: the stored config's)."""

    kind: str = ""
    root: pathlib.Path
    default_scan_layers: bool | None = False

    def describe(self) -> tuple[TransformerConfig, type]:
        """``(config, class)`` of the model the source holds, read from its config alone (no weights)."""
        raise NotImplementedError

    def model_class(self, cls: type | str | None) -> type:
        """The class to build for ``cls`` (a class, its name, or None: the source's own); ValueError for a class
        that cannot hold this source."""
        raise NotImplementedError

    def read(self, progress: bool = False) -> dict[str, Any]:
        """Every tensor, ``{name: array}`` in the source's naming (anything ``np.asarray`` takes: a GGUF tensor is
        dequantised only then). Hugging Face and GGUF sources; the loader restores a flaxzoo work directory with
        orbax and builds a LoRA run's merge itself."""
        raise NotImplementedError

    def plan(self, config: TransformerConfig, model_cls: type, names: Collection[str]) -> Plan:
        """The table for building ``model_cls`` in ``config`` from the tensors ``names``."""
        raise NotImplementedError

    def files(self) -> list[pathlib.Path]:
        """The files whose bytes make up the source's weights and config (sorted)."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """``sha256:<hex>`` of :meth:`files`' names and bytes (``flaxzoo.models.io.sources.fingerprint_files``)."""
        raise NotImplementedError


def fingerprint_files(files: list[pathlib.Path], root: pathlib.Path) -> str:
    """``sha256:<hex>`` over the names (relative to ``root``; a single file: its name) and bytes of ``files``: equal
    for a copy of the same files elsewhere, different when any byte differs."""
    digest = hashlib.sha256()
    for file in files:
        name = file.name if len(files) == 1 else str(file.relative_to(root))
        digest.update(name.encode() + b"\0")
        with open(file, "rb") as handle:
            while chunk := handle.read(FINGERPRINT_CHUNK):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()


class HFSource(Source):
    """A Hugging Face model directory: ``config.json`` and safetensors weights (or, with ``allow_pickle``,
    ``pytorch_model.bin``)."""

    kind = "hf"
    default_scan_layers = False

    def __init__(self, directory: pathlib.Path, *, allow_pickle: bool = False):
        self.root = directory
        self.allow_pickle = allow_pickle
        self.hf = read_config(directory)

    def describe(self) -> tuple[TransformerConfig, type]:
        family, cls = family_and_class(self.hf, None)
        weight_files(self.root, self.allow_pickle)  # no weights at all: say so before judging the config's fields
        config = family.config_from_hf(self.hf)
        names = stored_tensor_names(self.root) if family.config_from_tensors is not None else None
        if names is not None:
            config = family.config_from_tensors(config, names)
        return config, cls

    def model_class(self, cls: type | str | None) -> type:
        return family_and_class(self.hf, cls)[1]

    def read(self, progress: bool = False) -> dict[str, Any]:
        family, _ = family_and_class(self.hf, None)
        tensors = read_weights(self.root, self.allow_pickle, progress)
        return tensors if family.rename is None else {family.rename(name): t for name, t in tensors.items()}

    def plan(self, config: TransformerConfig, model_cls: type, names: Collection[str]) -> Plan:
        family, _ = family_and_class(self.hf, model_cls)
        prefix = family.base_prefix + "."
        prefixed = any(name.startswith(prefix) for name in names)
        weights = family.weights(config, model_cls, prefix if prefixed else "")
        if model_cls is family.base_class and prefixed:  # a head checkpoint loaded as the base model: skip the head
            weights.ignored = (*weights.ignored, rf"(?!{re.escape(prefix)}).*")
        return Plan(family.factory(model_cls, weights.params_of(names)), weights, config.vocab_size,
                    f"{self.root} ({family.model_type}, flaxzoo {model_cls.__name__})")

    def files(self) -> list[pathlib.Path]:
        return sorted({self.root / "config.json", *(p for pattern in HF_WEIGHT_PATTERNS for p in self.root.glob(pattern))})

    def fingerprint(self) -> str:
        return fingerprint_files(self.files(), self.root)


class GGUFSource(Source):
    """A llama.cpp GGUF file of a registered architecture (``flaxzoo.models.families.gguf_family``): config from its
    metadata, tensors dequantised one at a time as they are translated."""

    kind = "gguf"
    default_scan_layers = False

    def __init__(self, file: pathlib.Path):
        self.root = file
        self.gguf = GGUFFile(file)
        self.family, self.hf = gguf_config(self.gguf)

    def describe(self) -> tuple[TransformerConfig, type]:
        family, cls = family_and_class(self.hf, None)  # the config's family (umT5 files read by T5's spec)
        # llama.cpp stores Q and K rows in the interleaved RoPE pair layout: keep them, and rotate those pairs.
        return family.config_from_hf(self.hf).replace(rope_layout=self.family.gguf.rope_layout), cls

    def model_class(self, cls: type | str | None) -> type:
        return family_and_class(self.hf, cls)[1]

    def read(self, progress: bool = False) -> dict[str, Any]:
        return self.gguf.lazy_tensors(progress=progress)

    def plan(self, config: TransformerConfig, model_cls: type, names: Collection[str]) -> Plan:
        weights = self.family.gguf_weights(config, model_cls)
        return Plan(self.family.factory(model_cls, weights.params_of(names)), weights, config.vocab_size,
                    f"{self.root} (GGUF {self.gguf.architecture}, flaxzoo {model_cls.__name__})")

    def files(self) -> list[pathlib.Path]:
        return [self.root]

    def fingerprint(self) -> str:
        return fingerprint_files(self.files(), self.root.parent)


def stack_prefix(paths: Collection[ParamPath]) -> ParamPath:
    """Where the layer stack sits in a model's parameter tree: the path of the module holding its ``embeddings``
    (``("backbone",)``; ``()`` without one)."""
    return next((p[:p.index("embeddings")] for p in paths if p[-3:] == ("embeddings", "tokens", "embedding")), ())


class WorkdirSource(Source):
    """A flaxzoo training checkpoint (``flaxzoo.models.io.checkpoint``): a ``python -m flaxzoo.train`` work directory,
    its ``checkpoints/`` folder or one step folder; the latest step is read, its parameters only.

    It loads as the stored class or another one of the same kind (encoder / decoder): parameters outside the layer
    stack that the other class lacks are skipped, and those it has and the checkpoint lacks (a classifier, a pooler)
    are initialised; inside the stack everything must match."""

    kind = "flaxzoo"
    default_scan_layers = None  # the stored config's layout

    def __init__(self, path: pathlib.Path, step_dir: pathlib.Path | None = None):
        self.root = path
        self.step_dir = step_dir or find_step_dir(path)
        if self.step_dir is None:
            raise ValueError(f"{path} holds no flaxzoo checkpoint step (expected checkpoints/<step>/{{state,meta}})")
        self.meta = read_meta(self.step_dir)

    def describe(self) -> tuple[TransformerConfig, type]:
        return TransformerConfig.from_dict(self.meta["config"]), model_classes()[self.meta["model_class"]]

    def model_class(self, cls: type | str | None) -> type:
        stored_config, stored_cls = self.describe()
        if cls is None:
            return stored_cls
        allowed = {n: c for n, c in model_classes().items() if family_of_class(c).causal == stored_config.causal}
        name = cls if isinstance(cls, str) else getattr(cls, "__name__", repr(cls))
        if name not in allowed or (not isinstance(cls, str) and allowed[name] is not cls):
            kind = "decoder" if stored_config.causal else "encoder"
            raise ValueError(f"{self.step_dir} holds a {stored_cls.__name__} ({kind}); cls={name!r} does not match: "
                             f"it loads as one of {sorted(allowed)}")
        return allowed[name]

    def plan(self, config: TransformerConfig, model_cls: type, names: Collection[str]) -> Plan:
        stored_config, stored_cls = self.describe()
        stored = [param_path(n) for n in names]
        same_class = model_cls is stored_cls
        target = abstract_params(config, model_cls).shapes
        stored_base, base = stack_prefix(stored)[:-1], stack_prefix(target)[:-1]
        # {path in the model: stored path}: the stored base model moved from stored_base to base; heads kept.
        moved = {base + p[len(stored_base):] if p[:len(stored_base)] == stored_base else p: p for p in stored}
        factory = factory_for(model_cls, moved)
        params = abstract_params(config, factory).shapes if factory is not model_cls else target
        expected = per_layer_shapes(params, config.layer_counts)
        stack = stack_prefix(expected)
        inside = lambda p: p[:len(stack)] == stack  # noqa: E731
        entries = [Entry(dotted(moved.get(p, stored_base + p[len(base):] if p[:len(base)] == base else p)), (p,))
                   for p in expected]
        names_used = {e.hf for e in entries}
        optional = frozenset() if same_class else frozenset(e.hf for e in entries if not inside(e.paths[0]))
        skipped = () if same_class else tuple(re.escape(dotted(p)) for m, p in moved.items()
                                              if dotted(p) not in names_used and not inside(m))
        where = (f"{self.step_dir} (flaxzoo {stored_cls.__name__})" if same_class else
                 f"{self.step_dir} ({stored_cls.__name__} loaded as {model_cls.__name__})")
        return Plan(factory, WeightMap(entries, ignored=skipped, optional=optional), stored_config.padded_vocab_size,
                    where)

    def files(self) -> list[pathlib.Path]:
        return sorted(p for p in self.step_dir.rglob("*") if p.is_file())

    def fingerprint(self) -> str:
        return fingerprint_files(self.files(), self.root)


class LoraRunSource(WorkdirSource):
    """A LoRA run's flaxzoo checkpoint: the adapters and fully trained parameters, and a reference to the base
    weights (``meta["base"]``: path and fingerprint). It reads as the merged model, in the class and heads it was
    trained with; :meth:`adapted` gives the model with its adapters unmerged."""

    def __init__(self, path: pathlib.Path, step_dir: pathlib.Path | None = None, *,
                 base: PathLike | None = None):
        super().__init__(path, step_dir)
        self.base = base

    def model_class(self, cls: type | str | None) -> type:
        stored_cls = super().model_class(None)
        if cls is not None and super().model_class(cls) is not stored_cls:
            raise ValueError(f"{self.step_dir}: a LoRA run loads as the class and heads it was trained with "
                             f"({stored_cls.__name__}); save it (models.save_checkpoint) to change them")
        return stored_cls

    def base_source(self) -> Source:
        """The base weights' source (``meta["base"]``, or ``base`` when they have moved); their fingerprint must
        match the one the run recorded."""
        stored_base = self.meta.get("base") or {}
        where = str(self.base) if self.base is not None else stored_base.get("path")
        if not where or not (pathlib.Path(where).expanduser().exists() or is_hub_id(where)):
            raise FileNotFoundError(f"{self.step_dir}: the LoRA base {where!r} is not there; pass base= (the same "
                                    f"weights elsewhere: fingerprint {stored_base.get('fingerprint')})")
        base_source = open_source(where)
        found = base_source.fingerprint()
        if found != stored_base.get("fingerprint"):
            raise ValueError(f"{self.step_dir}: the adapters were trained on {stored_base.get('path')} "
                             f"({stored_base.get('fingerprint')}), but {where} is {found}: other base weights")
        return base_source

    def adapted(self, base: nnx.Module) -> nnx.Module:
        """The model with its adapters unmerged (qwix-intercepted projections, in the stored config): ``base`` (the
        model :meth:`base_source` loads, as this run's class and layer layout: ``flaxzoo.models.io.sharded``
        loads it) rebuilt in the stored config, ``apply_lora`` with the stored settings, then the stored adapters
        and fully trained parameters."""
        config, model_cls = self.describe()
        values = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(base, nnx.Param))}
        model = assemble_model(config, model_cls, values)  # the stored config (dtypes, labels ...)
        apply_lora(model, LoraConfig.from_dict(self.meta["lora"]), seed=0)
        trained = restore_params(self.step_dir)
        flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
        missing = sorted(dotted(p) for p in trained if p not in flat)
        if missing:
            raise ValueError(f"{self.step_dir}: stored parameters {format_names(missing)} are not in the adapted "
                             "model")
        nnx.update(model, nnx.from_flat_state([(p, flat[p].replace(jax.numpy.asarray(v, flat[p].get_value().dtype)))
                                               for p, v in trained.items()]))
        model.eval()
        return model

    def plan(self, config: TransformerConfig, model_cls: type, names: Collection[str]) -> Plan:
        stored_config, _ = self.describe()
        if config.num_labels != stored_config.num_labels or config.pad_vocab_to != stored_config.pad_vocab_to:
            raise ValueError(f"{self.step_dir}: a LoRA run loads as the class and heads it was trained with "
                             f"(num_labels={stored_config.num_labels}, pad_vocab_to={stored_config.pad_vocab_to}); "
                             "save it (models.save_checkpoint) to change them")
        return super().plan(config, model_cls, names)


def open_source(path: PathLike, *, revision: str | None = None, allow_pickle: bool = False) -> Source:
    """The source ``path`` names: the one place that tells a Hugging Face directory, a GGUF file, a flaxzoo work
    directory (a LoRA run's included) and a Hub id apart (a packaged model's name: see the module docstring).

    A directory is a flaxzoo training checkpoint when it (or its ``checkpoints/``) holds orbax step directories; a
    Hugging Face directory when it has ``config.json`` and weights; otherwise a directory holding exactly one
    ``.gguf`` file stands for that file. Raises FileNotFoundError for a path that is not there (and no packaged
    name or Hub id), ValueError (listing what the directory holds) for anything else.
    """
    local = resolve_pretrained(path, revision=revision)
    if local.is_file():
        if local.suffix == ".gguf" or is_gguf(local):
            return GGUFSource(local)
        raise ValueError(f"{local} is a file but not a GGUF file: from_pretrained expects a directory (Hugging Face: "
                         f"config.json + {SAFETENSORS}; a flaxzoo checkpoint) or a .gguf file")
    step_dir = find_step_dir(local)
    if step_dir is not None:
        meta = read_meta(step_dir)
        return LoraRunSource(local, step_dir) if "lora" in meta else WorkdirSource(local, step_dir)
    has_weights = any((local / name).is_file() for name in (SAFETENSORS, SAFETENSORS_INDEX, PICKLE, PICKLE_INDEX))
    if (local / "config.json").is_file() and has_weights:
        return HFSource(local, allow_pickle=allow_pickle)
    ggufs = sorted(local.glob("*.gguf"))
    if len(ggufs) == 1:
        return GGUFSource(ggufs[0])
    if len(ggufs) > 1:
        raise ValueError(f"{local} holds several GGUF files ({format_names([g.name for g in ggufs])}): pass the "
                         "path of the one to load")
    if (local / "config.json").is_file():
        return HFSource(local, allow_pickle=allow_pickle)  # reading its weights reports what is missing
    raise ValueError(f"{local} holds no model: no config.json with {SAFETENSORS}, no .gguf file and no flaxzoo "
                     f"checkpoint (checkpoints/<step>/); the directory holds {listing(local)}")
