"""Qwen2 / Qwen2.5 in llama.cpp's GGUF files (``general.architecture = "qwen2"``): the Llama layout's tensor names
and the config the metadata describes (:mod:`flaxzoo.models.architectures.decoder.gguf`). Qwen2 files carry
byte-level BPE (``tokenizer.ggml.model = "gpt2"``, pre-tokenizer ``"qwen2"``), or SentencePiece for a checkpoint with
a ``tokenizer.model``. llama.cpp does not implement Qwen2's sliding window, and the converter writes none: the config
has it off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Collection

from flaxzoo.models.architectures.decoder.gguf import LLAMA_NAMES, decoder_config
from flaxzoo.models.families.base import GGUFSpec

if TYPE_CHECKING:
    from flaxzoo.models.io.gguf import GGUFFile


def qwen2_config_from_gguf(file: GGUFFile, names: Collection[str]) -> dict[str, Any]:
    """The Hugging Face ``config.json`` a ``qwen2`` GGUF describes (rotate-half Q/K rows; q/k/v biased, the
    output projection not: Qwen2's layout); no sliding window (llama.cpp has none for Qwen2)."""
    out = decoder_config(file, names, architecture="Qwen2ForCausalLM", model_type="qwen2")
    return out | {"use_sliding_window": False, "sliding_window": None, "max_window_layers": out["num_hidden_layers"]}


SPEC = GGUFSpec(architectures=("qwen2",), config=qwen2_config_from_gguf, names=LLAMA_NAMES,
                tokenizers=("gpt2", "llama"), rope_layout="half")
