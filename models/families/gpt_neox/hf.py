"""GPT-NeoX / Pythia: Hugging Face ``gpt_neox`` names and config ↔ flaxzoo ``GPTModel`` / ``GPTForCausalLM``.

LayerNorms with biases, a plain (ungated) exact-GELU MLP with biases, RoPE on the first ``rotary_pct`` of each head
(0.25 when ``config.json`` names no fraction), untied ``embed_in`` / ``embed_out`` tables, and by default a parallel
residual (``use_parallel_residual``: ``x + attention(ln1(x)) + mlp(ln2(x))``; False: the sequential pre-LN block).
``attention.query_key_value`` fuses q, k and v per head: its rows are ``[heads, 3, head_dim]`` (each head's q, k and
v rows together, unlike Phi-3's ``[q rows; k rows; v rows]``). ``hidden_dropout`` drops the embeddings and each
branch's output: flaxzoo's ``dropout``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from flaxzoo.models.architectures.decoder.hf import PLAIN_MECHANISMS, classification_head, rope_from_hf, rope_to_hf
from flaxzoo.models.architectures.decoder.model import GPTForCausalLM, GPTForSequenceClassification, GPTModel
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import (BACKBONE, LINEAR, Entry, Family, WeightMap, entry, layout, linear, norm,
                                          outside)
from flaxzoo.models.families.fields import ACTIVATIONS_TO_HF, activation, common_from_hf, full_width_heads

GPT_NEOX_LAYOUT = dict(causal=True, position="rope", norm="layernorm", norm_placement="pre", embedding_norm=False,
                       final_norm=True, mlp_gated=False, mlp_bias=True, type_vocab_size=0, sliding_window=None,
                       layer_types=None,
                       **{k: v for k, v in PLAIN_MECHANISMS.items() if k != "parallel_residual"})
from flaxzoo.models.families.gpt_neox.presets import PRESETS

# GPTNeoXConfig's rotary fraction when config.json has neither ``rotary_pct`` nor ``partial_rotary_factor``.
DEFAULT_ROTARY_PCT = 0.25
HEAD = "embed_out.weight"  # the untied LM head, as checkpoints store it (transformers v5 calls it lm_head)


def gpt_neox_head(config: TransformerConfig, cls: type, base: str) -> tuple[list[Entry], dict[str, str]]:
    """The LM head of the causal-LM class: ``embed_out.weight`` (``[vocab, hidden]``), or tied to ``embed_in``."""
    if getattr(cls, "task", None) != "causal_lm":
        return [], {}
    if config.tie_word_embeddings:
        return [], {HEAD: f"{base}embed_in.weight"}
    return [entry(HEAD, "lm_head.kernel", LINEAR)], {}


def gpt_neox_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls`` (``base``: ``"gpt_neox."``, or ``""`` for a bare ``GPTNeoXModel`` checkpoint).

    ``query_key_value``: weight ``[heads · 3 · head_dim, hidden]``, bias ``[heads · 3 · head_dim]``, split into the
    query / key / value kernels ``[hidden, heads, head_dim]`` and biases ``[heads, head_dim]``."""
    h, stack, bias = config.num_heads, BACKBONE, config.attention_bias
    entries = [entry(f"{base}embed_in.weight", f"{stack}.embeddings.tokens.embedding"),
               *norm(f"{base}final_layer_norm", f"{stack}.final_norm")]
    for i in range(config.num_layers):
        hf, fz = f"{base}layers.{i}", f"{stack}.layers.{i}"
        qkv = [f"{fz}.attention.{name}" for name in ("query", "key", "value")]
        entries += [*norm(f"{hf}.input_layernorm", f"{fz}.attention_norm"),
                    *norm(f"{hf}.post_attention_layernorm", f"{fz}.mlp_norm"),
                    entry(f"{hf}.attention.query_key_value.weight", [f"{p}.kernel" for p in qkv],
                          layout("(h parts k) d", "parts d h k", parts=3, h=h))]
        if bias:
            entries.append(entry(f"{hf}.attention.query_key_value.bias", [f"{p}.bias" for p in qkv],
                                 layout("(h parts k)", "parts h k", parts=3, h=h)))
        entries += [*linear(f"{hf}.attention.dense", f"{fz}.attention.out", config.attention_out_bias,
                            layout("d (h k)", "h k d", h=h)),
                    *linear(f"{hf}.mlp.dense_h_to_4h", f"{fz}.mlp.up", True),
                    *linear(f"{hf}.mlp.dense_4h_to_h", f"{fz}.mlp.down", True)]
    head, tied = gpt_neox_head(config, cls, base)
    entries += head + classification_head(cls)
    # Old checkpoints store the causal-mask buffers and the RoPE frequencies; the other class's head is skipped.
    buffers = rf"{re.escape(base)}layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)"
    other = re.escape(HEAD) if getattr(cls, "task", None) == "sequence_classification" else r"score\.weight"
    return WeightMap(entries, tied, ignored=(buffers, other), optional=outside(entries))


