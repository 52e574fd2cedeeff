"""ELECTRA's discriminator (Clark et al., 2020): the encoder and a per-token replaced / original score. The other
ELECTRA classes are the encoder architecture's (``architectures/encoder/model.py``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from flaxzoo.models.architectures.encoder.model import EncoderWithHead
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.feedforward import ACTIVATION_FUNCTIONS
from flaxzoo.models.layers.linear import Dense


def _dense(config: TransformerConfig, out_features: int, rngs: nnx.Rngs) -> Dense:
    return Dense((config.hidden_size,), (out_features,), axes=("embed", None), use_bias=True, rngs=rngs,
                 init_std=config.initializer_range, dtype=jnp.dtype(config.dtype),
                 param_dtype=jnp.dtype(config.param_dtype))


class ElectraForPreTraining(EncoderWithHead):
    """Encoder + ``discriminator`` (dense hidden → hidden, the config's activation) + ``prediction`` (dense
    hidden → 1): the logit that each token was replaced by the generator (replaced token detection)."""

    task = "replaced_token_detection"

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.discriminator = _dense(config, config.hidden_size, rngs)
        self.prediction = _dense(config, 1, rngs)

    def head_outputs(self, hidden: jax.Array, attention_mask: jax.Array | None) -> jax.Array:
        """Encoder states ``[batch, seq, hidden]`` → per-token logits ``[batch, seq]`` (float32; > 0: replaced)."""
        hidden = ACTIVATION_FUNCTIONS[self.config.activation](self.discriminator(hidden))
        return self.prediction(hidden)[..., 0].astype(jnp.float32)
