"""One Transformer layer: attention then feed-forward, each in a pre-LN or post-LN residual branch."""

from __future__ import annotations

import jax
from flax import nnx

from models.config import TransformerConfig
from models.layers.attention import Attention, KVCache
from models.layers.feedforward import FeedForward
from models.layers.norms import make_norm, residual


class TransformerBlock(nnx.Module):
    """``x → residual(attention) → residual(feed-forward)``; ``[batch, seq, hidden]`` in and out."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.placement = config.norm_placement
        self.attention = Attention(config, rngs=rngs)
        self.attention_norm = make_norm(config, rngs)
        self.mlp = FeedForward(config, rngs=rngs)
        self.mlp_norm = make_norm(config, rngs)
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)

    def __call__(self, x: jax.Array, *, positions: jax.Array, mask: jax.Array | None = None,
                 bias: jax.Array | None = None, cache: KVCache | None = None, cache_index: jax.Array | None = None,
                 return_weights: bool = False) -> tuple[jax.Array, KVCache | None, jax.Array | None]:
        extras = {}

        def attend(h: jax.Array) -> jax.Array:
            out, extras["cache"], extras["weights"] = self.attention(
                h, positions=positions, mask=mask, bias=bias, cache=cache, cache_index=cache_index,
                return_weights=return_weights)
            return self.dropout(out)

        x = residual(x, attend, self.attention_norm, self.placement)
        x = residual(x, lambda h: self.dropout(self.mlp(h)), self.mlp_norm, self.placement)
        return x, extras["cache"], extras["weights"]
