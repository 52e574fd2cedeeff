"""Gemma, Gemma 2 and Gemma 3 (text): Hugging Face ``gemma`` / ``gemma2`` / ``gemma3_text`` names and config ↔
flaxzoo ``GPTModel`` / ``GPTForCausalLM``.

All three are the Llama layout with Gemma's RMSNorm (``x̂ · (1 + w)``: ``norm_unit_offset``), token embeddings times
√hidden (``embedding_multiplier``, rounded to the activations' dtype first), a gated GELU-tanh feed-forward, tied
embeddings by default and an explicit ``head_dim`` (256 in the released models, whatever ``hidden / heads`` is).

* Gemma: pre-norm blocks (``input_layernorm`` / ``post_attention_layernorm``), softmax scale ``1 / √head_dim``.
* Gemma 2: sandwich blocks (the four norms of ``SANDWICH_NORMS``), softmax scale ``query_pre_attn_scalar ** -0.5``,
  scores and final logits soft-capped (``attn_logit_softcapping`` / ``final_logit_softcapping``), sliding-window
  layers alternating with global ones (the even layers slide when ``config.json`` has no ``layer_types``).
* Gemma 3: Gemma 2's blocks with per-head QK-norm (``q_norm`` / ``k_norm``, also ``1 + w``), no score soft-capping
  (transformers stores ``attn_logit_softcapping`` but never applies it), and per-layer RoPE: global layers use
  ``rope_theta`` and the RoPE scaling, sliding ones ``rope_local_base_freq`` unscaled (v5: ``rope_parameters``
  keyed by layer type). Without ``layer_types`` every ``sliding_window_pattern``-th layer (default 6) is global.

What the Hugging Face classes cannot do flaxzoo refuses by name: bidirectional attention
(``use_bidirectional_attention``), sliding-window RoPE that is scaled differently from the global one.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Mapping

from flaxzoo.models.architectures.decoder.hf import (PRE_NORMS, SANDWICH_NORMS, decoder_config_from_hf,
                                                     decoder_config_to_hf, decoder_weights, head_dim_of, rope_from_hf,
                                                     rope_parameters_to_hf)
from flaxzoo.models.architectures.decoder.model import GPTForCausalLM, GPTForSequenceClassification, GPTModel
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family, WeightMap
from flaxzoo.models.families.fields import ACTIVATIONS_TO_HF
from flaxzoo.models.families.gemma.gguf import SPECS as GGUF_SPECS
from flaxzoo.models.families.gemma.presets import PRESETS

SLIDING, FULL = "sliding_attention", "full_attention"

# What every Gemma generation fixes.
_COMMON = dict(causal=True, position="rope", norm="rmsnorm", embedding_norm=False, final_norm=True, mlp_gated=True,
               type_vocab_size=0, mlp_bias=False, rotary_fraction=1.0, parallel_residual=False,
               norm_unit_offset=True)
GEMMA_LAYOUT = _COMMON | dict(norm_placement="pre", qk_norm="none", sliding_window=None, layer_types=None,
                              rope_local_theta=None, attention_softcap=None, final_logit_softcap=None,
                              query_scale=None)
GEMMA2_LAYOUT = _COMMON | dict(norm_placement="sandwich", qk_norm="none", rope_local_theta=None)
GEMMA3_LAYOUT = _COMMON | dict(norm_placement="sandwich", qk_norm="head", attention_softcap=None)

# transformers' defaults for fields an older or hand-written config.json may leave out.
_SHARED_DEFAULTS = dict(head_dim=256, rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1,
                        bos_token_id=2)
GEMMA_DEFAULTS = _SHARED_DEFAULTS | dict(max_position_embeddings=8192)
GEMMA2_DEFAULTS = _SHARED_DEFAULTS | dict(max_position_embeddings=8192, query_pre_attn_scalar=256,
                                          sliding_window=4096, final_logit_softcapping=30.0,
                                          attn_logit_softcapping=50.0)
GEMMA3_DEFAULTS = _SHARED_DEFAULTS | dict(max_position_embeddings=131_072, query_pre_attn_scalar=256,
                                          sliding_window=4096, rope_theta=1_000_000.0,
                                          rope_local_base_freq=10_000.0)
GEMMA3_PATTERN = 6  # transformers' sliding_window_pattern default: every 6th layer is global


def with_defaults(hf: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``config.json`` with transformers' value for each field of ``defaults`` it lacks (a field it writes, even as
    null, is kept)."""
    return dict(defaults) | dict(hf)


