"""Gemma, Gemma 2 and Gemma 3 in llama.cpp's GGUF files (``general.architecture`` ``gemma`` / ``gemma2`` /
``gemma3``): tensor names and the config the metadata describes.

Facts of llama.cpp (``convert_hf_to_gguf.py`` and its model loader) these specs follow:

* Every ``*norm.weight`` (the block norms, the final norm, Gemma 3's q/k norms) is stored as ``1 + w``: the
  converter adds Gemma's unit offset. The specs' ``offsets`` subtract it on load (as transformers' GGUF loader
  does), and flaxzoo's ``norm_unit_offset`` adds it back at run time.
* Q/K rows keep Hugging Face's rotate-half order; the embeddings are tied (Gemma 1 and 2 drop ``lm_head``); Gemma 3
  drops the embedding rows past its tokenizer (the vocabulary is the rows of ``token_embd.weight``).
* Gemma 2 / 3 name the sandwich norms ``attn_norm`` / ``post_attention_norm`` (around attention) and ``ffn_norm`` /
  ``post_ffw_norm`` (around the feed-forward); Gemma 1's ``post_attention_layernorm`` is its ``ffn_norm``. Gemma 3's
  per-head query / key norms are ``attn_q_norm`` / ``attn_k_norm``.
* ``query_pre_attn_scalar`` is not stored: llama.cpp scales queries by ``1 / √head_dim``, except for the 27B models
  (46 layers for Gemma 2, 62 for Gemma 3), which use ``1 / √(hidden / heads)``, as their configs say.
* Gemma 2: ``gemma2.attention.sliding_window`` (default 4096), ``gemma2.attn_logit_softcapping`` (default 50) and
  ``gemma2.final_logit_softcapping`` (default 30); no ``rope.freq_base`` (10,000). Every other layer slides, the
  first one included.
* Gemma 3: ``gemma3.attention.sliding_window`` (none written when no layer slides), ``rope.freq_base`` for the global
  layers (with ``rope.scaling.*``, linear for the larger models) and ``rope.freq_base_swa`` for the sliding ones
  (10,000 when absent, as llama.cpp assumes), ``final_logit_softcapping`` when set; five sliding layers then one
  global. A ``{arch}.attention.sliding_window_pattern`` (period or one flag per layer) overrides the built-in
  patterns.
* SentencePiece tokenizers (``"llama"``; Gemma 3 without ``tokenizer.model``: byte-level BPE).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Collection

from flaxzoo.models.architectures.decoder.gguf import LLAMA_LAYER, decoder_config, layer_names, metadata_float
from flaxzoo.models.families.base import GGUFSpec

if TYPE_CHECKING:
    from flaxzoo.models.io.gguf import GGUFFile

__all__ = ["GEMMA2_SPEC", "GEMMA3_SPEC", "GEMMA_SPEC", "SPECS"]

SLIDING, FULL = "sliding_attention", "full_attention"

SANDWICH_LAYER = LLAMA_LAYER | {"post_attention_layernorm": "post_attention_norm",
                                "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
GEMMA_NAMES = layer_names(LLAMA_LAYER)
GEMMA2_NAMES = layer_names(SANDWICH_LAYER)
GEMMA3_NAMES = layer_names(SANDWICH_LAYER | {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"})
# llama.cpp stores every Gemma RMSNorm weight as 1 + w.
NORM_OFFSET: tuple[tuple[str, float], ...] = ((r".*norm\.weight", 1.0),)
# The layer counts of the 27B models, whose query scale llama.cpp takes from hidden / heads.
LARGE_LAYERS = {"gemma2": 46, "gemma3": 62}
# llama.cpp's built-in sliding-window periods: layer i slides unless i % period == period - 1.
PERIODS = {"gemma2": 2, "gemma3": 6}


def query_pre_attn_scalar(file: GGUFFile, config: dict[str, Any]) -> int:
    """The ``query_pre_attn_scalar`` llama.cpp scales queries by: ``head_dim``, or ``hidden / heads`` for a 27B
    model."""
    if config["num_hidden_layers"] == LARGE_LAYERS[file.architecture]:
        return config["hidden_size"] // config["num_attention_heads"]
    return config["head_dim"]


def layer_types(file: GGUFFile, num_layers: int) -> list[str]:
    """Each layer's attention: ``{arch}.attention.sliding_window_pattern`` when written (a period ``p``: layer ``i``
    slides when ``p == 0`` or ``i % p < p - 1``; or one flag per layer, true for sliding), else llama.cpp's period
    for the architecture."""
    arch = file.architecture
    pattern = file.arch("attention.sliding_window_pattern", PERIODS[arch])
    if isinstance(pattern, list):
        if len(pattern) != num_layers:
            raise ValueError(f"{file.path}: {arch}.attention.sliding_window_pattern has {len(pattern)} flags for "
                             f"{num_layers} layers")
        return [SLIDING if flag else FULL for flag in pattern]
    period = int(pattern)
    return [SLIDING if period == 0 or i % period < period - 1 else FULL for i in range(num_layers)]


def softcap(file: GGUFFile, key: str, default: float | None) -> float | None:
    """A soft cap of the file (``default`` when absent; a non-positive value: none)."""
    value = file.arch(key, default)
    return None if value is None or value <= 0 else metadata_float(value)


def gemma_config_from_gguf(file: GGUFFile, names: Collection[str]) -> dict[str, Any]:
    """The Hugging Face ``config.json`` a ``gemma`` GGUF describes (pre-norm blocks, ``1 / √head_dim``)."""
    return decoder_config(file, names, architecture="GemmaForCausalLM", model_type="gemma",
                          hidden_act="gelu_pytorch_tanh", scaling=())


def gemma2_config_from_gguf(file: GGUFFile, names: Collection[str]) -> dict[str, Any]:
    """The Hugging Face ``config.json`` a ``gemma2`` GGUF describes (sandwich norms, soft caps, alternating
    sliding-window layers)."""
    out = decoder_config(file, names, architecture="Gemma2ForCausalLM", model_type="gemma2",
                         hidden_act="gelu_pytorch_tanh", scaling=())
    return out | {
        "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": query_pre_attn_scalar(file, out),
        "sliding_window": int(file.arch("attention.sliding_window", 4096)),
        "layer_types": layer_types(file, out["num_hidden_layers"]),
        "attn_logit_softcapping": softcap(file, "attn_logit_softcapping", 50.0),
        "final_logit_softcapping": softcap(file, "final_logit_softcapping", 30.0)}


def gemma3_config_from_gguf(file: GGUFFile, names: Collection[str]) -> dict[str, Any]:
    """The Hugging Face ``config.json`` a ``gemma3`` GGUF describes (Gemma 2's blocks with q/k norms, global and
    sliding layers with their own RoPE bases, the scaling on the global ones)."""
    out = decoder_config(file, names, architecture="Gemma3ForCausalLM", model_type="gemma3_text",
                         hidden_act="gelu_pytorch_tanh")
    window = file.arch("attention.sliding_window")
    types = layer_types(file, out["num_hidden_layers"]) if window else [FULL] * out["num_hidden_layers"]
    return out | {
        "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": query_pre_attn_scalar(file, out),
        "sliding_window": int(window) if window else None, "layer_types": types,
        "rope_local_base_freq": metadata_float(file.arch("rope.freq_base_swa", 10_000.0)),
        "final_logit_softcapping": softcap(file, "final_logit_softcapping", None), "attn_logit_softcapping": None}


GEMMA_SPEC = GGUFSpec(architectures=("gemma",), config=gemma_config_from_gguf, names=GEMMA_NAMES,
                      tokenizers=("llama",), rope_layout="half", offsets=NORM_OFFSET)
GEMMA2_SPEC = GGUFSpec(architectures=("gemma2",), config=gemma2_config_from_gguf, names=GEMMA2_NAMES,
                       tokenizers=("llama",), rope_layout="half", offsets=NORM_OFFSET)
GEMMA3_SPEC = GGUFSpec(architectures=("gemma3",), config=gemma3_config_from_gguf, names=GEMMA3_NAMES,
                       tokenizers=("llama", "gpt2"), rope_layout="half", offsets=NORM_OFFSET)
# Each spec by the flaxzoo model_type of the family that reads it.
SPECS: dict[str, GGUFSpec] = {"gemma": GEMMA_SPEC, "gemma2": GEMMA2_SPEC, "gemma3_text": GEMMA3_SPEC}
