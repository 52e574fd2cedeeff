"""What the BART-layout families share (BART, mBART) in Hugging Face's files: the mechanisms, the per-layer table under
``encoder.layers.i.self_attn`` / ``fc1`` names, and the ``config.json`` fields (``d_model``, ``encoder_layers``,
``scale_embedding`` ...).

BART (Lewis et al., 2020) is post-norm; mBART (Liu et al., 2020) pre-norm with a final LayerNorm per stack. Both have
learned positions offset by 2 that number slots (``slot_positions``: transformers numbers every slot, padding
included), a LayerNorm after the embeddings, biases everywhere, exact GELU, the embeddings scaled by √d_model where
``scale_embedding`` says, one token table for both stacks and the LM head, and a vocabulary bias on the LM head
(``final_logits_bias``, a ``[1, vocab]`` buffer: trained here as a parameter, zero in every published checkpoint).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from flaxzoo.models.architectures.encoder_decoder.model import (Seq2SeqForConditionalGeneration,
                                                                Seq2SeqForSequenceClassification, Seq2SeqModel)
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import LINEAR, WeightMap, entry, layout, linear, norm
from flaxzoo.models.families.fields import ACTIVATIONS_TO_HF, activation, common_from_hf

# transformers' BartLearnedPositionalEmbedding: position of slot i is i + 2, the table has max_positions + 2 rows
POSITION_OFFSET = 2

BART_LAYOUT: dict[str, Any] = dict(
    causal=True, position="learned", position_offset=POSITION_OFFSET, slot_positions=True, norm="layernorm",
    norm_placement="post", embedding_norm=True, final_norm=False, attention_bias=True, attention_out_bias=True,
    mlp_bias=True, mlp_gated=False, norm_bias=True, query_scale=None, type_vocab_size=0, parallel_residual=False,
    qk_norm="none", norm_unit_offset=False, relative_attention=False, sliding_window=None, attention_softcap=None,
    final_logit_softcap=None, embedding_size=None, shared_layers=False, position_bias_buckets=None,
    scale_decoder_output=False, lm_head_bias=True, decoder_start_from_source=False)
# mBART: pre-norm, each stack's final LayerNorm (``encoder.layer_norm`` / ``decoder.layer_norm``), the classifier's
# decoder starting from the source's last real token (its language id)
MBART_LAYOUT: dict[str, Any] = dict(BART_LAYOUT, norm_placement="pre", final_norm=True,
                                    decoder_start_from_source=True)


def bart_architectures(prefix: str) -> dict[str, type]:
    """Hugging Face class names → flaxzoo classes (``{prefix}Model`` first)."""
    return {f"{prefix}Model": Seq2SeqModel, f"{prefix}ForConditionalGeneration": Seq2SeqForConditionalGeneration,
            f"{prefix}ForSequenceClassification": Seq2SeqForSequenceClassification}


def _attention(config: TransformerConfig, hf: str, fz: str) -> list:
    """q / k / v / out projections of one attention module (``[heads · head_dim, d_model]`` weights, biases)."""
    heads = config.num_heads
    entries = []
    for hf_name, name in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
        entries += linear(f"{hf}.{hf_name}", f"{fz}.{name}", True, layout("(h k) d", "d h k", h=heads),
                          layout("(h k)", "h k", h=heads))
    return entries + linear(f"{hf}.out_proj", f"{fz}.out", True, layout("d (h k)", "h k d", h=heads))


def _stack(config: TransformerConfig, hf: str, fz: str, depth: int, decoder: bool) -> list:
    """One stack's table (``hf``: ``model.encoder`` ...; ``fz``: ``encoder`` / ``decoder``): positions, embedding
    norm, layers, and mBART's final norm."""
    entries = [entry(f"{hf}.embed_positions.weight", f"{fz}.embeddings.positions.embedding"),
               *norm(f"{hf}.layernorm_embedding", f"{fz}.embeddings.norm")]
    for i in range(depth):
        hf_layer, fz_layer = f"{hf}.layers.{i}", f"{fz}.layers.{i}"
        entries += _attention(config, f"{hf_layer}.self_attn", f"{fz_layer}.attention")
        entries += norm(f"{hf_layer}.self_attn_layer_norm", f"{fz_layer}.attention_norm")
        if decoder:
            entries += _attention(config, f"{hf_layer}.encoder_attn", f"{fz_layer}.cross_attention")
            entries += norm(f"{hf_layer}.encoder_attn_layer_norm", f"{fz_layer}.cross_attention_norm")
        entries += [*linear(f"{hf_layer}.fc1", f"{fz_layer}.mlp.up", True),
                    *linear(f"{hf_layer}.fc2", f"{fz_layer}.mlp.down", True)]
        entries += norm(f"{hf_layer}.final_layer_norm", f"{fz_layer}.mlp_norm")
    if config.final_norm:
        entries += norm(f"{hf}.layer_norm", f"{fz}.final_norm")
    return entries


