"""Files: reading Hugging Face weights (safetensors, sharded indexes, opt-in pickles) and configs, resolving a name to
a local path (packaged models, Hub ids fetched into the Hugging Face cache), and writing a Hugging Face directory.
Which format a path holds is ``flaxzoo.models.io.sources.open_source``'s to tell.

Weights are read with the safetensors numpy API (bfloat16 / float8 from the header's offsets): no torch at run time,
except for the opt-in ``allow_pickle=True`` path that reads legacy ``pytorch_model.bin`` files.
"""

from __future__ import annotations

import difflib
import json
import os
import pathlib
import re
from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from flaxzoo.models.families.base import format_names
from flaxzoo.models.io.packaged import PACKAGED, installed_names, packaged_path

PathLike = Union[str, pathlib.Path]

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"


_ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def read_safetensors(file: pathlib.Path) -> dict[str, np.ndarray]:
    """All tensors of one safetensors file as numpy arrays.

    The safetensors numpy API has no bfloat16 (nor float8); such tensors are read at the offsets the file's header
    gives, as ``ml_dtypes`` arrays (the types JAX uses).
    """
    with open(file, "rb") as raw:
        header_size = int.from_bytes(raw.read(8), "little")
        header = json.loads(raw.read(header_size))
    tensors: dict[str, np.ndarray] = {}
    with safe_open(file, framework="np") as f:
        for name in f.keys():
            info = header[name]
            if info["dtype"] in _ML_DTYPES:
                import ml_dtypes  # a JAX dependency

                begin, end = info["data_offsets"]
                data = np.fromfile(file, dtype=np.uint8, count=end - begin, offset=8 + header_size + begin)
                tensors[name] = data.view(getattr(ml_dtypes, _ML_DTYPES[info["dtype"]])).reshape(info["shape"])
            else:
                tensors[name] = f.get_tensor(name)
    return tensors


def read_pickle(file: pathlib.Path) -> dict[str, np.ndarray]:
    """A ``pytorch_model.bin`` state dict as numpy arrays (``torch.load(weights_only=True)``; bfloat16 → float32)."""
    import torch  # only on the opt-in legacy path

    state = torch.load(file, map_location="cpu", weights_only=True)
    return {name: (t.float() if t.dtype == torch.bfloat16 else t).numpy() for name, t in state.items()}


def shards(directory: pathlib.Path, index_name: str) -> list[pathlib.Path]:
    """The shard files an index lists; ValueError naming those not in ``directory``."""
    index = json.loads((directory / index_name).read_text())
    files = sorted(set(index["weight_map"].values()))
    missing = [f for f in files if not (directory / f).is_file()]
    if missing:
        raise ValueError(f"{directory / index_name} lists shard files that are not in the directory: "
                         f"{format_names(missing)}")
    return [directory / f for f in files]


def weight_files(directory: pathlib.Path, allow_pickle: bool
                 ) -> tuple[list[pathlib.Path], Callable[[pathlib.Path], dict[str, np.ndarray]]]:
    """The weight files of the checkpoint in ``directory`` and their reader: safetensors (single or sharded), or
    opt-in pickles. Raises ValueError (listing the directory) when there are none."""
    if (directory / SAFETENSORS).is_file():
        files, reader = [directory / SAFETENSORS], read_safetensors
    elif (directory / SAFETENSORS_INDEX).is_file():
        files, reader = shards(directory, SAFETENSORS_INDEX), read_safetensors
    elif (directory / PICKLE).is_file() or (directory / PICKLE_INDEX).is_file():
        name = PICKLE if (directory / PICKLE).is_file() else PICKLE_INDEX
        if not allow_pickle:
            raise ValueError(
                f"{directory} holds {name}, a Python pickle (loading one can run arbitrary code) and no "
                f"{SAFETENSORS}; pass allow_pickle=True to read it with torch.load(weights_only=True) (needs torch), "
                "or convert it to safetensors")
        files = [directory / PICKLE] if name == PICKLE else shards(directory, PICKLE_INDEX)
        reader = read_pickle
    else:
        raise ValueError(f"{directory} holds no model weights: expected {SAFETENSORS} or {SAFETENSORS_INDEX} "
                         f"(or {PICKLE} with allow_pickle=True) beside config.json, or a .gguf file; the directory "
                         f"holds {listing(directory)}")
    return files, reader


