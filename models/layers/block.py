"""One Transformer layer: attention then feed-forward, each in a pre-LN or post-LN residual branch."""

from __future__ import annotations

import jax
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.attention import Attention, KVCache
from flaxzoo.models.layers.feedforward import FeedForward
from flaxzoo.models.layers.masking import AttentionLayout
from flaxzoo.models.layers.norms import make_norm, residual


class TransformerBlock(nnx.Module):
    """``x → residual(attention) → residual(feed-forward)``; ``[batch, seq, hidden]`` in and out."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.placement = config.norm_placement
        self.attention = Attention(config, rngs=rngs)
        self.attention_norm = make_norm(config, rngs)
        self.mlp = FeedForward(config, rngs=rngs)
        self.mlp_norm = make_norm(config, rngs)
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)

    def __call__(self, x: jax.Array, layout: AttentionLayout, *, cache: KVCache | None = None,
                 return_weights: bool = False) -> tuple[jax.Array, KVCache | None, jax.Array | None]:
        """Returns ``(x [batch, seq, hidden], this layer's updated cache or None, attention weights or None)``."""
        normed = self.attention_norm(x) if self.placement == "pre" else x
        attended, cache, weights = self.attention(normed, layout, cache=cache, return_weights=return_weights)
        x = x + self.dropout(attended)
        if self.placement == "post":
            x = self.attention_norm(x)
        x = residual(x, lambda h: self.dropout(self.mlp(h)), self.mlp_norm, self.placement)
        return x, cache, weights
