"""Llama: Hugging Face ``llama`` names and config ↔ flaxzoo ``GPTModel`` / ``GPTForCausalLM`` (RMSNorm, SwiGLU, RoPE,
grouped-query attention), and the same table under llama.cpp's GGUF names.

Dequantised GGUF projections are ``[out, in]`` like torch's, so the Llama table's transforms apply unchanged; only
the names differ (and Q/K rows are in the interleaved RoPE layout, which the config records: see ``models/gguf.py``).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any, Mapping

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.gpt import GPTForCausalLM, GPTModel
from flaxzoo.models.hub.fields import ACTIVATIONS_TO_HF, activation, common_from_hf
from flaxzoo.models.hub.mapping import Family, WeightMap, causal_lm_head, entry, layout, linear, norm, outside

LLAMA_LAYOUT = dict(causal=True, position="rope", norm="rmsnorm", norm_placement="pre", embedding_norm=False,
                    final_norm=True, mlp_gated=True, type_vocab_size=0)


def llama_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls`` (``base``: ``"model."``, or ``""`` for a bare ``LlamaModel`` checkpoint)."""
    h, kv, ab, mb = config.num_heads, config.num_kv_heads, config.attention_bias, config.mlp_bias
    stack = "decoder" if cls is GPTModel else "transformer.decoder"
    entries = [
        entry(f"{base}embed_tokens.weight", f"{stack}.embeddings.tokens.embedding"),
        *norm(f"{base}norm", f"{stack}.final_norm", bias=False),
    ]
    for i in range(config.num_layers):
        hf, fz = f"{base}layers.{i}", f"{stack}.layers.{i}"
        for hf_name, name, heads in (("q_proj", "query", h), ("k_proj", "key", kv), ("v_proj", "value", kv)):
            entries += linear(f"{hf}.self_attn.{hf_name}", f"{fz}.attention.{name}", ab,
                              layout("(h k) d", "d h k", h=heads), layout("(h k)", "h k", h=heads))
        entries += [
            *linear(f"{hf}.self_attn.o_proj", f"{fz}.attention.out", ab, layout("d (h k)", "h k d", h=h)),
            *norm(f"{hf}.input_layernorm", f"{fz}.attention_norm", bias=False),
            *norm(f"{hf}.post_attention_layernorm", f"{fz}.mlp_norm", bias=False),
            *linear(f"{hf}.mlp.gate_proj", f"{fz}.mlp.gate", mb),
            *linear(f"{hf}.mlp.up_proj", f"{fz}.mlp.up", mb),
            *linear(f"{hf}.mlp.down_proj", f"{fz}.mlp.down", mb),
        ]
    head, tied = causal_lm_head(config, cls, f"{base}embed_tokens.weight")
    entries += head
    # Old checkpoints store the RoPE frequencies.
    return WeightMap(entries, tied, ignored=(rf"{re.escape(base)}layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
                     optional=outside(entries, stack))


def rope_theta(hf: Mapping[str, Any]) -> float:
    """RoPE θ from ``rope_parameters`` (transformers v5) or top-level ``rope_theta`` (older); only plain RoPE."""
    params = hf.get("rope_parameters")
    if params is not None:
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"config.json: rope_parameters.rope_type={rope_type!r} is not supported by flaxzoo "
                             "(supported: ['default'], plain RoPE without scaling)")
        return float(params.get("rope_theta", hf.get("rope_theta", 10_000.0)))
    scaling = hf.get("rope_scaling")
    if scaling is not None:
        rope_type = scaling.get("rope_type", scaling.get("type"))
        if rope_type != "default":
            raise ValueError(f"config.json: rope_scaling={scaling!r} is not supported by flaxzoo "
                             "(supported: null or rope_type 'default')")
    return float(hf.get("rope_theta", 10_000.0))


def llama_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """Llama has attention-probability dropout (``attention_dropout``) and no residual dropout."""
    return TransformerConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], num_kv_heads=hf.get("num_key_value_heads"),
        head_dim=hf.get("head_dim"), intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf.get("max_position_embeddings", 2048), model_type="llama",
        rope_theta=rope_theta(hf), rope_layout="half", norm_eps=hf.get("rms_norm_eps", 1e-6),
        activation=activation(hf, "hidden_act", "silu"), attention_bias=hf.get("attention_bias", False),
        mlp_bias=hf.get("mlp_bias", False), tie_word_embeddings=hf.get("tie_word_embeddings", False), dropout=0.0,
        attention_dropout=hf.get("attention_dropout", 0.0), **LLAMA_LAYOUT, **common_from_hf(hf))


def llama_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The Llama fields; a residual ``dropout`` (which Hugging Face's Llama lacks) is not written, with a warning."""
    if config.dropout:
        warnings.warn(f"dropout={config.dropout} is not written: Hugging Face llama has no residual dropout (only "
                      "attention_dropout); the saved model trains without it", stacklevel=3)
    return {
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings, "rms_norm_eps": config.norm_eps,
        # transformers v5 reads rope_parameters, v4 the top-level rope_theta.
        "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"}, "rope_theta": config.rope_theta,
        "hidden_act": ACTIVATIONS_TO_HF[config.activation], "attention_bias": config.attention_bias,
        "mlp_bias": config.mlp_bias, "attention_dropout": config.attention_dropout, "pretraining_tp": 1,
    }


FAMILY = Family(
    model_type="llama", base_prefix="model",
    architectures={"LlamaModel": GPTModel, "LlamaForCausalLM": GPTForCausalLM},
    config_from_hf=llama_config_from_hf, config_to_hf=llama_config_to_hf, weights=llama_weights,
    layout=LLAMA_LAYOUT, base_class=GPTModel)


# ---------------------------------------------------------------------------- GGUF (llama.cpp) names of the tensors

# Hugging Face name (a regular expression) -> llama.cpp's name, as llama.cpp's convert_hf_to_gguf.py writes them.
GGUF_LLAMA_NAMES: tuple[tuple[str, str], ...] = (
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


def gguf_name(hf_name: str) -> str:
    """``"model.layers.3.self_attn.q_proj.weight"`` → ``"blk.3.attn_q.weight"``."""
    for pattern, replacement in GGUF_LLAMA_NAMES:
        if re.fullmatch(pattern, hf_name):
            return re.sub(pattern, replacement, hf_name)
    raise KeyError(f"no GGUF name for the Hugging Face tensor {hf_name}")


def gguf_llama_weights(config: TransformerConfig, cls: type) -> WeightMap:
    """The Llama table with llama.cpp's names. A GGUF has no base-model prefix; loading only the base model
    (``cls=GPTModel``) skips the output projection."""
    hf = llama_weights(config, cls, "model.")
    return WeightMap([dataclasses.replace(e, hf=gguf_name(e.hf)) for e in hf.entries],
                     {gguf_name(dup): gguf_name(source) for dup, source in hf.tied.items()},
                     ignored=() if cls is GPTForCausalLM else (r"output\.weight",),
                     optional=frozenset(gguf_name(name) for name in hf.optional))
