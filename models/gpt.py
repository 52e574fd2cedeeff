"""Decoder-only models: the GPT-2 layout (Radford et al., 2019) and the Llama layout (Touvron et al., 2023) from one
class, the difference being only the config (norm, positions, feed-forward, heads, tying)."""

from __future__ import annotations

import jax
from flax import nnx

from models.config import TransformerConfig
from models.layers.attention import KVCache
from models.layers.embeddings import LMHead
from models.layers.stack import StackOutput, TransformerStack


class GPTModel(nnx.Module):
    """The causal stack without a head: ``[batch, seq]`` ids → ``StackOutput`` (hidden ``[batch, seq, hidden]``)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        if not config.causal:
            raise ValueError("GPTModel needs a decoder config (causal=True); got causal=False")
        self.config = config
        self.decoder = TransformerStack(config, rngs=rngs)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, **kwargs
                 ) -> StackOutput:
        return self.decoder(input_ids, attention_mask, token_type_ids, position_ids, **kwargs)


class GPTForCausalLM(nnx.Module):
    """Decoder + language-model head (tied to the token table or not)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.transformer = GPTModel(config, rngs=rngs)
        self.lm_head = LMHead(config, use_bias=False, rngs=rngs)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, *,
                 segment_ids: jax.Array | None = None) -> jax.Array:
        """``[batch, seq]`` → next-token logits ``[batch, seq, vocab]`` (float32)."""
        hidden = self.transformer(input_ids, attention_mask, token_type_ids, position_ids,
                                  segment_ids=segment_ids).hidden
        return self.lm_head(hidden, self.transformer.decoder.embeddings.tokens)

    def decode(self, input_ids: jax.Array, *, cache: tuple[KVCache, ...], cache_index: jax.Array,
               key_valid: jax.Array, position_ids: jax.Array) -> tuple[jax.Array, tuple[KVCache, ...]]:
        """One cached step: ``[batch, q]`` new ids written at cache slots ``cache_index ...`` → (logits
        ``[batch, q, vocab]``, updated cache). ``key_valid: [batch, max_len]`` marks the slots holding real tokens."""
        out = self.transformer(input_ids, position_ids=position_ids, cache=cache, cache_index=cache_index,
                               key_valid=key_valid)
        return self.lm_head(out.hidden, self.transformer.decoder.embeddings.tokens), out.cache

    def init_cache(self, batch: int, max_len: int) -> tuple[KVCache, ...]:
        return self.transformer.decoder.init_cache(batch, max_len)
