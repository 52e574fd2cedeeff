"""What the T5-layout families share (T5 v1.0 / v1.1 / Flan-T5, mT5, umT5) in Hugging Face's files: the per-layer
table under ``encoder.block.i.layer.j`` names and the ``config.json`` fields (``d_model``, ``d_kv``,
``feed_forward_proj``, the relative-attention buckets)."""

from __future__ import annotations

from typing import Any, Mapping

from flaxzoo.models.architectures.encoder_decoder.model import (Seq2SeqEncoderModel, Seq2SeqForConditionalGeneration,
                                                                Seq2SeqModel)
from flaxzoo.models.architectures.encoder_decoder.config import T5_LAYOUT
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import LINEAR, WeightMap, entry, layout, linear, norm
from flaxzoo.models.families.fields import common_from_hf

# transformers' feed_forward_proj → (activation, gated); "gated-gelu" is the tanh GELU (gelu_new), as it maps it
FEED_FORWARD_FROM_HF = {"relu": ("relu", False), "gelu": ("gelu", False), "gelu_new": ("gelu_tanh", False),
                        "silu": ("silu", False), "gated-gelu": ("gelu_tanh", True),
                        "gated-gelu_new": ("gelu_tanh", True),
                        "gated-relu": ("relu", True), "gated-silu": ("silu", True)}
FEED_FORWARD_TO_HF = {("relu", False): "relu", ("gelu", False): "gelu", ("gelu_tanh", False): "gelu_new",
                      ("silu", False): "silu", ("gelu_tanh", True): "gated-gelu", ("relu", True): "gated-relu",
                      ("silu", True): "gated-silu"}


def t5_architectures(prefix: str) -> dict[str, type]:
    """Hugging Face class names → flaxzoo classes (``{prefix}Model``, ``...ForConditionalGeneration``,
    ``...EncoderModel``)."""
    return {f"{prefix}Model": Seq2SeqModel, f"{prefix}ForConditionalGeneration": Seq2SeqForConditionalGeneration,
            f"{prefix}EncoderModel": Seq2SeqEncoderModel}


def _attention(hf: str, fz: str, heads: int) -> list:
    """q / k / v / o of one T5 attention module (``[heads · d_kv, d_model]`` weights, no biases)."""
    entries = []
    for hf_name, name in (("q", "query"), ("k", "key"), ("v", "value")):
        entries += linear(f"{hf}.{hf_name}", f"{fz}.{name}", False, layout("(h k) d", "d h k", h=heads))
    return entries + linear(f"{hf}.o", f"{fz}.out", False, layout("d (h k)", "h k d", h=heads))


def _feed_forward(config: TransformerConfig, hf: str, fz: str) -> list:
    """``wi`` (or gated ``wi_0`` / ``wi_1``) and ``wo``."""
    if config.mlp_gated:
        entries = [*linear(f"{hf}.wi_0", f"{fz}.gate", False), *linear(f"{hf}.wi_1", f"{fz}.up", False)]
    else:
        entries = linear(f"{hf}.wi", f"{fz}.up", False)
    return entries + linear(f"{hf}.wo", f"{fz}.down", False)


def _stack(config: TransformerConfig, name: str, depth: int, decoder: bool) -> list:
    """The table of one stack (``encoder`` / ``decoder``): its layers, bias table(s) and final norm."""
    bias = "relative_attention_bias.weight"
    entries = [] if config.position_bias_per_layer else [
        entry(f"{name}.block.0.layer.0.SelfAttention.{bias}", f"{name}.position_bias.embedding")]
    for i in range(depth):
        hf, fz = f"{name}.block.{i}.layer", f"{name}.layers.{i}"
        entries += _attention(f"{hf}.0.SelfAttention", f"{fz}.attention", config.num_heads)
        if config.position_bias_per_layer:
            entries.append(entry(f"{hf}.0.SelfAttention.{bias}", f"{fz}.attention.position_bias.embedding"))
        entries += norm(f"{hf}.0.layer_norm", f"{fz}.attention_norm", bias=False)
        if decoder:
            entries += _attention(f"{hf}.1.EncDecAttention", f"{fz}.cross_attention", config.num_heads)
            entries += norm(f"{hf}.1.layer_norm", f"{fz}.cross_attention_norm", bias=False)
        feed_forward = f"{hf}.{2 if decoder else 1}"
        entries += _feed_forward(config, f"{feed_forward}.DenseReluDense", f"{fz}.mlp")
        entries += norm(f"{feed_forward}.layer_norm", f"{fz}.mlp_norm", bias=False)
    return entries + norm(f"{name}.final_layer_norm", f"{name}.final_norm", bias=False)


