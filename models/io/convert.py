"""Convert between checkpoint formats: ``flaxzoo convert SRC DST [--to hf|flaxzoo]``.

``SRC`` is anything ``from_pretrained`` reads: a Hugging Face directory, a ``.gguf`` file, a flaxzoo training
checkpoint (work directory, ``checkpoints/`` or one step) or a Hub id. ``DST`` is a new directory, written as

* ``flaxzoo`` (the default for Hugging Face / GGUF sources): ``DST/checkpoints/0/{state,meta}``, the layout
  ``python -m flaxzoo.train`` writes, with only the parameters in ``state``;
* ``hf`` (the default for flaxzoo sources): ``config.json`` + ``model.safetensors`` (float32), loadable by
  ``transformers``; a GGUF's interleaved RoPE rows are permuted to Hugging Face's rotate-half layout.

A LoRA run's work directory converts to its merged model (``--to hf``: a plain Hugging Face directory), or with
``--adapters-only`` to the adapters alone in PEFT's layout (``adapter_model.safetensors`` + ``adapter_config.json``,
for ``peft.PeftModel.from_pretrained`` on the base model).

The tokenizer travels along as ``DST/tokenizer.json`` when the source has one (a GGUF's embedded tokenizer
included), with ``tokenizer_config.json`` / ``special_tokens_map.json`` / ``vocab.txt`` copied when present.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import time
import warnings
from typing import Sequence

from flaxzoo.models.io.checkpoint import find_step_dir, save_checkpoint
from flaxzoo.models.io import save_pretrained
from flaxzoo.models.io.sharded import adapted_model, load_model
from flaxzoo.models.io.peft import save_adapters
from flaxzoo.models.io.sources import LoraRunSource, open_source

__all__ = ["convert", "main"]

FORMATS = ("hf", "flaxzoo")
_TOKENIZER_EXTRAS = ("tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def _tokenizer_folder(kind: str, source: pathlib.Path) -> pathlib.Path | None:
    """Where the source's tokenizer files are, if anywhere."""
    from flaxzoo.models.io.tokenizer import TOKENIZER_FILES

    if kind == "flaxzoo":  # a work directory may hold tokenizer.json beside checkpoints/
        step = find_step_dir(source)
        candidates = [source, step.parent.parent] if step is not None else [source]
    else:
        candidates = [source]
    for folder in candidates:
        if any((folder / name).is_file() for name in TOKENIZER_FILES):
            return folder
    return None


def _copy_tokenizer(kind: str, source: pathlib.Path, dst: pathlib.Path) -> pathlib.Path | None:
    """Write ``dst/tokenizer.json`` from the source's tokenizer; returns its path, or None when there is none."""
    from flaxzoo.models.io.tokenizer import load_tokenizer

    if kind == "gguf":
        try:
            tok = load_tokenizer(source, padding=None)
        except FileNotFoundError:  # the file carries no tokenizer
            return None
        except ValueError as exc:  # an embedded tokenizer flaxzoo cannot rebuild: the weights still convert
            warnings.warn(f"tokenizer not converted: {exc}", stacklevel=2)
            return None
    else:
        folder = _tokenizer_folder(kind, source)
        if folder is None:
            return None
        tok = load_tokenizer(folder, padding=None)
        for name in _TOKENIZER_EXTRAS:
            if (folder / name).is_file() and not (dst / name).exists():
                shutil.copy(folder / name, dst / name)
    out = dst / "tokenizer.json"
    tok.save(str(out))
    return out


def convert(src: str | pathlib.Path, dst: str | pathlib.Path, *, to: str | None = None, dtype: str | None = None,
            progress: bool = True, adapters_only: bool = False) -> pathlib.Path:
    """Convert ``src`` to the format ``to`` (``"hf"`` or ``"flaxzoo"``; default: the other family) in the new
    directory ``dst``; returns ``dst``. ``dtype`` sets a flaxzoo checkpoint's parameter dtype (Hugging Face output
    is float32). ``adapters_only``: ``src`` is a LoRA run; write its adapters in PEFT's layout (``to`` "hf")."""
    if to is not None and to not in FORMATS:
        raise ValueError(f"to={to!r}: expected one of {FORMATS}")
    opened = open_source(src)
    kind, source = opened.kind, opened.root
    to = to or ("hf" if kind == "flaxzoo" else "flaxzoo")
    dst = pathlib.Path(dst).expanduser()
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise FileExistsError(f"{dst} already exists and is not empty; choose a new directory")
    if adapters_only:
        if kind != "flaxzoo" or to != "hf":
            raise ValueError(f"--adapters-only writes a LoRA run's adapters in PEFT's (Hugging Face) layout: expected "
                             f"a flaxzoo LoRA work directory and --to hf, got a {kind} source and --to {to}")
        if not isinstance(opened, LoraRunSource):
            raise ValueError(f"--adapters-only: {source} is not a LoRA run's work directory (its meta has no 'lora')")
        meta = opened.meta
        save_adapters(adapted_model(opened), dst, base_model=meta.get("base", {}).get("path", ""),
                      train_fully=meta["lora"].get("train_fully", ()))
        _copy_tokenizer(kind, source, dst)
        return dst
    model = load_model(opened, param_dtype=dtype, progress=progress)
    dst.mkdir(parents=True, exist_ok=True)
    if to == "hf":
        save_pretrained(model, dst)
    else:
        save_checkpoint(model, dst)
    _copy_tokenizer(kind, source, dst)
    return dst


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="flaxzoo convert", description=__doc__.split("\n\n")[0],
        epilog="SRC: a Hugging Face directory, a .gguf file, a flaxzoo checkpoint or a Hub id. DST: a new directory.")
    parser.add_argument("src", help="the checkpoint to read")
    parser.add_argument("dst", help="the directory to write (must not exist or be empty)")
    parser.add_argument("--to", choices=FORMATS, default=None,
                        help="output format (default: flaxzoo for hf/gguf sources, hf for flaxzoo sources)")
    parser.add_argument("--dtype", default=None, help="parameter dtype of a flaxzoo output, e.g. bfloat16")
    parser.add_argument("--adapters-only", action="store_true",
                        help="a LoRA run: write only its adapters, in PEFT's layout (adapter_model.safetensors)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        dst = convert(args.src, args.dst, to=args.to, dtype=args.dtype, progress=not args.no_progress,
                      adapters_only=args.adapters_only)
    except (ValueError, FileNotFoundError, FileExistsError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {dst} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
