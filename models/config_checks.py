"""The checks a ``TransformerConfig`` passes at construction (:func:`validate`), and the values its fields may take.
Each failure is a :class:`FieldError` naming the field, the value and what was expected. A few values are normalised
on the way (a list from JSON to a tuple, ``attention_out_bias`` following ``attention_bias`` when unset). ``config``
is a ``TransformerConfig`` (not imported here: ``flaxzoo.models.config`` imports this module)."""

from __future__ import annotations

from typing import Any

POSITION_SCHEMES = ("learned", "sinusoidal", "rope", "alibi", "none")
ROPE_LAYOUTS = ("half", "interleaved")
NORMS = ("layernorm", "rmsnorm")
NORM_PLACEMENTS = ("pre", "post", "sandwich", "post_branch")
QK_NORMS = ("none", "head", "full")
LAYER_TYPES = ("full_attention", "sliding_attention")
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu")
DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "dots")
ATTENTION_IMPLS = ("auto", "softmax", "fused", "splash", "gpu_flash")
RELATIVE_ATTENTION_TYPES = ("c2p", "p2c")  # DeBERTa's content→position and position→content scores
CLASSIFIER_POOLINGS = ("cls", "mean")


class FieldError(ValueError):
    """A ``TransformerConfig`` value that cannot work; ``field`` names the field (the message: the value and what
    was expected)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def validate(config: Any) -> None:
    """Every check, in order: sizes, dtypes and choices, token ids, then the three groups below."""
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                 "num_kv_heads", "head_dim", "max_position_embeddings", "num_labels"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise FieldError(name, f"{name}={value!r}: expected a positive integer")
    if not isinstance(config.pad_vocab_to, int) or isinstance(config.pad_vocab_to, bool) or config.pad_vocab_to < 1:
        raise FieldError("pad_vocab_to", f"pad_vocab_to={config.pad_vocab_to!r}: expected a positive integer "
                         "(the multiple the vocabulary tables' rows are rounded up to; 1 = no padding)")
    if config.num_heads % config.num_kv_heads != 0:
        raise FieldError(
            "num_kv_heads", f"num_kv_heads={config.num_kv_heads} does not divide num_heads={config.num_heads}; "
            "expected a divisor of num_heads (grouped-query attention)"
        )
    choices = {
        "position": POSITION_SCHEMES, "rope_layout": ROPE_LAYOUTS, "norm": NORMS,
        "norm_placement": NORM_PLACEMENTS, "activation": ACTIVATIONS,
        "dtype": DTYPES, "param_dtype": DTYPES, "remat": REMAT_POLICIES,
        "attention_impl": ATTENTION_IMPLS, "qk_norm": QK_NORMS,
        "pooler_activation": ("tanh", *ACTIVATIONS), "classifier_pooling": CLASSIFIER_POOLINGS,
    }
    # The families live above this module (``flaxzoo.models.families``); which ``model_type`` names a
    # registered family is checked where one is needed (``families.family_of``, the training config).
    if not isinstance(config.model_type, str) or not config.model_type.strip():
        raise FieldError("model_type", f"model_type={config.model_type!r}: expected a family name such as 'gpt2'")
    for name, allowed in choices.items():
        if getattr(config, name) not in allowed:
            raise FieldError(name, f"{name}={getattr(config, name)!r}: expected one of {allowed}")
    if config.position == "rope" and config.head_dim % 2 != 0:
        raise FieldError("head_dim", f"head_dim={config.head_dim}: RoPE needs an even head dimension")
    if config.position == "sinusoidal" and config.hidden_size % 2 != 0:
        raise FieldError("hidden_size", f"hidden_size={config.hidden_size}: sinusoidal positions need an even width")
    if config.embedding_size is not None and (not isinstance(config.embedding_size, int) or
                                            isinstance(config.embedding_size, bool) or config.embedding_size < 1):
        raise FieldError("embedding_size", f"embedding_size={config.embedding_size!r}: expected a positive integer "
                         "(the factorised embedding width) or None (the tables are hidden_size wide)")
    if not isinstance(config.shared_layers, bool):
        raise FieldError("shared_layers", f"shared_layers={config.shared_layers!r}: expected True or False")
    if not isinstance(config.scan_layers, bool):
        raise FieldError("scan_layers", f"scan_layers={config.scan_layers!r}: expected True or False")
    for name in ("dropout", "attention_dropout"):
        rate = getattr(config, name)
        if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0.0 <= rate < 1.0:
            raise FieldError(name, f"{name}={rate!r}: expected a rate in [0, 1)")
    if not isinstance(config.position_offset, int) or isinstance(config.position_offset, bool) or \
            config.position_offset < 0:
        raise FieldError("position_offset", f"position_offset={config.position_offset!r}: expected an integer >= 0")
    if config.position_offset and config.position not in ("learned", "sinusoidal"):
        raise FieldError("position_offset", f"position_offset={config.position_offset} needs absolute positions "
                         f"(learned or sinusoidal); got position={config.position!r}")
    if config.position_offset and config.position_offset >= config.max_position_embeddings:
        raise FieldError("position_offset", f"position_offset={config.position_offset}: expected less than "
                         f"max_position_embeddings={config.max_position_embeddings}")
    if config.norm_eps <= 0:
        raise FieldError("norm_eps", f"norm_eps={config.norm_eps}: expected a positive number")
    if config.type_vocab_size < 0:
        raise FieldError("type_vocab_size", f"type_vocab_size={config.type_vocab_size}: expected >= 0")
    if isinstance(config.eos_token_id, list):
        object.__setattr__(config, "eos_token_id", tuple(config.eos_token_id))
    if isinstance(config.eos_token_id, tuple) and not config.eos_token_id:
        raise FieldError("eos_token_id", "eos_token_id=(): expected a token id, several, or None")
    validate_label_names(config)
    validate_mechanisms(config)
    validate_relative_attention(config)
    validate_encoder_decoder(config)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        value = getattr(config, name)
        for token in (value if isinstance(value, tuple) else (value,)):
            if token is None:
                continue
            if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < config.vocab_size:
                raise FieldError(name, f"{name}={value!r}: expected a token id in [0, {config.vocab_size})")


def validate_mechanisms(config: Any) -> None:
    """Norms, positions, windows and layer kinds, RoPE scaling: the combinations that can run."""
    if config.attention_out_bias is None:
        object.__setattr__(config, "attention_out_bias", config.attention_bias)
    if isinstance(config.layer_types, list):  # from JSON
        object.__setattr__(config, "layer_types", tuple(config.layer_types))
    if isinstance(config.rope_scaling, list):  # from JSON: [[key, value], ...]
        object.__setattr__(config, "rope_scaling", tuple(
            (k, tuple(v) if isinstance(v, list) else v) for k, v in config.rope_scaling))
    for name in ("parallel_residual", "norm_unit_offset", "norm_bias", "head_bias", "decoder_bias"):
        if not isinstance(getattr(config, name), bool):
            raise FieldError(name, f"{name}={getattr(config, name)!r}: expected True or False")
    for name in ("embedding_multiplier", "attention_softcap", "final_logit_softcap", "query_scale",
                 "rope_local_theta"):
        value = getattr(config, name)
        optional = name != "embedding_multiplier"
        if (value is None and optional) or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                            and value > 0):
            continue
        raise FieldError(name, f"{name}={value!r}: expected a positive number" + (" or None" if optional else ""))
    if not isinstance(config.rotary_fraction, (int, float)) or not 0 < config.rotary_fraction <= 1:
        raise FieldError("rotary_fraction", f"rotary_fraction={config.rotary_fraction!r}: expected a fraction in "
                         "(0, 1]")
    if config.position == "rope" and (config.rotary_dim < 2 or config.rotary_dim % 2):
        raise FieldError("rotary_fraction", f"rotary_fraction={config.rotary_fraction} of head_dim={config.head_dim} "
                         f"rotates {config.rotary_dim} features: expected an even number >= 2")
    window = config.sliding_window
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise FieldError("sliding_window", f"sliding_window={window!r}: expected a positive integer or None")
    if config.layer_types is not None:
        if len(config.layer_types) != config.num_layers or any(t not in LAYER_TYPES for t in config.layer_types):
            raise FieldError("layer_types", f"layer_types={config.layer_types!r}: expected num_layers="
                             f"{config.num_layers} entries, each one of {LAYER_TYPES}")
        if "sliding_attention" in config.layer_types and window is None:
            raise FieldError("layer_types", "layer_types has sliding_attention layers but sliding_window=None: "
                             "expected a window size")
    if config.rope_scaling is not None and config.position != "rope":
        raise FieldError("rope_scaling", f"rope_scaling={config.rope_scaling!r} needs position='rope'; got "
                         f"position={config.position!r}")


def validate_relative_attention(config: Any) -> None:
    """DeBERTa's relative attention fields: set only with ``relative_attention=True``, and consistent."""
    if isinstance(config.relative_attention_types, (list, str)):  # from JSON, or one name
        types = ((config.relative_attention_types,) if isinstance(config.relative_attention_types, str)
                 else tuple(config.relative_attention_types))
        object.__setattr__(config, "relative_attention_types", types)
    for name in ("relative_attention", "share_att_key", "relative_embedding_norm"):
        if not isinstance(getattr(config, name), bool):
            raise FieldError(name, f"{name}={getattr(config, name)!r}: expected True or False")
    types = config.relative_attention_types
    if not isinstance(types, tuple) or any(t not in RELATIVE_ATTENTION_TYPES for t in types) or \
            len(set(types)) != len(types):
        raise FieldError("relative_attention_types", f"relative_attention_types={types!r}: expected distinct "
                         f"entries of {RELATIVE_ATTENTION_TYPES}")
    for name in ("position_buckets", "max_relative_positions"):
        value = getattr(config, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 2):
            raise FieldError(name, f"{name}={value!r}: expected an integer >= 2 or None")
    if not config.relative_attention:
        changed = [n for n in ("relative_attention_types", "position_buckets", "max_relative_positions",
                               "share_att_key", "relative_embedding_norm")
                   if getattr(config, n) != type(config).__dataclass_fields__[n].default]
        if changed:
            raise FieldError(changed[0], f"{changed[0]}={getattr(config, changed[0])!r} needs "
                             "relative_attention=True")
        return
    if config.causal:
        raise FieldError("relative_attention", "relative_attention=True: only encoders (causal=False) have "
                         "disentangled relative attention")
    if config.query_scale is not None:  # the bias reads the query before any scale: it would be scaled wrongly
        raise FieldError("query_scale", f"query_scale={config.query_scale!r} with relative_attention=True: DeBERTa's "
                         "scale is 1/sqrt(head_dim * scale_factor); expected None")
    if config.position_buckets is not None and config.relative_max_distance - 1 <= config.position_buckets // 2:
        raise FieldError("position_buckets", f"position_buckets={config.position_buckets} with "
                         f"max_relative_positions={config.relative_max_distance}: expected max_relative_positions "
                         "> position_buckets / 2 + 1 (the log buckets span the distances beyond half of them)")
    if config.attention_impl in ("splash", "gpu_flash"):
        raise FieldError("attention_impl", f"attention_impl={config.attention_impl!r} takes no additive bias, "
                         "which relative_attention's scores are: expected 'auto', 'fused' or 'softmax'")


