"""ModernBERT: Hugging Face ``modernbert`` names and config ↔ flaxzoo's ModernBERT classes.

Hugging Face fuses the attention's q / k / v into ``attn.Wqkv`` (``[3 · hidden, hidden]``, q rows first) and the
GeGLU's two input projections into ``mlp.Wi`` (``[2 · intermediate, hidden]``): its first half goes through the
activation (flaxzoo's ``mlp.gate``), the second multiplies it (``mlp.up``). Local layers see ``|i - j| <=
local_attention // 2``: flaxzoo's bidirectional ``sliding_window = local_attention // 2 + 1``. Layer 0 has no
attention norm; flaxzoo's layer 0 keeps one (unused, :class:`~.model.ModernBertBlock`) that is filled with, and never
written back over, the embedding norm's values.
"""

from __future__ import annotations

from typing import Any, Mapping

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import (BACKBONE, LINEAR, Family, Transform, WeightMap, entry, layout, linear, norm,
                                          outside)
from flaxzoo.models.families.fields import (ACTIVATIONS_TO_HF, activation, common_from_hf, common_to_hf,
                                            full_width_heads, refuse)
from flaxzoo.models.families.modernbert.model import (ModernBertForMaskedLM, ModernBertForQuestionAnswering,
                                                      ModernBertForSequenceClassification,
                                                      ModernBertForTokenClassification, ModernBertModel)
from flaxzoo.models.families.modernbert.presets import PRESETS

MODERNBERT_LAYOUT = dict(causal=False, position="rope", rope_layout="half", norm="layernorm", norm_placement="pre",
                         embedding_norm=True, final_norm=True, mlp_gated=True, type_vocab_size=0, position_offset=0,
                         parallel_residual=False, qk_norm="none", rope_scaling=None, rotary_fraction=1.0)
HEADS = (ModernBertForSequenceClassification, ModernBertForTokenClassification, ModernBertForQuestionAnswering)
# One Hugging Face tensor filling two flaxzoo parameters with the same values; saving writes the first.
_COPY = Transform(to_flax=lambda w: (w, w), to_hf=lambda first, _second: first)


