"""Decoder-only models: the GPT-2 layout (Radford et al., 2019) and the Llama layout (Touvron et al., 2023) from one
class, the difference being only the config (norm, positions, feed-forward, heads, tying); Llama reuses them.

Both classes keep their ``TransformerStack`` at ``backbone`` (``backbone.layers.3.attention.query.kernel``).
"""

from __future__ import annotations

import jax
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.decode_state import DecodeState
from flaxzoo.models.layers.embeddings import LMHead
from flaxzoo.models.layers.model import LanguageModel, StackModel
from flaxzoo.models.layers.stack import StackOutput


class GPTModel(StackModel):
    """The causal stack without a head: ``[batch, seq]`` ids → ``StackOutput`` (hidden ``[batch, seq, hidden]``)."""

    task = "base"
    causal = True

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, *,
                 segment_ids: jax.Array | None = None, inputs_embeds: jax.Array | None = None,
                 return_attention_weights: bool = False) -> StackOutput:
        return self.backbone(input_ids, attention_mask, token_type_ids, position_ids, segment_ids=segment_ids,
                             inputs_embeds=inputs_embeds, return_attention_weights=return_attention_weights)


class GPTForCausalLM(LanguageModel):
    """Decoder + language-model head (tied to the token table or not)."""

    task = "causal_lm"
    causal = True

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.lm_head = LMHead(config, use_bias=False, rngs=rngs)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """The head alone: ``[batch, n, hidden]`` → ``[batch, n, vocab]`` logits (float32)."""
        return self.lm_head(hidden, self.backbone.embeddings.tokens)

    def decode(self, input_ids: jax.Array, state: DecodeState, new_valid: jax.Array | None = None, *,
               last_only: bool = False) -> tuple[jax.Array, DecodeState]:
        """One cached step: ``[batch, q]`` new ids written at the state's next slots → (logits ``[batch, q, vocab]``,
        or ``[batch, 1, vocab]`` for the last position only with ``last_only``; the updated state).
        ``new_valid: [batch, q]`` marks real tokens (a left-padded prompt's mask); default all."""
        hidden, state = self.backbone.decode(input_ids, state, new_valid)
        if last_only:
            hidden = hidden[:, -1:]
        return self.lm_head(hidden, self.backbone.embeddings.tokens), state

    def init_state(self, batch: int, max_len: int) -> DecodeState:
        """An empty ``DecodeState`` for ``batch`` rows of up to ``max_len`` tokens (prompt included)."""
        return self.backbone.init_state(batch, max_len)