# Each class's own tensors outside the base model; a checkpoint of another class has its own, skipped on load
HEAD_TENSORS = {"seq2seq_lm": r"(lm_head\.weight|final_logits_bias)",
                "sequence_classification": r"classification_head\..*"}


def bart_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls`` (``base``: ``"model."`` for the head classes, ``""`` for a bare ``BartModel``). Both
    stacks' ``embed_tokens`` and a tied ``lm_head`` are ``shared`` again (transformers v5 may save only
    ``model.shared.weight``)."""
    entries = [entry(f"{base}shared.weight", "shared.embedding"),
               *_stack(config, f"{base}encoder", "encoder", config.num_layers, False),
               *_stack(config, f"{base}decoder", "decoder", config.num_decoder_layers, True)]
    tied = {f"{base}encoder.embed_tokens.weight": f"{base}shared.weight",
            f"{base}decoder.embed_tokens.weight": f"{base}shared.weight"}
    head: list = []
    if cls.task == "seq2seq_lm":
        head.append(entry("final_logits_bias", "lm_head.bias", layout("1 v", "v")))
        if config.tie_word_embeddings:
            tied["lm_head.weight"] = f"{base}shared.weight"
        else:
            head.append(entry("lm_head.weight", "lm_head.kernel", LINEAR))
    elif cls.task == "sequence_classification":
        head += [*linear("classification_head.dense", "pooler", True),
                 *linear("classification_head.out_proj", "score", True)]
    ignored = tuple(pattern for task, pattern in HEAD_TENSORS.items() if task != cls.task)
    return WeightMap(entries + head, tied=tied, ignored=ignored, optional=frozenset(e.hf for e in head))


def _same_in_both_stacks(hf: Mapping[str, Any], encoder_field: str, decoder_field: str, default: int) -> int:
    """A size transformers gives each stack that flaxzoo's one config holds once; ValueError where they differ."""
    encoder, decoder = hf.get(encoder_field, default), hf.get(decoder_field, default)
    if encoder != decoder:
        raise ValueError(f"config.json: {encoder_field}={encoder} and {decoder_field}={decoder}: flaxzoo's "
                         "encoder-decoder has one size for both stacks (expected them equal)")
    return encoder


