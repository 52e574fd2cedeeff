"""Building models: the class for a config, initialisation under jit, and parameter counts without allocation."""

from __future__ import annotations

from typing import Type

import jax
import numpy as np
from flax import nnx

from models.bert import BertForMaskedLM, BertForSequenceClassification, BertModel
from models.config import TransformerConfig
from models.gpt import GPTForCausalLM, GPTModel

MODEL_CLASSES = {cls.__name__: cls for cls in (BertModel, BertForMaskedLM, BertForSequenceClassification, GPTModel,
                                               GPTForCausalLM)}


def default_model_class(config: TransformerConfig) -> Type[nnx.Module]:
    """The language-model class of a config: ``BertForMaskedLM`` for encoders, ``GPTForCausalLM`` for decoders."""
    return GPTForCausalLM if config.causal else BertForMaskedLM


def abstract_model(config: TransformerConfig, cls: Type[nnx.Module] | None = None) -> nnx.Module:
    """The model with ``jax.ShapeDtypeStruct`` leaves: shapes and metadata, no memory."""
    cls = cls or default_model_class(config)
    return nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))


def create_model(config: TransformerConfig, cls: Type[nnx.Module] | None = None, *, seed: int = 0) -> nnx.Module:
    """A freshly initialised model, its initialisers compiled as one program (eager init compiles each op)."""
    cls = cls or default_model_class(config)
    graphdef, _ = nnx.split(abstract_model(config, cls))
    state = jax.jit(lambda: nnx.state(cls(config, rngs=nnx.Rngs(seed))))()
    return nnx.merge(graphdef, state)


def param_count(config: TransformerConfig, cls: Type[nnx.Module] | None = None) -> int:
    """Number of trainable parameters (tied tables counted once), computed with ``eval_shape``."""
    params = nnx.state(abstract_model(config, cls), nnx.Param)
    return int(sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(params)))
