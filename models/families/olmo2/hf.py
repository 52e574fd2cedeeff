"""OLMo 2: the Llama layout with each branch's output normalised before the residual add (``x + norm(f(x))``:
``post_attention_layernorm`` / ``post_feedforward_layernorm``, no input norms) and RMS-normalised queries and keys
over all heads' features at once (``q_norm`` ``[heads · head_dim]``, ``k_norm`` ``[kv_heads · head_dim]``) before
RoPE; untied, no biases unless ``attention_bias`` (then q, k, v and the output projection)."""

from __future__ import annotations

from typing import Any, Mapping

from flaxzoo.models.architectures.decoder.hf import (PLAIN_MECHANISMS, POST_BRANCH_NORMS, decoder_config_from_hf,
                                                     decoder_config_to_hf, decoder_weights, head_dim_of, rope_from_hf)
from flaxzoo.models.architectures.decoder.model import GPTForCausalLM, GPTForSequenceClassification, GPTModel
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family, WeightMap

OLMO2_LAYOUT = dict(causal=True, position="rope", norm="rmsnorm", norm_placement="post_branch", embedding_norm=False,
                    final_norm=True, mlp_gated=True, type_vocab_size=0, mlp_bias=False, rotary_fraction=1.0,
                    sliding_window=None, layer_types=None, **(PLAIN_MECHANISMS | {"qk_norm": "full"}))
from flaxzoo.models.families.olmo2.presets import PRESETS


def olmo2_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls`` (``base``: ``"model."``, or ``""`` for a bare ``Olmo2Model`` checkpoint)."""
    return decoder_weights(config, cls, base, norms=POST_BRANCH_NORMS)


def olmo2_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """OLMo 2's ``config.json``; ValueError for a partial rotary factor (its attention rotates whole heads)."""
    fraction = rope_from_hf(hf, head_dim_of(hf), hf.get("max_position_embeddings", 2048))["rotary_fraction"]
    if fraction != 1.0:
        raise ValueError(f"config.json: partial_rotary_factor={fraction} is not supported for olmo2 (Hugging Face "
                         "olmo2 rotates every feature of a head; expected 1.0)")
    return decoder_config_from_hf(hf, "olmo2", OLMO2_LAYOUT)


def olmo2_save_problems(config: TransformerConfig) -> list[str]:
    if config.attention_out_bias != config.attention_bias:
        return [f"attention_out_bias={config.attention_out_bias} (Hugging Face olmo2 biases the output projection "
                f"as q/k/v: attention_bias={config.attention_bias})"]
    return []


def olmo2_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    out = decoder_config_to_hf(config, sliding=False)
    del out["mlp_bias"]
    return out


FAMILY = Family(
    model_type="olmo2", base_prefix="model",
    architectures={"Olmo2Model": GPTModel, "Olmo2ForCausalLM": GPTForCausalLM,
                   "Olmo2ForSequenceClassification": GPTForSequenceClassification},
    config_from_hf=olmo2_config_from_hf, config_to_hf=olmo2_config_to_hf, weights=olmo2_weights,
    layout=OLMO2_LAYOUT, save_problems=olmo2_save_problems, presets=PRESETS)
