"""The position-wise feed-forward block: GELU (exact or tanh), ReLU, or a gated SwiGLU."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.linear import Dense
from flaxzoo.models.layers.partitioning import ACTIVATION_BATCH, ACTIVATION_LENGTH, ACTIVATION_MLP, constrain

MLP_HIDDEN = (ACTIVATION_BATCH, ACTIVATION_LENGTH, ACTIVATION_MLP)  # [batch, seq, intermediate]

ACTIVATION_FUNCTIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
}


class FeedForward(nnx.Module):
    """``down(act(up(x)))``, or ``down(act(gate(x)) * up(x))`` when gated (SwiGLU: Shazeer, 2020).

    ``[batch, seq, hidden]`` → ``[batch, seq, hidden]``.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        d, f = config.hidden_size, config.intermediate_size
        common = dict(use_bias=config.mlp_bias, rngs=rngs, dtype=jnp.dtype(config.dtype),
                      param_dtype=jnp.dtype(config.param_dtype))
        self.activation = ACTIVATION_FUNCTIONS[config.activation]
        self.gate = (Dense((d,), (f,), axes=("embed", "mlp"), init_std=config.initializer_range, **common)
                     if config.mlp_gated else None)
        self.up = Dense((d,), (f,), axes=("embed", "mlp"), init_std=config.initializer_range, **common)
        # GPT-2's scaled init of the projections that write into the residual stream.
        down_std = config.initializer_range / (math.sqrt(2 * config.num_layers) if config.causal else 1.0)
        self.down = Dense((f,), (d,), axes=("mlp", "embed"), init_std=down_std, **common)

    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = self.up(x)
        hidden = self.activation(self.gate(x)) * hidden if self.gate is not None else self.activation(hidden)
        return self.down(constrain(hidden, MLP_HIDDEN))