def with_activation(hf: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``config.json`` whose feed-forward activation is the Hugging Face ``name``, in the one field the shared
    decoder reader takes (``hidden_act``; a Gemma's other activation field is dropped)."""
    return {k: v for k, v in hf.items() if k not in ("hidden_act", "hidden_activation")} | {"hidden_act": name}


def refuse_bidirectional(hf: Mapping[str, Any], model_type: str) -> None:
    """ValueError naming ``use_bidirectional_attention`` when ``config.json`` turns it on (flaxzoo's Gemma
    decoders are causal)."""
    if hf.get("use_bidirectional_attention"):
        raise ValueError(f"config.json: use_bidirectional_attention={hf['use_bidirectional_attention']!r} is not "
                         f"supported by flaxzoo's {model_type} (causal attention only; supported: [None, False])")


def activation_to_hf(name: str) -> str:
    """Hugging Face's name for a flaxzoo activation, as Gemma configs write it (``gelu_pytorch_tanh``)."""
    return "gelu_pytorch_tanh" if name == "gelu_tanh" else ACTIVATIONS_TO_HF[name]


def query_scale_from_hf(hf: Mapping[str, Any]) -> float | None:
    """``query_pre_attn_scalar ** -0.5``, or None when that is ``head_dim ** -0.5`` (flaxzoo's default scale)."""
    scalar = hf["query_pre_attn_scalar"]
    if not isinstance(scalar, (int, float)) or isinstance(scalar, bool) or scalar <= 0:
        raise ValueError(f"config.json: query_pre_attn_scalar={scalar!r}: expected a positive number")
    return None if scalar == head_dim_of(hf) else float(scalar) ** -0.5


def query_pre_attn_scalar(config: TransformerConfig) -> int | None:
    """The integer ``query_pre_attn_scalar`` whose ``** -0.5`` is the config's softmax scale; None when there is
    none (transformers' config takes an int only)."""
    if config.query_scale is None:
        return config.head_dim
    scalar = round(config.query_scale ** -2)
    return scalar if scalar > 0 and math.isclose(scalar ** -0.5, config.query_scale, rel_tol=1e-9) else None


def softcap_from_hf(hf: Mapping[str, Any], field: str) -> float | None:
    """A soft cap of ``config.json`` (None, or a positive number)."""
    value = hf.get(field)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"config.json: {field}={value!r}: expected a positive number or null")
    return float(value)


def gemma_save_problems(config: TransformerConfig, model_type: str) -> list[str]:
    """What Hugging Face's Gemma classes cannot express beyond the family's layout."""
    problems = []
    if config.attention_out_bias != config.attention_bias:
        problems.append(f"attention_out_bias={config.attention_out_bias} (Hugging Face {model_type} biases the "
                        f"output projection as q/k/v: attention_bias={config.attention_bias})")
    scale = config.hidden_size ** 0.5
    if not math.isclose(config.embedding_multiplier, scale, rel_tol=1e-7):
        problems.append(f"embedding_multiplier={config.embedding_multiplier!r} (Hugging Face {model_type} scales the "
                        f"embeddings by √hidden_size = {scale:g})")
    if model_type != "gemma":
        if config.hidden_size % config.num_heads:
            problems.append(f"hidden_size={config.hidden_size} (Hugging Face {model_type} needs a multiple of "
                            f"num_heads={config.num_heads})")
        if query_pre_attn_scalar(config) is None:
            problems.append(f"query_scale={config.query_scale!r} (Hugging Face {model_type} scales by "
                            "query_pre_attn_scalar ** -0.5 with an integer query_pre_attn_scalar)")
    elif config.activation == "gelu":
        problems.append("activation='gelu' (Hugging Face gemma reads hidden_act='gelu' as the tanh approximation: "
                        "needs 'gelu_tanh')")
    return problems


def gemma_weights(norms: Mapping[str, str]) -> Callable[[TransformerConfig, type, str], WeightMap]:
    """The family's table builder: the shared decoder table with ``norms`` (per-layer Hugging Face norm → flaxzoo
    block norm)."""
    return lambda config, cls, base: decoder_weights(config, cls, base, norms=norms)


# ----------------------------------------------------------------------------------------------------------- Gemma

def gemma_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """Gemma: ``hidden_act`` (``"gelu"`` is read as the tanh approximation, as transformers v5 does)."""
    refuse_bidirectional(hf, "gemma")
    hf = with_defaults(hf, GEMMA_DEFAULTS)
    act = hf.get("hidden_act") or "gelu_pytorch_tanh"
    hf = with_activation(hf, "gelu_pytorch_tanh" if act == "gelu" else act)
    return decoder_config_from_hf(hf, "gemma", GEMMA_LAYOUT, embedding_multiplier=hf["hidden_size"] ** 0.5)


def gemma_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    return decoder_config_to_hf(config, sliding=False) | {"hidden_act": activation_to_hf(config.activation)}


# --------------------------------------------------------------------------------------------------------- Gemma 2

def gemma2_layer_types(num_layers: int) -> list[str]:
    """Gemma 2's rule when ``config.json`` has no ``layer_types``: even layers slide, odd ones are global."""
    return [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]


def gemma2_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    refuse_bidirectional(hf, "gemma2")
    hf = with_defaults(hf, GEMMA2_DEFAULTS)
    hf = with_activation(hf, hf.get("hidden_activation") or "gelu_pytorch_tanh")
    return decoder_config_from_hf(
        hf, "gemma2", GEMMA2_LAYOUT, sliding_types=gemma2_layer_types(hf["num_hidden_layers"]),
        embedding_multiplier=hf["hidden_size"] ** 0.5, query_scale=query_scale_from_hf(hf),
        attention_softcap=softcap_from_hf(hf, "attn_logit_softcapping"),
        final_logit_softcap=softcap_from_hf(hf, "final_logit_softcapping"))


def sandwich_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The fields Gemma 2 and 3 write alike (``hidden_activation``, not ``hidden_act``; no ``use_sliding_window``)."""
    out = decoder_config_to_hf(config)
    del out["hidden_act"], out["use_sliding_window"]
    return out | {"hidden_activation": activation_to_hf(config.activation),
                  "query_pre_attn_scalar": query_pre_attn_scalar(config),
                  "attn_logit_softcapping": config.attention_softcap,
                  "final_logit_softcapping": config.final_logit_softcap}


# --------------------------------------------------------------------------------------------------------- Gemma 3

def gemma3_layer_types(hf: Mapping[str, Any]) -> list[str]:
    """Gemma 3's rule when ``config.json`` has no ``layer_types``: every ``sliding_window_pattern``-th layer is
    global, the others slide."""
    pattern = hf.get("sliding_window_pattern") or GEMMA3_PATTERN
    return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(hf["num_hidden_layers"])]


def gemma3_rope_from_hf(hf: Mapping[str, Any]) -> tuple[dict[str, Any], float | None]:
    """(``config.json`` with the global layers' RoPE as flat ``rope_parameters``, ``rope_local_theta``). v5 files key
    ``rope_parameters`` by layer type; older ones write ``rope_theta`` / ``rope_scaling`` (global) and
    ``rope_local_base_freq`` (sliding, unscaled). ValueError for sliding layers' RoPE flaxzoo cannot express."""
    head_dim, max_positions = head_dim_of(hf), hf["max_position_embeddings"]
    params = hf.get("rope_parameters")
    nested = isinstance(params, Mapping) and bool(params) and all(isinstance(v, Mapping) for v in params.values())
    flat = dict(hf)
    if nested:
        flat["rope_parameters"] = dict(params.get(FULL) or {"rope_type": "default"})
    full = rope_from_hf(flat, head_dim, max_positions)
    if not nested or not params.get(SLIDING):
        return flat, float(hf["rope_local_base_freq"])
    local_hf = dict(hf) | {"rope_parameters": dict(params[SLIDING]), "rope_theta": hf["rope_local_base_freq"]}
    local = rope_from_hf(local_hf, head_dim, max_positions)
    if local["rope_scaling"] is None and local["rotary_fraction"] == full["rotary_fraction"]:
        return flat, local["rope_theta"]
    if local == full:  # the sliding layers rotate as the global ones
        return flat, None
    raise ValueError(f"config.json: rope_parameters[{SLIDING!r}]={dict(params[SLIDING])!r} is not supported by "
                     f"flaxzoo's gemma3_text: the sliding layers' RoPE must be unscaled (rope_type 'default', the "
                     f"global partial_rotary_factor) or equal the global layers' {dict(params[FULL])!r}")


def gemma3_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    refuse_bidirectional(hf, "gemma3_text")
    hf = with_defaults(hf, GEMMA3_DEFAULTS)
    if hf.get("attn_logit_softcapping") is not None:
        warnings.warn(f"config.json: attn_logit_softcapping={hf['attn_logit_softcapping']!r} is ignored, as "
                      "transformers' Gemma 3 ignores it (its attention never soft-caps scores)", stacklevel=3)
    flat, local_theta = gemma3_rope_from_hf(hf)
    flat = with_activation(flat, hf.get("hidden_activation") or "gelu_pytorch_tanh")
    return decoder_config_from_hf(
        flat, "gemma3_text", GEMMA3_LAYOUT, sliding_types=gemma3_layer_types(hf),
        embedding_multiplier=hf["hidden_size"] ** 0.5, query_scale=query_scale_from_hf(hf),
        final_logit_softcap=softcap_from_hf(hf, "final_logit_softcapping"), rope_local_theta=local_theta)


def gemma3_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """v5's ``rope_parameters`` per layer type, and the older ``rope_theta`` / ``rope_scaling`` (global) and
    ``rope_local_base_freq``."""
    out = sandwich_config_to_hf(config)
    full = rope_parameters_to_hf(config.rope_theta, config.rope_scaling, config.rotary_fraction)
    local = (dict(full) if config.rope_local_theta is None else
             rope_parameters_to_hf(config.rope_local_theta, None, config.rotary_fraction))
    out["rope_parameters"] = {SLIDING: local, FULL: full}
    if config.rope_local_theta is not None:
        out["rope_local_base_freq"] = config.rope_local_theta
    return out


def _family(model_type: str, prefix: str, layout: dict[str, Any], from_hf: Callable[[Mapping[str, Any]], Any],
            to_hf: Callable[[TransformerConfig], dict[str, Any]], norms: Mapping[str, str],
            presets: Mapping[str, TransformerConfig] | None = None) -> Family:
    """One generation's record: ``{prefix}Model``, its causal LM (``prefix`` without ``Text``) and its sequence
    classifier as flaxzoo's ``GPTModel`` / ``GPTForCausalLM`` / ``GPTForSequenceClassification``."""
    return Family(
        model_type=model_type, base_prefix="model",
        architectures={f"{prefix}Model": GPTModel, f"{prefix.removesuffix('Text')}ForCausalLM": GPTForCausalLM,
                       f"{prefix}ForSequenceClassification": GPTForSequenceClassification},
        config_from_hf=from_hf, config_to_hf=to_hf, weights=gemma_weights(norms), layout=layout,
        save_problems=lambda config: gemma_save_problems(config, model_type), gguf=GGUF_SPECS[model_type],
        presets=dict(presets or {}))


GEMMA = _family("gemma", "Gemma", GEMMA_LAYOUT, gemma_config_from_hf, gemma_config_to_hf, PRE_NORMS)
GEMMA2 = _family("gemma2", "Gemma2", GEMMA2_LAYOUT, gemma2_config_from_hf, sandwich_config_to_hf, SANDWICH_NORMS)
# transformers registers gemma3_text's base model as Gemma3TextModel and its causal LM as Gemma3ForCausalLM.
GEMMA3 = _family("gemma3_text", "Gemma3Text", GEMMA3_LAYOUT, gemma3_config_from_hf, gemma3_config_to_hf,
                 SANDWICH_NORMS, PRESETS)
