"""Qwen3 in llama.cpp's GGUF files (``general.architecture = "qwen3"``): Qwen2's names plus the per-head query and
key norms (``self_attn.q_norm`` / ``k_norm`` → ``blk.N.attn_q_norm`` / ``attn_k_norm``), rotate-half Q/K rows, and
``head_dim`` from ``qwen3.attention.key_length`` (the converter writes ``config.json``'s ``head_dim``, often not
``hidden / heads``). Biases are optional (``attention_bias``: q/k/v and the output projection alike).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Collection

from flaxzoo.models.architectures.decoder.gguf import LLAMA_LAYER, decoder_config, layer_names
from flaxzoo.models.families.base import GGUFSpec

if TYPE_CHECKING:
    from flaxzoo.models.io.gguf import GGUFFile

__all__ = ["NAMES", "SPEC"]

NAMES = layer_names(LLAMA_LAYER | {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"})


def qwen3_config_from_gguf(file: GGUFFile, names: Collection[str]) -> dict[str, Any]:
    """The Hugging Face ``config.json`` a ``qwen3`` GGUF describes (rotate-half terms; no sliding window)."""
    out = decoder_config(file, names, architecture="Qwen3ForCausalLM", model_type="qwen3")
    return out | {"attention_bias": "blk.0.attn_q.bias" in names, "use_sliding_window": False,
                  "sliding_window": None, "max_window_layers": out["num_hidden_layers"]}


SPEC = GGUFSpec(architectures=("qwen3",), config=qwen3_config_from_gguf, names=NAMES, tokenizers=("gpt2", "llama"),
                rope_layout="half")
