"""What the Llama-layout decoder families share in llama.cpp's GGUF files (Llama, Qwen2, Qwen3, Gemma 1/2/3, Phi-3):
the tensor names, the metadata readers and the config the metadata describes (:func:`decoder_config`,
:func:`layer_names`). Each family's ``gguf.py`` passes its architecture and what differs.

Facts of llama.cpp's converter (``convert_hf_to_gguf.py``) these readers rely on:

* Only the ``llama`` architecture has its Q/K rows permuted into the interleaved RoPE layout; every other
  architecture keeps Hugging Face's rotate-half rows (``rope_layout="half"``), as transformers' GGUF loader assumes
  (it un-permutes ``llama`` files only).
* The names are gguf-py's ``TensorNameMap``: ``token_embd``, ``output_norm``, ``output`` (absent when the
  embeddings are tied), per layer ``blk.N.attn_norm``, ``attn_q`` / ``attn_k`` / ``attn_v`` / ``attn_output``
  (``.weight`` and ``.bias``), ``ffn_norm``, ``ffn_gate`` / ``ffn_up`` / ``ffn_down``.
* Metadata under ``{arch}.``: ``block_count``, ``context_length``, ``embedding_length``, ``feed_forward_length``,
  ``attention.head_count`` / ``head_count_kv`` / ``key_length`` (when ``config.json`` names ``head_dim``) /
  ``layer_norm_rms_epsilon``, ``rope.freq_base``, and for YaRN / linear scaling ``rope.scaling.type`` /
  ``factor`` / ``original_context_length`` (plus YaRN's ``yarn_beta_fast`` / ``yarn_beta_slow`` /
  ``yarn_attn_factor`` when ``config.json`` sets them).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Collection, Mapping

import numpy as np

if TYPE_CHECKING:
    from flaxzoo.models.io.gguf import GGUFFile

__all__ = ["LLAMA_LAYER", "LLAMA_NAMES", "TOP_NAMES", "decoder_config", "layer_names", "metadata_float",
           "rope_scaling", "token_id", "vocab_size"]

# Top-level tensors: Hugging Face name (a regular expression) → llama.cpp's name. ``score.weight`` (a sequence
# classifier's head) is llama.cpp's classifier output; a causal-LM file has none.
TOP_NAMES: dict[str, str] = {r"model\.embed_tokens\.weight": "token_embd.weight",
                             r"model\.norm\.weight": "output_norm.weight", r"lm_head\.weight": "output.weight",
                             r"score\.weight": "cls.output.weight"}
# Per-layer modules of the Llama layout: Hugging Face module inside ``model.layers.N`` → llama.cpp's tensor.
LLAMA_LAYER: dict[str, str] = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def layer_names(layer: Mapping[str, str], top: Mapping[str, str] = TOP_NAMES) -> tuple[tuple[str, str], ...]:
    """``GGUFSpec.names`` from the top-level names and the per-layer modules (``{"self_attn.q_proj": "attn_q"}``:
    ``model.layers.3.self_attn.q_proj.weight`` → ``blk.3.attn_q.weight``, ``.bias`` likewise)."""
    per_layer = tuple((rf"model\.layers\.(\d+)\.{re.escape(module)}\.(weight|bias)",
                       rf"blk.\1.{tensor}.\2") for module, tensor in layer.items())
    return (*top.items(), *per_layer)


LLAMA_NAMES = layer_names(LLAMA_LAYER)  # the names of every family whose layers are Llama's alone


def metadata_float(value: Any) -> float:
    """A float32 metadata value as the decimal it was written from (``9.99999975e-06`` → ``1e-05``)."""
    return float(str(np.float32(value)))


def token_id(file: GGUFFile, key: str) -> int | None:
    """``tokenizer.ggml.{key}`` (``bos_token_id`` ...) as an int, or None."""
    value = file.get(f"tokenizer.ggml.{key}")
    return None if value is None else int(value)


def vocab_size(file: GGUFFile) -> int:
    """The vocabulary: the rows of ``token_embd.weight`` (what the weights hold: Gemma 3's converter drops the rows
    past its tokenizer), else ``{arch}.vocab_size``, else the number of tokens."""
    if "token_embd.weight" in file.tensor_names:
        return int(file.lazy_tensors()["token_embd.weight"].shape[0])
    vocab = file.arch("vocab_size")
    if vocab is None and file.get("tokenizer.ggml.tokens") is not None:
        vocab = len(file.get("tokenizer.ggml.tokens"))
    if vocab is None:
        raise ValueError(f"{file.path}: GGUF metadata has neither {file.architecture}.vocab_size nor "
                         "tokenizer.ggml.tokens, and the file has no token_embd.weight")
    return int(vocab)


def rope_scaling(file: GGUFFile, *, allowed: Collection[str] = ("linear", "yarn")) -> dict[str, Any] | None:
    """The Hugging Face ``rope_scaling`` the file's ``rope.scaling.*`` keys describe (None without scaling).

    ``linear``: ``factor``; ``yarn``: ``factor``, ``original_max_position_embeddings`` and, when written,
    ``beta_fast`` / ``beta_slow`` / ``attention_factor``; ``longrope``: the type alone (its factors are tensors).
    ValueError naming the key for a type outside ``allowed`` or a YaRN setting Hugging Face's YaRN has no field
    for.
    """
    arch = file.architecture
    kind = file.arch("rope.scaling.type", "none") or "none"
    if kind == "none":
        return None
    if kind not in allowed:
        raise ValueError(f"{file.path}: {arch}.rope.scaling.type={kind!r} is not supported for GGUF {arch}; flaxzoo "
                         f"reads {sorted(allowed)}")
    if kind == "longrope":  # its factors are tensors: the caller reads them
        return {"rope_type": kind}
    factor = file.arch("rope.scaling.factor")
    if factor is None:
        raise ValueError(f"{file.path}: {arch}.rope.scaling.type={kind!r} needs {arch}.rope.scaling.factor")
    out: dict[str, Any] = {"rope_type": kind, "factor": metadata_float(factor)}
    if kind == "yarn":
        original = file.arch("rope.scaling.original_context_length")
        if original is None:
            raise ValueError(f"{file.path}: YaRN scaling needs {arch}.rope.scaling.original_context_length")
        out["original_max_position_embeddings"] = int(original)
        for key, field in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow"),
                           ("yarn_attn_factor", "attention_factor")):
            if file.arch(f"rope.scaling.{key}") is not None:
                out[field] = metadata_float(file.arch(f"rope.scaling.{key}"))
        unread = [f"{arch}.rope.scaling.{k}" for k in ("yarn_ext_factor", "yarn_log_multiplier")
                  if file.arch(f"rope.scaling.{k}") is not None]
        if unread:
            raise ValueError(f"{file.path}: GGUF YaRN settings flaxzoo does not implement: {', '.join(unread)}")
    return out


def decoder_config(file: GGUFFile, names: Collection[str], *, architecture: str, model_type: str,
                   hidden_act: str = "silu", partial_rotary: bool = False,
                   scaling: Collection[str] = ("linear", "yarn")) -> dict[str, Any]:
    """The ``config.json`` fields every Llama-layout GGUF describes alike (``architecture``: the Hugging Face class
    name, e.g. ``"Qwen2ForCausalLM"``): sizes, RoPE base and scaling (the types in ``scaling``), RMSNorm epsilon,
    tied embeddings (no ``output.weight``), special token ids.

    ``head_dim`` is ``attention.key_length`` when written, else ``hidden / heads``. ``partial_rotary``: a
    ``rope.dimension_count`` below ``head_dim`` becomes ``partial_rotary_factor`` (else it is refused). Raises
    ValueError naming missing keys and what flaxzoo does not implement (experts, RoPE frequency factors, key and
    value heads of different sizes).
    """
    arch = file.architecture
    required = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")
    missing = [f"{arch}.{k}" for k in required if file.arch(k) is None]
    if missing:
        raise ValueError(f"{file.path}: GGUF metadata lacks {', '.join(missing)}")
    problems: list[str] = []

    def uniform(key: str, default: Any = None) -> Any:
        """``{arch}.{key}``; a per-layer array (some converters write one) only when every layer has one value."""
        value = file.arch(key, default)
        if isinstance(value, list):
            if len(set(value)) != 1:
                problems.append(f"{arch}.{key}={value} (layers of different sizes)")
            value = value[0] if value else default
        return value

    hidden, heads = int(file.arch("embedding_length")), int(uniform("attention.head_count"))
    kv_heads, intermediate = int(uniform("attention.head_count_kv", heads)), int(uniform("feed_forward_length"))
    head_dim = int(file.arch("attention.key_length", hidden // heads))
    if file.arch("expert_count", 0):
        problems.append(f"{arch}.expert_count={file.arch('expert_count')} (mixture of experts)")
    if "rope_freqs.weight" in names:
        problems.append("rope_freqs.weight (RoPE frequency factors)")
    value_dim = file.arch("attention.value_length", head_dim)
    if int(value_dim) != head_dim:
        problems.append(f"{arch}.attention.value_length={value_dim} (key_length is {head_dim})")
    rotary = int(file.arch("rope.dimension_count", head_dim))
    if rotary != head_dim and not (partial_rotary and 0 < rotary < head_dim and rotary % 2 == 0):
        problems.append(f"{arch}.rope.dimension_count={rotary} (head_dim is {head_dim})")
    if problems:
        raise ValueError(f"{file.path}: GGUF features flaxzoo does not implement: " + "; ".join(problems))
    out = {
        "architectures": [architecture], "model_type": model_type, "vocab_size": vocab_size(file),
        "hidden_size": hidden, "num_hidden_layers": int(file.arch("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "intermediate_size": intermediate,
        "max_position_embeddings": int(file.arch("context_length", 2048)),
        "rope_theta": metadata_float(file.arch("rope.freq_base", 10_000.0)),
        "rope_scaling": rope_scaling(file, allowed=scaling),
        "rms_norm_eps": metadata_float(file.arch("attention.layer_norm_rms_epsilon", 1e-6)),
        "hidden_act": hidden_act, "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": token_id(file, "bos_token_id"), "eos_token_id": token_id(file, "eos_token_id"),
        "pad_token_id": token_id(file, "padding_token_id"),
    }
    if rotary != head_dim:
        out["partial_rotary_factor"] = rotary / head_dim
    return out
