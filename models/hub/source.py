"""What a pretrained source is without loading its weights: its config and class, and a fingerprint of its files.

Training from pretrained weights (``init_from``, LoRA) resolves the model from here before any work, and records the
fingerprint in its checkpoints, so that resuming (or merging adapters) onto other base weights is refused.
"""

from __future__ import annotations

import hashlib
import pathlib

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.hub.files import PathLike, checkpoint_kind, read_config, resolve_pretrained
from flaxzoo.models.hub.registry import family_and_class

FINGERPRINT_CHUNK = 1 << 22  # bytes read at a time


def describe_pretrained(path: PathLike) -> tuple[TransformerConfig, str]:
    """``(config, class name)`` of the model ``models.from_pretrained(path)`` would build (per-layer layout,
    float32); only the config (``config.json``, the GGUF metadata, a flaxzoo ``meta``) is read."""
    kind, source = checkpoint_kind(resolve_pretrained(path))
    if kind == "flaxzoo":
        from flaxzoo.models.checkpoint import find_step_dir, read_meta

        meta = read_meta(find_step_dir(source))
        return TransformerConfig.from_dict(meta["config"]), meta["model_class"]
    if kind == "gguf":
        from flaxzoo.models.gguf import GGUFFile, llama_hf_config

        hf = llama_hf_config(GGUFFile(source))
        family, cls = family_and_class(hf, None)
        return family.config_from_hf(hf).replace(rope_layout="interleaved"), cls.__name__
    hf = read_config(source)
    family, cls = family_and_class(hf, None)
    return family.config_from_hf(hf), cls.__name__


def source_files(path: PathLike) -> list[pathlib.Path]:
    """The files whose bytes make up a source's weights and config (sorted): the GGUF file; a Hugging Face
    directory's ``config.json`` and weight files; a flaxzoo checkpoint's latest step directory."""
    kind, source = checkpoint_kind(resolve_pretrained(path))
    if kind == "gguf":
        return [source]
    if kind == "flaxzoo":
        from flaxzoo.models.checkpoint import find_step_dir

        step = find_step_dir(source)
        return sorted(p for p in step.rglob("*") if p.is_file())
    weights = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json")
    return sorted({source / "config.json", *(p for pattern in weights for p in source.glob(pattern))})


def fingerprint(path: PathLike) -> str:
    """``sha256:<hex>`` over the names (relative) and bytes of :func:`source_files`: equal for a copy of the same
    files elsewhere, different when any weight byte differs."""
    files = source_files(path)
    root = files[0].parent if len(files) == 1 else pathlib.Path(resolve_pretrained(path))
    digest = hashlib.sha256()
    for file in files:
        name = file.name if len(files) == 1 else str(file.relative_to(root))
        digest.update(name.encode() + b"\0")
        with open(file, "rb") as handle:
            while chunk := handle.read(FINGERPRINT_CHUNK):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()