def modernbert_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls`` (``base``: ``"model."``, or ``""`` for a bare ``ModernBertModel`` checkpoint)."""
    h, f, enc, bias = config.num_heads, config.intermediate_size, BACKBONE, config.norm_bias
    emb_norm = f"{enc}.embeddings.norm"
    first_norm = f"{enc}.layers.0.attention_norm"
    entries = [entry(f"{base}embeddings.tok_embeddings.weight", f"{enc}.embeddings.tokens.embedding"),
               entry(f"{base}embeddings.norm.weight", [f"{emb_norm}.scale", f"{first_norm}.scale"], _COPY),
               *norm(f"{base}final_norm", f"{enc}.final_norm", bias)]
    if bias:
        entries.append(entry(f"{base}embeddings.norm.bias", [f"{emb_norm}.bias", f"{first_norm}.bias"], _COPY))
    qkv = [f"{enc}.layers.{{i}}.attention.{name}" for name in ("query", "key", "value")]
    for i in range(config.num_layers):
        hf, fz = f"{base}layers.{i}", f"{enc}.layers.{i}"
        if i:
            entries += norm(f"{hf}.attn_norm", f"{fz}.attention_norm", bias)
        entries.append(entry(f"{hf}.attn.Wqkv.weight", [f"{p.format(i=i)}.kernel" for p in qkv],
                             layout("(parts h k) d", "parts d h k", parts=3, h=h)))
        if config.attention_bias:
            entries.append(entry(f"{hf}.attn.Wqkv.bias", [f"{p.format(i=i)}.bias" for p in qkv],
                                 layout("(parts h k)", "parts h k", parts=3, h=h)))
        entries += linear(f"{hf}.attn.Wo", f"{fz}.attention.out", config.attention_bias,
                          layout("d (h k)", "h k d", h=h))
        entries += norm(f"{hf}.mlp_norm", f"{fz}.mlp_norm", bias)
        entries.append(entry(f"{hf}.mlp.Wi.weight", [f"{fz}.mlp.gate.kernel", f"{fz}.mlp.up.kernel"],
                             layout("(parts f) d", "parts d f", parts=2, f=f)))
        if config.mlp_bias:
            entries.append(entry(f"{hf}.mlp.Wi.bias", [f"{fz}.mlp.gate.bias", f"{fz}.mlp.up.bias"],
                                 layout("(parts f)", "parts f", parts=2, f=f)))
        entries += linear(f"{hf}.mlp.Wo", f"{fz}.mlp.down", config.mlp_bias)
    ignored = []
    tied: dict[str, str] = {}
    if cls in HEADS:
        entries += [*linear("head.dense", "head.dense", config.head_bias), *norm("head.norm", "head.norm", bias),
                    *linear("classifier", "classifier", True)]
    else:
        ignored += [r"classifier\.(weight|bias)"] + ([] if cls is ModernBertForMaskedLM else [r"head\..*"])
    if cls is ModernBertForMaskedLM:
        entries += [*linear("head.dense", "transform", config.head_bias), *norm("head.norm", "transform_norm", bias)]
        if config.decoder_bias:
            entries.append(entry("decoder.bias", "decoder.bias"))
        if config.tie_word_embeddings:
            tied["decoder.weight"] = f"{base}embeddings.tok_embeddings.weight"
        else:
            entries.append(entry("decoder.weight", "decoder.kernel", LINEAR))
    else:
        ignored.append(r"decoder\.(weight|bias)")
    return WeightMap(entries, tied, {}, tuple(ignored), outside(entries))


def layer_types_from_hf(hf: Mapping[str, Any]) -> tuple[str, ...]:
    """``layer_types`` as written (transformers v5), else every ``global_attn_every_n_layers``-th layer global
    (layer 0 first; default 3), the others sliding."""
    n = hf["num_hidden_layers"]
    if hf.get("layer_types"):
        return tuple(hf["layer_types"])
    every = hf.get("global_attn_every_n_layers", 3)
    return tuple("sliding_attention" if i % every else "full_attention" for i in range(n))


def _theta(hf: Mapping[str, Any], kind: str, old_field: str, default: float) -> float:
    params = (hf.get("rope_parameters") or {}).get(kind) or {}
    refuse(params, "rope_type", ["default"], "default")
    return float(params.get("rope_theta", hf.get(old_field, default)))


def modernbert_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """``config.json`` (transformers v5's ``layer_types`` / ``rope_parameters``, or the Hub files'
    ``global_attn_every_n_layers`` / ``global_rope_theta`` / ``local_rope_theta``) → ``TransformerConfig``."""
    hf = {"pad_token_id": 50283, "bos_token_id": 50281, "eos_token_id": 50282} | dict(hf)
    if hf.get("rope_scaling"):
        raise ValueError(f"config.json: rope_scaling={hf['rope_scaling']!r} is not supported by flaxzoo's "
                         "ModernBERT (supported: None)")
    refuse(hf, "classifier_pooling", ["cls", "mean"], "cls")
    dropouts = {name: hf.get(name, 0.0) for name in ("embedding_dropout", "mlp_dropout", "classifier_dropout")}
    if len({rate for rate in dropouts.values() if rate}) > 1:
        raise ValueError(f"config.json: {', '.join(f'{k}={v}' for k, v in dropouts.items())}: flaxzoo has one "
                         "residual / embedding / classifier dropout rate; expected the non-zero ones equal")
    return TransformerConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf.get("max_position_embeddings", 8192), model_type="modernbert",
        rope_theta=_theta(hf, "full_attention", "global_rope_theta", 160_000.0),
        rope_local_theta=_theta(hf, "sliding_attention", "local_rope_theta", 10_000.0),
        norm_eps=hf.get("norm_eps", 1e-5), norm_bias=hf.get("norm_bias", False),
        activation=activation(hf, "hidden_activation", "gelu"),
        pooler_activation=activation(hf, "classifier_activation", "gelu"),
        attention_bias=hf.get("attention_bias", False), mlp_bias=hf.get("mlp_bias", False),
        head_bias=hf.get("classifier_bias", False), decoder_bias=hf.get("decoder_bias", True),
        classifier_pooling=hf.get("classifier_pooling", "cls"), tie_word_embeddings=hf.get("tie_word_embeddings", True),
        # flaxzoo has one residual / embedding / classifier dropout rate: Hugging Face's non-zero one
        dropout=max(dropouts.values()), attention_dropout=hf.get("attention_dropout", 0.0),
        sliding_window=hf.get("local_attention", 128) // 2 + 1, layer_types=layer_types_from_hf(hf),
        **MODERNBERT_LAYOUT, **common_from_hf(hf))


def modernbert_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The ``config.json`` fields of ``ModernBertConfig``."""
    return {
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "hidden_activation": ACTIVATIONS_TO_HF[config.activation], "norm_eps": config.norm_eps,
        "norm_bias": config.norm_bias, "attention_bias": config.attention_bias, "mlp_bias": config.mlp_bias,
        "classifier_bias": config.head_bias, "decoder_bias": config.decoder_bias,
        "classifier_activation": ACTIVATIONS_TO_HF[config.pooler_activation],
        "classifier_pooling": config.classifier_pooling, "attention_dropout": config.attention_dropout,
        "embedding_dropout": config.dropout, "mlp_dropout": config.dropout, "classifier_dropout": config.dropout,
        "local_attention": 2 * ((config.sliding_window or 1) - 1),
        "layer_types": list(config.layer_types or ("full_attention",) * config.num_layers),
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": config.rope_theta},
                            "sliding_attention": {"rope_type": "default",
                                                  "rope_theta": config.rope_local_theta or config.rope_theta}},
        "cls_token_id": config.bos_token_id, "sep_token_id": config.eos_token_ids[0] if config.eos_token_ids else None,
        **common_to_hf(config),
    }


def modernbert_save_problems(config: TransformerConfig) -> list[str]:
    """Full-width heads; a tanh head activation (``ACT2FN`` has it, flaxzoo's activation table not); a window on
    every layer without ``layer_types``, and an even window (``local_attention`` is written as ``2 · (W - 1)``)."""
    problems = full_width_heads(config, "modernbert")
    if config.pooler_activation not in ACTIVATIONS_TO_HF:
        problems.append(f"pooler_activation={config.pooler_activation!r} (expected one of {sorted(ACTIVATIONS_TO_HF)})")
    if config.sliding_window is not None and config.layer_types is None:
        problems.append("sliding_window without layer_types (Hugging Face modernbert names each layer's kind)")
    if config.sliding_window is None and config.layer_types is not None and "sliding_attention" in config.layer_types:
        problems.append("sliding layers without a sliding_window")
    return problems


FAMILY = Family(
    model_type="modernbert", base_prefix="model",
    architectures={"ModernBertModel": ModernBertModel, "ModernBertForMaskedLM": ModernBertForMaskedLM,
                   "ModernBertForSequenceClassification": ModernBertForSequenceClassification,
                   "ModernBertForTokenClassification": ModernBertForTokenClassification,
                   "ModernBertForQuestionAnswering": ModernBertForQuestionAnswering},
    config_from_hf=modernbert_config_from_hf, config_to_hf=modernbert_config_to_hf, weights=modernbert_weights,
    layout=MODERNBERT_LAYOUT, save_problems=modernbert_save_problems, presets=PRESETS)
