"""Llama in llama.cpp's GGUF files: the tensor names and the config the metadata describes.

Dequantised GGUF projections are ``[out, in]`` like torch's, so the Llama table's transforms apply unchanged; only
the names differ (and Q/K rows are in the interleaved RoPE layout, which the config records: see ``models/io/gguf.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Collection

import numpy as np

from flaxzoo.models.families.base import GGUFSpec

if TYPE_CHECKING:
    from flaxzoo.models.io.gguf import GGUFFile

# Hugging Face name (a regular expression) -> llama.cpp's name, as llama.cpp's convert_hf_to_gguf.py writes them.
NAMES: tuple[tuple[str, str], ...] = (
    (r"model\.embed_tokens\.weight", "token_embd.weight"),
    (r"model\.norm\.weight", "output_norm.weight"),
    (r"lm_head\.weight", "output.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"blk.\1.attn_norm.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"blk.\1.ffn_norm.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)", r"blk.\1.attn_q.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.(weight|bias)", r"blk.\1.attn_k.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.(weight|bias)", r"blk.\1.attn_v.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.(weight|bias)", r"blk.\1.attn_output.\2"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.(weight|bias)", r"blk.\1.ffn_gate.\2"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.(weight|bias)", r"blk.\1.ffn_up.\2"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.(weight|bias)", r"blk.\1.ffn_down.\2"),
)


def _float(value: Any) -> float:
    """A float32 metadata value as the decimal it was written from (``9.99999975e-06`` → ``1e-05``)."""
    return float(str(np.float32(value)))


def config_from_gguf(file: GGUFFile, names: Collection[str]) -> dict[str, Any]:
    """The Hugging Face ``config.json`` a Llama-architecture GGUF describes (``names``: its tensor names), in
    rotate-half terms (the loader switches the RoPE layout).

    Raises ValueError for Llama features flaxzoo does not implement (RoPE scaling, partial rotary dimensions,
    mixtures of experts).
    """
    names = set(names)
    required = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")
    missing = [f"llama.{k}" for k in required if file.arch(k) is None]
    if missing:
        raise ValueError(f"{file.path}: GGUF metadata lacks {', '.join(missing)}")
    hidden, heads = int(file.arch("embedding_length")), int(file.arch("attention.head_count"))
    head_dim = int(file.arch("attention.key_length", hidden // heads))
    problems = []
    if file.arch("expert_count", 0):
        problems.append(f"llama.expert_count={file.arch('expert_count')} (mixture of experts)")
    scaling = file.arch("rope.scaling.type", "none")
    if scaling not in ("none", None) or "rope_freqs.weight" in names:
        problems.append(f"llama.rope.scaling.type={scaling!r}" if scaling not in ("none", None) else
                        "rope_freqs.weight (RoPE frequency factors)")
    rotary = file.arch("rope.dimension_count", head_dim)
    if int(rotary) != head_dim:
        problems.append(f"llama.rope.dimension_count={rotary} (partial rotary; head_dim is {head_dim})")
    if problems:
        raise ValueError(f"{file.path}: GGUF features flaxzoo does not implement: " + "; ".join(problems))
    vocab = file.arch("vocab_size")
    if vocab is None:
        tokens = file.get("tokenizer.ggml.tokens")
        vocab = len(tokens) if tokens is not None else None
    if vocab is None:
        raise ValueError(f"{file.path}: GGUF metadata has neither llama.vocab_size nor tokenizer.ggml.tokens")
    token_id = lambda key: (None if file.get(f"tokenizer.ggml.{key}") is None  # noqa: E731
                            else int(file.get(f"tokenizer.ggml.{key}")))
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": int(vocab),
        "hidden_size": hidden, "num_hidden_layers": int(file.arch("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(file.arch("attention.head_count_kv", heads)), "head_dim": head_dim,
        "intermediate_size": int(file.arch("feed_forward_length")),
        "max_position_embeddings": int(file.arch("context_length", 2048)),
        "rope_theta": _float(file.arch("rope.freq_base", 10_000.0)),
        "rms_norm_eps": _float(file.arch("attention.layer_norm_rms_epsilon", 1e-5)),
        "hidden_act": "silu", "attention_bias": "blk.0.attn_q.bias" in names,
        "mlp_bias": "blk.0.ffn_up.bias" in names, "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": token_id("bos_token_id"), "eos_token_id": token_id("eos_token_id"),
        "pad_token_id": token_id("padding_token_id"),
    }


SPEC = GGUFSpec(architectures=("llama",), config=config_from_gguf, names=NAMES, tokenizers=("gpt2", "llama"))
