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
        attend = self._self_attention(layout, cache, return_weights, sliding, results)
        if self.parallel:
            x = x + attend(self.attention_norm(x)) + self._feed_forward(self.mlp_norm(x))
        else:
            x = residual(x, attend, self.attention_norm, self.placement, self.attention_post_norm)
            x = residual(x, self._feed_forward, self.mlp_norm, self.placement, self.mlp_post_norm)
        return x, results["cache"], results["weights"]

    def _self_attention(self, layout: AttentionLayout, cache: KVCache | None, return_weights: bool,
                        sliding: bool | jax.Array, results: dict) -> Callable[[jax.Array], jax.Array]:
        """The self-attention branch as a function of its input; it leaves the cache and weights in ``results``."""
        def attend(h: jax.Array) -> jax.Array:
            attended, results["cache"], results["weights"] = self.attention(
                h, layout, cache=cache, return_weights=return_weights, sliding=sliding)
            return self.dropout(attended)
        return attend

    def _feed_forward(self, h: jax.Array) -> jax.Array:
        return self.dropout(self.mlp(h))


class CrossAttentionBlock(TransformerBlock):
    """A decoder layer of an encoder-decoder model (Vaswani et al., 2017): self-attention, cross-attention over the
    encoder's output, feed-forward, each in a residual branch. ``[batch, seq, hidden]`` in and out.

    The encoder's output and the cross-attention's layout come in the call's layout (``layout.memory``,
    ``layout.cross``); a cached decode step passes this layer's ``memory_kv`` instead, projected once per source
    (:meth:`Attention.keys_values`)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        if config.parallel_residual or config.norm_placement == "sandwich":
            raise ValueError(f"an encoder-decoder layer has three sequential branches: parallel_residual="
                             f"{config.parallel_residual}, norm_placement={config.norm_placement!r} are not "
                             "available (expected False and 'pre', 'post' or 'post_branch')")
        super().__init__(config, rngs=rngs)
        self.cross_attention = Attention(config, rngs=rngs, cross=True)
        self.cross_attention_norm = make_norm(config, rngs)

    def __call__(self, x: jax.Array, layout: AttentionLayout, *, cache: KVCache | None = None,
                 return_weights: bool = False, sliding: bool | jax.Array = False,
                 memory_kv: tuple[jax.Array, jax.Array] | KVCache | None = None
                 ) -> tuple[jax.Array, KVCache | None, jax.Array | None]:
        """As :meth:`TransformerBlock.__call__`; the weights returned are the self-attention's."""
        if layout.cross is None:
            raise ValueError("a decoder layer of an encoder-decoder model needs the cross-attention layout "
                             "(layout.cross) and the encoder's output or its keys and values")
        if memory_kv is None:
            memory_kv = self.cross_attention.keys_values(layout.memory)
        results = {}

        def cross_attend(h: jax.Array) -> jax.Array:
            return self.dropout(self.cross_attention(h, layout.cross, memory_kv=memory_kv)[0])

        attend = self._self_attention(layout, cache, return_weights, sliding, results)
        x = residual(x, attend, self.attention_norm, self.placement)
        x = residual(x, cross_attend, self.cross_attention_norm, self.placement)
        x = residual(x, self._feed_forward, self.mlp_norm, self.placement)
        return x, results["cache"], results["weights"]