def gpt_neox_rename(name: str) -> str:
    """transformers v5's own name of the LM head → the one checkpoints store."""
    return HEAD if name == "lm_head.weight" else name


def _names_rotary_fraction(hf: Mapping[str, Any]) -> bool:
    params = hf.get("rope_parameters")
    in_params = isinstance(params, Mapping) and params.get("partial_rotary_factor") is not None
    return in_params or hf.get("partial_rotary_factor") is not None or hf.get("rotary_pct") is not None


def gpt_neox_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """GPT-NeoX's ``config.json``: v5 ``rope_parameters``, or the older ``rotary_pct`` / ``rotary_emb_base`` /
    ``rope_scaling``; ``layer_norm_eps``, ``use_parallel_residual``, ``attention_bias`` (q/k/v and ``dense``; the
    MLP is always biased), ``hidden_dropout`` / ``attention_dropout``."""
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    if width % heads:
        raise ValueError(f"config.json: hidden_size={width} is not divisible by num_attention_heads={heads}")
    if not _names_rotary_fraction(hf):
        hf = {**hf, "rotary_pct": DEFAULT_ROTARY_PCT}
    max_positions = hf.get("max_position_embeddings", 2048)
    bias = hf.get("attention_bias", True)
    return TransformerConfig(
        vocab_size=hf["vocab_size"], hidden_size=width, num_layers=hf["num_hidden_layers"], num_heads=heads,
        intermediate_size=hf["intermediate_size"], max_position_embeddings=max_positions, model_type="gpt_neox",
        rope_layout="half", norm_eps=hf.get("layer_norm_eps", 1e-5), activation=activation(hf, "hidden_act", "gelu"),
        attention_bias=bias, attention_out_bias=bias, parallel_residual=hf.get("use_parallel_residual", True),
        tie_word_embeddings=hf.get("tie_word_embeddings", False), dropout=hf.get("hidden_dropout", 0.0),
        attention_dropout=hf.get("attention_dropout", 0.0), **rope_from_hf(hf, width // heads, max_positions),
        **GPT_NEOX_LAYOUT, **common_from_hf(hf))


def gpt_neox_save_problems(config: TransformerConfig) -> list[str]:
    problems = full_width_heads(config, "gpt_neox")
    if config.attention_out_bias != config.attention_bias:
        problems.append(f"attention_out_bias={config.attention_out_bias} (Hugging Face gpt_neox biases attention.dense "
                        f"as query_key_value: attention_bias={config.attention_bias})")
    return problems


def gpt_neox_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """v5's ``rope_parameters`` and, for older readers, ``rotary_pct`` / ``rotary_emb_base`` / ``rope_scaling``."""
    rope = rope_to_hf(config)
    return {
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings, "layer_norm_eps": config.norm_eps,
        "hidden_act": ACTIVATIONS_TO_HF[config.activation], "attention_bias": config.attention_bias,
        "use_parallel_residual": config.parallel_residual, "hidden_dropout": config.dropout,
        "attention_dropout": config.attention_dropout, "rope_parameters": rope["rope_parameters"],
        "rope_scaling": rope["rope_scaling"], "rotary_pct": config.rotary_fraction,
        "rotary_emb_base": config.rope_theta}


FAMILY = Family(
    model_type="gpt_neox", base_prefix="gpt_neox",
    architectures={"GPTNeoXModel": GPTModel, "GPTNeoXForCausalLM": GPTForCausalLM,
                   "GPTNeoXForSequenceClassification": GPTForSequenceClassification},
    config_from_hf=gpt_neox_config_from_hf, config_to_hf=gpt_neox_config_to_hf, weights=gpt_neox_weights,
    layout=GPT_NEOX_LAYOUT, save_problems=gpt_neox_save_problems, rename=gpt_neox_rename, presets=PRESETS)
