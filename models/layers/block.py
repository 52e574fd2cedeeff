"""One Transformer layer: attention then feed-forward, each in a residual branch (pre-LN, post-LN, sandwich or
post-branch norms), or both branches on the same input (parallel residual)."""

from __future__ import annotations

from typing import Callable

import jax
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.attention import Attention, KVCache
from flaxzoo.models.layers.feedforward import FeedForward
from flaxzoo.models.layers.masking import AttentionLayout
from flaxzoo.models.layers.norms import make_norm


def residual(x: jax.Array, sublayer: Callable[[jax.Array], jax.Array], norm: nnx.Module, placement: str,
             post_norm: nnx.Module | None = None) -> jax.Array:
    """One residual branch: pre-LN ``x + f(norm(x))`` (GPT-2, Llama), post-LN ``norm(x + f(x))`` (BERT), sandwich
    ``x + post_norm(f(norm(x)))`` (Gemma 2/3) or post-branch ``x + norm(f(x))`` (OLMo 2)."""
    if placement == "pre":
        return x + sublayer(norm(x))
    if placement == "sandwich":
        return x + post_norm(sublayer(norm(x)))
    if placement == "post_branch":
        return x + norm(sublayer(x))
    return norm(x + sublayer(x))


class TransformerBlock(nnx.Module):
    """``x → residual(attention) → residual(feed-forward)``; ``[batch, seq, hidden]`` in and out.

    ``config.parallel_residual``: ``x + attention(attention_norm(x)) + mlp(mlp_norm(x))`` (GPT-NeoX). Sandwich norms
    (``norm_placement="sandwich"``) add ``attention_post_norm`` / ``mlp_post_norm`` on the branch outputs.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.placement = config.norm_placement
        self.parallel = config.parallel_residual
        self.attention = Attention(config, rngs=rngs)
        self.attention_norm = make_norm(config, rngs)
        self.mlp = FeedForward(config, rngs=rngs)
        self.mlp_norm = make_norm(config, rngs)
        sandwich = config.norm_placement == "sandwich"
        self.attention_post_norm = make_norm(config, rngs) if sandwich else None
        self.mlp_post_norm = make_norm(config, rngs) if sandwich else None
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)

    def __call__(self, x: jax.Array, layout: AttentionLayout, *, cache: KVCache | None = None,
                 return_weights: bool = False, sliding: bool | jax.Array = False
                 ) -> tuple[jax.Array, KVCache | None, jax.Array | None]:
        """Returns ``(x [batch, seq, hidden], this layer's updated cache or None, attention weights or None)``.

        ``sliding``: whether this layer attends through the config's sliding window (a traced bool when stacked
        layers of both kinds run in one scan)."""
        results = {}

        def attend(h: jax.Array) -> jax.Array:
            attended, results["cache"], results["weights"] = self.attention(
                h, layout, cache=cache, return_weights=return_weights, sliding=sliding)
            return self.dropout(attended)

        def feed_forward(h: jax.Array) -> jax.Array:
            return self.dropout(self.mlp(h))

        if self.parallel:
            x = x + attend(self.attention_norm(x)) + feed_forward(self.mlp_norm(x))
        else:
            x = residual(x, attend, self.attention_norm, self.placement, self.attention_post_norm)
            x = residual(x, feed_forward, self.mlp_norm, self.placement, self.mlp_post_norm)
        return x, results["cache"], results["weights"]
