"""Phi-3 / Phi-3.5 / Phi-4-mini in llama.cpp's GGUF files (``general.architecture = "phi3"``): tensor names and the
config the metadata describes.

Facts of llama.cpp's converter (``Phi3MiniModel``) this spec follows:

* The fused tensors stay fused: ``self_attn.qkv_proj`` → ``blk.N.attn_qkv`` (q rows, then k, then v) and
  ``mlp.gate_up_proj`` → ``blk.N.ffn_up`` (gate rows, then up); Q/K rows keep the rotate-half order.
* ``phi3.rope.dimension_count`` is ``partial_rotary_factor · hidden / heads`` (Phi-4-mini rotates 3/4 of each head);
  ``phi3.rope.scaling.original_context_length`` is ``original_max_position_embeddings``; ``phi3.context_length``
  is ``max_position_embeddings``.
* ``phi3.attention.sliding_window``: ``config.json``'s ``sliding_window``, 0 for none. (llama.cpp itself currently
  ignores Phi-3's window; the file's value is the original model's, and transformers applies it: so does flaxzoo.)
* LongRoPE (the 128k models) is no metadata type: the factors are the tensors ``rope_factors_long.weight`` /
  ``rope_factors_short.weight`` (``head_dim · fraction / 2`` values each) and ``phi3.rope.scaling.attn_factor``
  is the attention factor (Hugging Face's default formula; written only when it differs from it does it enter the
  config). They become ``rope_scaling = {"rope_type": "longrope", ...}``; the two tensors are no parameters.
* SentencePiece tokenizers (``"llama"``); Phi-4's files carry byte-level BPE (``"gpt2"``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Collection

import numpy as np

from flaxzoo.models.architectures.decoder.gguf import decoder_config, layer_names, metadata_float
from flaxzoo.models.families.base import GGUFSpec

if TYPE_CHECKING:
    from flaxzoo.models.io.gguf import GGUFFile

__all__ = ["NAMES", "SPEC"]

PHI3_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
              "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
              "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
NAMES = layer_names(PHI3_LAYER)
LONG, SHORT = "rope_factors_long.weight", "rope_factors_short.weight"


def longrope(file: GGUFFile, names: Collection[str], config: dict[str, Any]) -> dict[str, Any] | None:
    """Hugging Face's LongRoPE ``rope_scaling`` from the factor tensors (None without them); ValueError when only
    one of the two is there."""
    present = [name for name in (LONG, SHORT) if name in names]
    if not present:
        return None
    if len(present) == 1:
        raise ValueError(f"{file.path}: LongRoPE needs both {LONG} and {SHORT}; the file has only {present[0]}")
    tensors = file.lazy_tensors()
    out: dict[str, Any] = {"rope_type": "longrope",
                           "long_factor": [float(v) for v in np.asarray(tensors[LONG]).reshape(-1)],
                           "short_factor": [float(v) for v in np.asarray(tensors[SHORT]).reshape(-1)]}
    stored = file.arch("rope.scaling.attn_factor")
    if stored is not None:
        scale = config["max_position_embeddings"] / config["original_max_position_embeddings"]
        default = math.sqrt(1 + math.log(scale) / math.log(config["original_max_position_embeddings"])) \
            if scale > 1 else 1.0
        if not math.isclose(float(stored), default, rel_tol=1e-6):
            out["attention_factor"] = metadata_float(stored)
    return out


def phi3_config_from_gguf(file: GGUFFile, names: Collection[str]) -> dict[str, Any]:
    """The Hugging Face ``config.json`` a ``phi3`` GGUF describes (rotate-half terms; partial rotary, the sliding
    window and LongRoPE as written)."""
    names = set(names)
    out = decoder_config(file, names, architecture="Phi3ForCausalLM", model_type="phi3", partial_rotary=True,
                         scaling=("longrope",))
    window = int(file.arch("attention.sliding_window", 0) or 0)
    original = file.arch("rope.scaling.original_context_length", out["max_position_embeddings"])
    out |= {"sliding_window": window or None, "original_max_position_embeddings": int(original)}
    scaling = longrope(file, names, out)
    if out["rope_scaling"] is not None and scaling is None:
        raise ValueError(f"{file.path}: phi3.rope.scaling.type='longrope' needs the tensors {LONG} and {SHORT}")
    out["rope_scaling"] = scaling
    return out


SPEC = GGUFSpec(architectures=("phi3",), config=phi3_config_from_gguf, names=NAMES, tokenizers=("llama", "gpt2"),
                rope_layout="half", skipped=(r"rope_factors_(long|short)\.weight",))