def bart_config_from_hf(hf: Mapping[str, Any], model_type: str, family_layout: Mapping[str, Any]) -> TransformerConfig:
    """A BART-layout ``config.json`` → ``TransformerConfig`` (``family_layout``: :data:`BART_LAYOUT` or
    :data:`MBART_LAYOUT`). The start id is ``decoder_start_token_id``, else ``bos_token_id`` (mBART's files have
    none: transformers' ``generate`` then starts from the BOS id)."""
    d_model = hf.get("d_model", 1024)
    common = common_from_hf(hf)
    start = hf.get("decoder_start_token_id")
    start = common.get("bos_token_id") if start is None else start
    return TransformerConfig(
        vocab_size=hf["vocab_size"], hidden_size=d_model, num_layers=hf.get("encoder_layers", 12),
        num_decoder_layers=hf.get("decoder_layers", 12),
        num_heads=_same_in_both_stacks(hf, "encoder_attention_heads", "decoder_attention_heads", 16),
        intermediate_size=_same_in_both_stacks(hf, "encoder_ffn_dim", "decoder_ffn_dim", 4096),
        max_position_embeddings=hf.get("max_position_embeddings", 1024) + POSITION_OFFSET, model_type=model_type,
        activation=activation(hf, "activation_function", "gelu"), norm_eps=1e-5,
        embedding_multiplier=math.sqrt(d_model) if hf.get("scale_embedding", False) else 1.0,
        dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("attention_dropout", 0.0),
        tie_word_embeddings=hf.get("tie_word_embeddings", True) is not False, decoder_start_token_id=start,
        **(common | {"initializer_range": hf.get("init_std", 0.02)}), **family_layout)


def bart_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The ``config.json`` fields of a BART-layout model."""
    return {"vocab_size": config.vocab_size, "d_model": config.hidden_size, "encoder_layers": config.num_layers,
            "decoder_layers": config.num_decoder_layers, "encoder_attention_heads": config.num_heads,
            "decoder_attention_heads": config.num_heads, "encoder_ffn_dim": config.intermediate_size,
            "decoder_ffn_dim": config.intermediate_size,
            "max_position_embeddings": config.max_position_embeddings - POSITION_OFFSET,
            "activation_function": ACTIVATIONS_TO_HF.get(config.activation), "dropout": config.dropout,
            "attention_dropout": config.attention_dropout, "activation_dropout": 0.0, "classifier_dropout": 0.0,
            "init_std": config.initializer_range, "scale_embedding": config.embedding_multiplier != 1.0,
            "is_encoder_decoder": True, "decoder_start_token_id": config.decoder_start_token_id,
            "num_labels": config.num_labels}


def bart_save_problems(config: TransformerConfig) -> list[str]:
    """What transformers' BART-layout classes cannot express."""
    problems = []
    if config.num_kv_heads != config.num_heads:
        problems.append(f"num_kv_heads={config.num_kv_heads} (BART attention has num_heads={config.num_heads} key / "
                        "value heads)")
    if config.head_dim * config.num_heads != config.hidden_size:
        problems.append(f"head_dim={config.head_dim} with num_heads={config.num_heads} (BART's heads split "
                        f"d_model={config.hidden_size})")
    if config.embedding_multiplier not in (1.0, math.sqrt(config.hidden_size)):
        problems.append(f"embedding_multiplier={config.embedding_multiplier} (scale_embedding gives 1 or "
                        f"sqrt(d_model)={math.sqrt(config.hidden_size):.4g})")
    if not config.is_encoder_decoder:
        problems.append("an encoder-decoder config (num_decoder_layers set)")
    if config.norm_eps != 1e-5:
        problems.append(f"norm_eps={config.norm_eps} (BART's LayerNorms use 1e-5)")
    return problems


def bart_preset(family_layout: Mapping[str, Any], **fields: Any) -> TransformerConfig:
    """A BART-layout preset: ``family_layout`` with BART's defaults and ids, ``fields`` (``max_position_embeddings``
    as ``config.json`` gives it: the offset is added here) replacing or adding to them."""
    fields["max_position_embeddings"] = fields.get("max_position_embeddings", 1024) + POSITION_OFFSET
    fields.setdefault("num_decoder_layers", fields["num_layers"])
    defaults = dict(vocab_size=50265, activation="gelu", norm_eps=1e-5, embedding_multiplier=1.0, dropout=0.1,
                    attention_dropout=0.0, tie_word_embeddings=True, pad_token_id=1, bos_token_id=0,
                    eos_token_id=2, decoder_start_token_id=2, initializer_range=0.02, num_labels=3)
    return TransformerConfig(**(defaults | dict(family_layout) | fields))
