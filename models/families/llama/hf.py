"""Llama: Hugging Face ``llama`` names and config ↔ flaxzoo ``GPTModel`` / ``GPTForCausalLM`` /
``GPTForSequenceClassification`` (RMSNorm, SwiGLU, RoPE, grouped-query attention). Its GGUF names and config:
``gguf.py`` beside this file.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from flaxzoo.models.architectures.decoder.hf import (PLAIN_MECHANISMS, decoder_architectures, decoder_config_from_hf,
                                                     decoder_config_to_hf, decoder_weights)
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families.base import Family, WeightMap
from flaxzoo.models.families.llama.gguf import SPEC

LLAMA_LAYOUT = dict(causal=True, position="rope", norm="rmsnorm", norm_placement="pre", embedding_norm=False,
                    final_norm=True, mlp_gated=True, type_vocab_size=0, sliding_window=None, rotary_fraction=1.0,
                    **PLAIN_MECHANISMS)
from flaxzoo.models.families.llama.presets import PRESETS


# The GGUF names, with the score of LlamaForSequenceClassification under llama.cpp's classifier-output name (a Llama
# GGUF has none: loaded as a classifier, the score is initialised; every class's table needs a GGUF name per tensor).
GGUF = dataclasses.replace(SPEC, names=(*SPEC.names, (r"score\.weight", "cls.output.weight")))


def llama_weights(config: TransformerConfig, cls: type, base: str) -> WeightMap:
    """The table for ``cls`` (``base``: ``"model."``, or ``""`` for a bare ``LlamaModel`` checkpoint)."""
    return decoder_weights(config, cls, base)


def llama_save_problems(config: TransformerConfig) -> list[str]:
    """Llama's ``attention_bias`` covers the output projection too."""
    if config.attention_out_bias != config.attention_bias:
        return [f"attention_out_bias={config.attention_out_bias} (Hugging Face llama biases the output projection "
                f"as q/k/v: attention_bias={config.attention_bias})"]
    return []


def llama_config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """Llama has attention-probability dropout (``attention_dropout``) and no residual dropout."""
    return decoder_config_from_hf(hf, "llama", LLAMA_LAYOUT)


def llama_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    return decoder_config_to_hf(config, sliding=False) | {"pretraining_tp": 1}


FAMILY = Family(
    model_type="llama", base_prefix="model",
    architectures=decoder_architectures("Llama"),
    config_from_hf=llama_config_from_hf, config_to_hf=llama_config_to_hf, weights=llama_weights,
    layout=LLAMA_LAYOUT, save_problems=llama_save_problems, gguf=GGUF, presets=PRESETS)