def stored_tensor_names(directory: pathlib.Path) -> set[str] | None:
    """The tensor names of the safetensors checkpoint in ``directory`` from its headers (or index) alone, nothing
    read; None for a pickle checkpoint or a directory without weights."""
    if (directory / SAFETENSORS_INDEX).is_file() and not (directory / SAFETENSORS).is_file():
        return set(json.loads((directory / SAFETENSORS_INDEX).read_text())["weight_map"])
    if not (directory / SAFETENSORS).is_file():
        return None
    with open(directory / SAFETENSORS, "rb") as raw:
        header_size = int.from_bytes(raw.read(8), "little")
        return set(json.loads(raw.read(header_size))) - {"__metadata__"}


def read_weights(directory: pathlib.Path, allow_pickle: bool, progress: bool = False) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint in ``directory``."""
    files, reader = weight_files(directory, allow_pickle)
    tensors: dict[str, np.ndarray] = {}
    for file in progress_bar(files, progress and len(files) > 1, "reading shards"):
        tensors.update(reader(file))
    return tensors


def progress_bar(items: Sequence[Any], enabled: bool, desc: str, unit: str = "file"):
    """``items`` wrapped in a tqdm progress bar when ``enabled``."""
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit=unit)


def listing(directory: pathlib.Path) -> str:
    """What ``directory`` holds, for error messages (folders end in ``/``)."""
    contents = sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir())
    return format_names(contents) if contents else "nothing (it is empty)"


def read_config(directory: pathlib.Path) -> dict[str, Any]:
    """``directory/config.json``; ValueError (listing the directory) when there is none."""
    file = directory / "config.json"
    if not file.is_file():
        raise ValueError(f"{directory} has no config.json; the directory holds {listing(directory)}")
    return json.loads(file.read_text())


# --------------------------------------------------------------------------------------------------------------------
# Hugging Face Hub ids
# --------------------------------------------------------------------------------------------------------------------

# What a Hub download fetches: configuration, safetensors weights and tokenizer files. Never pickles (*.bin, *.pt,
# *.pth, *.ckpt), which can run code when loaded, nor the ONNX / TF / Flax copies many repositories also hold.
HUB_ALLOW_PATTERNS = (
    "config.json", SAFETENSORS, "model-*.safetensors", SAFETENSORS_INDEX, "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt", "generation_config.json",
    # sentence-transformers' pipeline (flaxzoo.models.inference.sentence): its module list, Transformer and Pooling settings
    "modules.json", "sentence_bert_config.json", "*_Pooling/config.json",
)
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?")


def is_hub_id(path: PathLike) -> bool:
    """True for a string that is not an existing local path and is shaped like ``name`` or ``org/name``."""
    if not isinstance(path, str) or os.path.exists(os.path.expanduser(path)):
        return False
    return bool(_HUB_ID.fullmatch(path)) and not path.endswith((".gguf", ".json", ".safetensors"))


def is_hub_repo(path: PathLike) -> bool:
    """True for a Hub id worth asking the Hub for: ``org/name`` (``is_hub_id``) whose ``org`` is not a local folder
    (``runs/defualt`` is a mistyped path under ``runs/``, not a repository)."""
    if not is_hub_id(path) or "/" not in str(path):
        return False
    return not pathlib.Path(str(path).split("/", 1)[0]).is_dir()


def _nearby_paths(path: pathlib.Path, limit: int = 500) -> list[str]:
    """The entries of ``path``'s deepest existing folder, spelled as ``path`` spells that folder (at most
    ``limit`` of them are read)."""
    folder = path.parent
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return []
    names = []
    for entry in folder.iterdir():
        names.append(entry.name if folder == pathlib.Path(".") else str(folder / entry.name))
        if len(names) >= limit:
            break
    return names


def missing_source_error(value: PathLike, hub: Exception | None = None) -> FileNotFoundError:
    """One line for a model source that names nothing: the value, the packaged models installed and the nearest
    packaged names or existing paths (``hub``: why the Hub could not provide a bare name either)."""
    text = os.path.expanduser(str(value))
    installed = installed_names()
    candidates = {name: name for name in PACKAGED} | {p.lower(): p for p in _nearby_paths(pathlib.Path(text))}
    nearest = [candidates[c] for c in difflib.get_close_matches(text.lower(), list(candidates), n=3, cutoff=0.6)]
    absent = [name for name in PACKAGED if name not in installed]
    if "/" in str(value) and is_hub_id(value):
        what = "its folder exists, so it is read as a local path, not a Hugging Face Hub id"
    else:
        what = "expected an existing local path, a packaged model or a Hugging Face Hub id ('org/name')"
    if hub is not None:
        detail = str(hub).split(", and ", 1)[-1].split(" (", 1)[0]
        what += f"; nor could the Hub provide it as a repository: {detail}"
    quoted = lambda names: ", ".join(repr(n) for n in names)  # noqa: E731
    return FileNotFoundError(
        f"{str(value)!r} does not exist ({what}); packaged models installed: {quoted(installed) or 'none'}"
        + (f" (not installed: {quoted(absent)})" if absent else "")
        + (f"; nearest: {quoted(nearest)}" if nearest else ""))


def resolve_pretrained(path: PathLike, *, revision: str | None = None) -> pathlib.Path:
    """The absolute local path ``path`` names: itself (``~`` expanded; relative to the working directory), for a
    packaged model's name (``flaxzoo.models.io.packaged.PACKAGED``; no local path of that name) the installed
    package's file or folder, for a Hub id ``org/name`` its snapshot folder in the Hugging Face cache.

    A bare name that is neither (a Hub repository of transformers' early names, ``gpt2``; or a typo) is asked of
    the Hub; when the Hub cannot provide it (offline, not found), and for a path that is not there, the error is one
    FileNotFoundError naming the packaged models and the nearest names."""
    if is_hub_id(path):
        packaged = packaged_path(str(path))
        if packaged is not None:
            return packaged
        if is_hub_repo(path):
            return download_from_hub(str(path), revision=revision)
        if "/" not in str(path):
            try:
                return download_from_hub(str(path), revision=revision)
            except FileNotFoundError as exc:
                raise missing_source_error(path, hub=exc) from exc
    local = pathlib.Path(path).expanduser().absolute()
    if not local.exists():
        raise missing_source_error(path)
    return local


def download_from_hub(repo_id: str, *, revision: str | None = None) -> pathlib.Path:
    """Fetch ``repo_id``'s config, safetensors and tokenizer files into the Hugging Face cache (``HF_HOME``) and
    return the snapshot folder. Offline (``HF_HUB_OFFLINE=1``, or no network) a cached snapshot is used.

    Raises FileNotFoundError, saying how to pass a local path instead, when the repository can be neither fetched
    nor found in the cache; ValueError when it holds no safetensors weights.
    """
    try:
        import huggingface_hub
    except ImportError as exc:
        raise ImportError(f"{repo_id!r} is not a local path; fetching it from the Hugging Face Hub needs "
                          "huggingface_hub (pip install huggingface_hub), or pass a local directory") from exc
    try:
        folder = pathlib.Path(huggingface_hub.snapshot_download(
            repo_id, revision=revision, allow_patterns=list(HUB_ALLOW_PATTERNS)))
    except Exception as exc:  # offline and not cached, unknown / gated repository, invalid id, network failure
        offline = huggingface_hub.constants.HF_HUB_OFFLINE
        why = ("offline mode is on (HF_HUB_OFFLINE=1) and it is not in the Hugging Face cache "
               f"{huggingface_hub.constants.HF_HUB_CACHE}" if offline else
               "the Hugging Face Hub could not provide it and it is not in the cache "
               f"{huggingface_hub.constants.HF_HUB_CACHE}")
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise FileNotFoundError(
            f"{repo_id!r} is not a local path, and {why} ({type(exc).__name__}: {detail}). To load files you "
            "already have, pass their local path: from_pretrained('/path/to/model_dir') (config.json + "
            "model.safetensors) or from_pretrained('/path/to/model.gguf'); to fetch from the Hub, run once with "
            "network access and without HF_HUB_OFFLINE") from exc
    if not any(folder.glob("*.safetensors")):
        raise ValueError(f"Hugging Face Hub repository {repo_id!r} has no safetensors weights (flaxzoo never "
                         f"downloads pickled .bin/.pt files); its snapshot {folder} holds {listing(folder)}. "
                         "Convert the weights to safetensors and pass the local directory")
    return folder


# --------------------------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------------------------

def write_hf_directory(path: PathLike, config: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> pathlib.Path:
    """``config.json`` and ``model.safetensors`` in the directory ``path`` (created); returns the directory."""
    directory = pathlib.Path(path).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(dict(tensors), directory / SAFETENSORS, metadata={"format": "pt"})
    return directory