def t5_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls``. T5's head classes hold ``shared``, ``encoder`` and ``decoder`` at the top level, so
    ``base`` is not used; each stack's ``embed_tokens`` is ``shared`` again."""
    entries = [entry("shared.weight", "shared.embedding"), *_stack(config, "encoder", config.num_layers, False)]
    tied = {"encoder.embed_tokens.weight": "shared.weight"}
    # old checkpoints hold a cross-attention bias table transformers never reads
    ignored = [r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight"]
    optional: frozenset[str] = frozenset()
    if cls is Seq2SeqEncoderModel:
        ignored += [r"decoder\..*", r"lm_head\.weight"]
    else:
        entries += _stack(config, "decoder", config.num_decoder_layers, True)
        tied["decoder.embed_tokens.weight"] = "shared.weight"
        if cls is Seq2SeqForConditionalGeneration and config.tie_word_embeddings:
            tied["lm_head.weight"] = "shared.weight"
        elif cls is Seq2SeqForConditionalGeneration:
            entries.append(entry("lm_head.weight", "lm_head.kernel", LINEAR))
            optional = frozenset({"lm_head.weight"})
        else:
            ignored.append(r"lm_head\.weight")
    return WeightMap(entries, tied=tied, ignored=tuple(ignored), optional=optional)


def t5_config_from_hf(hf: Mapping[str, Any], model_type: str, *, scale_decoder_output: bool | None = None,
                      per_layer_bias: bool = False) -> TransformerConfig:
    """A T5-layout ``config.json`` → ``TransformerConfig``. ``scale_decoder_output``: the family's rule when given
    (mT5 never scales), else transformers' T5 / umT5 rule (``scale_decoder_outputs``, or else whether
    ``tie_word_embeddings`` is not false)."""
    projection = hf.get("feed_forward_proj", "relu")
    if projection not in FEED_FORWARD_FROM_HF:
        raise ValueError(f"config.json: feed_forward_proj={projection!r} is not supported; expected one of "
                         f"{sorted(FEED_FORWARD_FROM_HF)}")
    activation, gated = FEED_FORWARD_FROM_HF[projection]
    tied = hf.get("tie_word_embeddings", True) is not False
    if scale_decoder_output is None:
        scale_decoder_output = bool(hf.get("scale_decoder_outputs", tied))
    num_layers = hf.get("num_layers", 6)
    common = common_from_hf(hf)
    pad = common.get("pad_token_id")
    start = hf.get("decoder_start_token_id", pad)
    return TransformerConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf.get("d_model", 512), head_dim=hf.get("d_kv", 64),
        intermediate_size=hf.get("d_ff", 2048), num_layers=num_layers,
        num_decoder_layers=hf.get("num_decoder_layers") or num_layers, num_heads=hf.get("num_heads", 8),
        model_type=model_type, activation=activation, mlp_gated=gated, norm_eps=hf.get("layer_norm_epsilon", 1e-6),
        dropout=hf.get("dropout_rate", 0.1), attention_dropout=hf.get("dropout_rate", 0.1),
        max_position_embeddings=hf.get("n_positions", 512),
        position_bias_buckets=hf.get("relative_attention_num_buckets", 32),
        position_bias_max_distance=hf.get("relative_attention_max_distance", 128),
        position_bias_per_layer=per_layer_bias, tie_word_embeddings=tied,
        scale_decoder_output=scale_decoder_output, decoder_start_token_id=start, **T5_LAYOUT, **common)


def t5_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The ``config.json`` fields of a T5-layout model (the family adds its own)."""
    return {"vocab_size": config.vocab_size, "d_model": config.hidden_size, "d_kv": config.head_dim,
            "d_ff": config.intermediate_size, "num_layers": config.num_layers,
            "num_decoder_layers": config.num_decoder_layers, "num_heads": config.num_heads,
            "relative_attention_num_buckets": config.position_bias_buckets,
            "relative_attention_max_distance": config.position_bias_max_distance,
            "dropout_rate": config.dropout, "layer_norm_epsilon": config.norm_eps,
            "feed_forward_proj": FEED_FORWARD_TO_HF.get((config.activation, config.mlp_gated)),
            "is_encoder_decoder": True, "decoder_start_token_id": config.decoder_start_token_id,
            "scale_decoder_outputs": config.scale_decoder_output}


def head_from_tensors(config: TransformerConfig, names) -> TransformerConfig:
    """A checkpoint holding its own ``lm_head.weight`` has an untied head, one without it a tied one: transformers
    5 writes ``tie_word_embeddings=true`` into every T5 ``config.json`` and unties a head whose tensor the checkpoint
    holds (Flan-T5 re-saved by it)."""
    return config.replace(tie_word_embeddings="lm_head.weight" not in names)


def t5_save_problems(config: TransformerConfig) -> list[str]:
    """What transformers' T5-layout classes cannot express."""
    problems = []
    if (config.activation, config.mlp_gated) not in FEED_FORWARD_TO_HF:
        problems.append(f"activation={config.activation!r} with mlp_gated={config.mlp_gated} (transformers' "
                        f"feed_forward_proj has {sorted(set(FEED_FORWARD_TO_HF.values()))})")
    if config.num_kv_heads != config.num_heads:
        problems.append(f"num_kv_heads={config.num_kv_heads} (T5 attention has num_heads={config.num_heads} key / "
                        "value heads)")
    if not config.is_encoder_decoder or not config.position_bias_buckets:
        problems.append("an encoder-decoder config with position_bias_buckets (T5's relative bias)")
    if config.attention_dropout != config.dropout:
        problems.append(f"attention_dropout={config.attention_dropout} with dropout={config.dropout} (T5 has one "
                        "dropout_rate for both)")
    return problems
