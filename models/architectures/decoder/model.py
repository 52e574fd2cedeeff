"""Decoder-only models: the GPT-2 layout (Radford et al., 2019) and the Llama layout (Touvron et al., 2023) from one
class, the difference being only the config (norm, positions, feed-forward, heads, tying); Llama reuses them.

Every class keeps its ``TransformerStack`` at ``backbone`` (``backbone.layers.3.attention.query.kernel``) and its head
beside it (``lm_head``, ``score``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.decode_state import DecodeState
from flaxzoo.models.layers.embeddings import LMHead
from flaxzoo.models.layers.linear import Dense
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
        """The head alone: ``[batch, n, hidden]`` → ``[batch, n, vocab]`` logits (the compute dtype)."""
        return self.lm_head(hidden, self.backbone.embeddings.tokens)

    def decode(self, input_ids: jax.Array, state: DecodeState, new_valid: jax.Array | None = None, *,
               last_only: bool = False, layers: list[nnx.Module] | None = None) -> tuple[jax.Array, DecodeState]:
        """One cached step: ``[batch, q]`` new ids written at the state's next slots → (logits ``[batch, q, vocab]``,
        or ``[batch, 1, vocab]`` for the last position only with ``last_only``; the updated state).
        ``new_valid: [batch, q]`` marks real tokens (a left-padded prompt's mask); default all. ``layers``: the
        backbone's ``decoding_layers()``, taken once before a decode loop."""
        hidden, state = self.backbone.decode(input_ids, state, new_valid, layers=layers)
        if last_only:
            hidden = hidden[:, -1:]
        return self.lm_head(hidden, self.backbone.embeddings.tokens), state

    def init_state(self, batch: int, max_len: int) -> DecodeState:
        """An empty ``DecodeState`` for ``batch`` rows of up to ``max_len`` tokens (prompt included)."""
        return self.backbone.init_state(batch, max_len)


def last_token_index(input_ids: jax.Array, attention_mask: jax.Array | None, pad_token_id: int | None) -> jax.Array:
    """The position each row of a ``[batch, seq]`` batch is read at by a decoder classifier: ``[batch]`` int32.

    * ``pad_token_id`` set: the rightmost token whose id is not ``pad_token_id`` (0 for a row of padding only), left
      or right padding alike: transformers v5's ``...ForSequenceClassification`` rule, so a classifier moved between
      the two reads the same token even where they disagree with the mask (an EOS used as the pad id that ends the
      text is skipped by both);
    * no ``pad_token_id`` but an ``attention_mask``: the rightmost position the mask keeps (transformers refuses a
      batch of more than one row here);
    * neither: the last position, for a batch of one row only (a ValueError otherwise, as transformers raises).
    """
    batch, seq = input_ids.shape
    positions = jnp.arange(seq, dtype=jnp.int32)
    if pad_token_id is not None:
        real = input_ids != pad_token_id
    elif attention_mask is not None:
        real = jnp.asarray(attention_mask) != 0
    elif batch == 1:
        return jnp.full((1,), seq - 1, jnp.int32)
    else:
        raise ValueError(f"a decoder classifier reads each row at its last real token: a batch of {batch} rows needs "
                         "config.pad_token_id or an attention_mask to find it (transformers' rule: without a pad id "
                         "the batch must be 1 row)")
    return jnp.max(jnp.where(real, positions, 0), axis=-1)


class GPTForSequenceClassification(StackModel):
    """Decoder + ``score``: a projection hidden → ``num_labels`` without bias, read at each row's last real token
    (:func:`last_token_index`), as transformers' ``LlamaForSequenceClassification`` (and the Qwen2 / Qwen3 / Mistral
    ones) do; no dropout before it, as theirs has none."""

    task = "sequence_classification"
    causal = True

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.score = Dense((config.hidden_size,), (config.num_labels,), axes=("embed", None), use_bias=False,
                           rngs=rngs, init_std=config.initializer_range, dtype=jnp.dtype(config.dtype),
                           param_dtype=jnp.dtype(config.param_dtype))

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, *,
                 segment_ids: jax.Array | None = None) -> jax.Array:
        """``[batch, seq]`` ids (``attention_mask: [batch, seq]``, 1 = token) → logits ``[batch, num_labels]``
        (float32). One example per row: packed rows (``segment_ids``) are refused, as only the last document's
        token would be read."""
        if segment_ids is not None:
            raise ValueError("GPTForSequenceClassification reads one example per row; segment_ids (packed rows) "
                             "would classify only each row's last document")
        hidden = self.hidden_states(input_ids, attention_mask, token_type_ids, position_ids)  # [batch, seq, hidden]
        index = last_token_index(jnp.asarray(input_ids), attention_mask, self.config.pad_token_id)  # [batch]
        pooled = jnp.take_along_axis(hidden, index[:, None, None], axis=1)[:, 0]  # [batch, hidden]
        return self.score(pooled).astype(jnp.float32)