def validate_encoder_decoder(config: Any) -> None:
    """T5's position bias and the encoder-decoder fields."""
    for name in ("position_bias_per_layer", "scale_decoder_output", "lm_head_bias", "slot_positions",
                 "decoder_start_from_source"):
        if not isinstance(getattr(config, name), bool):
            raise FieldError(name, f"{name}={getattr(config, name)!r}: expected True or False")
    if config.slot_positions and config.position not in ("learned", "sinusoidal"):
        raise FieldError("slot_positions", f"slot_positions=True numbers absolute positions; got position="
                         f"{config.position!r} (expected 'learned' or 'sinusoidal')")
    layers = config.num_decoder_layers
    for name in ("lm_head_bias", "decoder_start_from_source"):
        if getattr(config, name) and layers is None:
            raise FieldError(name, f"{name}=True is an encoder-decoder's setting: expected num_decoder_layers set")
    if layers is not None and (not isinstance(layers, int) or isinstance(layers, bool) or layers < 1):
        raise FieldError("num_decoder_layers", f"num_decoder_layers={layers!r}: expected a positive integer (the "
                         "decoder's depth of an encoder-decoder model) or None (one stack)")
    buckets, distance = config.position_bias_buckets, config.position_bias_max_distance
    if not isinstance(distance, int) or isinstance(distance, bool) or distance < 1:
        raise FieldError("position_bias_max_distance", f"position_bias_max_distance={distance!r}: expected a "
                         "positive integer")
    if buckets is None:
        if config.position_bias_per_layer:
            raise FieldError("position_bias_per_layer", "position_bias_per_layer=True needs position_bias_buckets")
        return
    # distances that keep a bucket each: half the buckets causally (a decoder), a quarter bidirectionally (an
    # encoder's buckets are split by direction); the logarithmic range must reach beyond them
    exact = buckets // 2 if config.causal or layers is not None else buckets // 4
    if not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < 4 or distance <= exact:
        raise FieldError("position_bias_buckets", f"position_bias_buckets={buckets!r} with "
                         f"position_bias_max_distance={distance!r}: expected at least 4 buckets and a max distance "
                         f"above the {exact} distances that keep a bucket each")
    if config.relative_attention:
        raise FieldError("position_bias_buckets", "position_bias_buckets with relative_attention=True: expected "
                         "one kind of relative position (T5's bias or DeBERTa's disentangled attention)")
    if config.attention_impl in ("splash", "gpu_flash"):
        raise FieldError("attention_impl", f"attention_impl={config.attention_impl!r} takes no additive bias, "
                         "which T5's position bias is: expected 'auto', 'fused' or 'softmax'")


def validate_label_names(config: Any) -> None:
    """``label_names``: None, or ``num_labels`` distinct non-empty strings (a JSON list becomes a tuple)."""
    names = config.label_names
    if isinstance(names, list):  # from JSON (a checkpoint's meta)
        names = tuple(names)
        object.__setattr__(config, "label_names", names)
    if names is None:
        return
    expected = f"expected None or a tuple of num_labels={config.num_labels} distinct non-empty strings"
    if not isinstance(names, tuple) or len(names) != config.num_labels:
        raise FieldError("label_names", f"label_names={names!r}: {expected}")
    if any(not isinstance(n, str) or not n.strip() for n in names):
        raise FieldError("label_names", f"label_names={names!r}: {expected} (an empty or non-string name)")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise FieldError("label_names", f"label_names={names!r}: {expected} ({repeated} repeated)")
