"""Encoder-decoder models (Vaswani et al., 2017; Raffel et al., 2020): a bidirectional ``TransformerStack`` over the
source, a causal one over the target whose layers (``CrossAttentionBlock``) also attend to the encoder's output, one
token table for both (``shared``), and a language-model head.

One ``TransformerConfig`` with ``num_decoder_layers`` describes both stacks (``config.encoder_config()`` /
``config.decoder_config()``). Parameters sit at ``shared``, ``encoder.layers.3.attention.query.kernel``,
``decoder.layers.3.cross_attention.query.kernel``, ``lm_head``. The call convention is transformers':
``model(input_ids, attention_mask, decoder_input_ids, decoder_attention_mask)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.block import CrossAttentionBlock, TransformerBlock
from flaxzoo.models.layers.decode_state import DecodeState
from flaxzoo.models.layers.embeddings import LMHead, as_index_array, token_table
from flaxzoo.models.layers.masking import cross_layout, input_positions
from flaxzoo.models.layers.stack import StackOutput, TransformerStack


def _check_encoder_decoder(config: TransformerConfig, cls: type) -> None:
    if not isinstance(config, TransformerConfig) or not config.is_encoder_decoder:
        raise ValueError(f"{cls.__name__} needs an encoder-decoder config (num_decoder_layers set); got "
                         f"num_decoder_layers={getattr(config, 'num_decoder_layers', None)!r}")


class Seq2SeqEncoderModel(nnx.Module):
    """The encoder alone (transformers' ``T5EncoderModel``): ``[batch, src]`` ids → ``StackOutput`` (hidden
    ``[batch, src, hidden]``)."""

    task = "encoder"
    causal = True  # the kind of config it takes: an encoder-decoder's (the family generates left to right)
    block = TransformerBlock

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        _check_encoder_decoder(config, type(self))
        self.config = config
        self.shared = token_table(config, rngs)
        self.encoder = TransformerStack(config.encoder_config(), rngs=rngs, block=self.block, shared_tokens=True)

    def encode(self, input_ids: jax.Array, attention_mask: jax.Array | None = None, *,
               segment_ids: jax.Array | None = None, return_attention_weights: bool = False) -> StackOutput:
        """The encoder's output for ``[batch, src]`` ids (``attention_mask``: 1 = token; ``segment_ids``: packed
        sources numbered from 1)."""
        return self.encoder(input_ids, attention_mask, segment_ids=segment_ids, token_table=self.shared,
                            return_attention_weights=return_attention_weights)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None, *,
                 segment_ids: jax.Array | None = None) -> StackOutput:
        return self.encode(input_ids, attention_mask, segment_ids=segment_ids)


class Seq2SeqModel(Seq2SeqEncoderModel):
    """Encoder and decoder without a head (transformers' ``T5Model``): returns the decoder's final states
    ``[batch, target, hidden]`` (a ``StackOutput``)."""

    task = "base"
    decoder_block = CrossAttentionBlock

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.decoder = TransformerStack(config.decoder_config(), rngs=rngs, block=self.decoder_block,
                                        shared_tokens=True)

    def decoder_states(self, decoder_input_ids: jax.Array, memory: jax.Array,
                       attention_mask: jax.Array | None = None, decoder_attention_mask: jax.Array | None = None, *,
                       segment_ids: jax.Array | None = None, decoder_segment_ids: jax.Array | None = None,
                       return_attention_weights: bool = False) -> StackOutput:
        """The decoder over ``[batch, target]`` ids reading the encoder output ``memory: [batch, src, hidden]``
        (``attention_mask``: the source's; packed rows: both ``segment_ids``, a target token reading only its own
        pair's source)."""
        config = self.decoder.config
        decoder_input_ids = as_index_array(decoder_input_ids, "decoder_input_ids", expected="[batch, target]")
        if decoder_input_ids is None:
            raise ValueError("decoder_input_ids is None: expected [batch, target] ids (transformers' "
                             "shift_tokens_right of the labels for teacher forcing)")
        if decoder_input_ids.shape[0] != memory.shape[0]:
            raise ValueError(f"decoder_input_ids has {decoder_input_ids.shape[0]} rows and the source "
                             f"{memory.shape[0]}: expected one target per source")
        batch, target = decoder_input_ids.shape
        decoder_attention_mask = as_index_array(decoder_attention_mask, "decoder_attention_mask", allow_bool=True)
        positions = input_positions(config, target, batch, attention_mask=decoder_attention_mask,
                                    segment_ids=decoder_segment_ids, input_ids=decoder_input_ids)
        cross = cross_layout(positions, None if attention_mask is None else jnp.asarray(attention_mask),
                             memory.shape[1], query_segments=decoder_segment_ids, source_segments=segment_ids)
        return self.decoder(decoder_input_ids, decoder_attention_mask, segment_ids=decoder_segment_ids,
                            token_table=self.shared, memory=memory, cross=cross,
                            return_attention_weights=return_attention_weights)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 decoder_input_ids: jax.Array | None = None, decoder_attention_mask: jax.Array | None = None, *,
                 segment_ids: jax.Array | None = None, decoder_segment_ids: jax.Array | None = None) -> StackOutput:
        memory = self.encode(input_ids, attention_mask, segment_ids=segment_ids).hidden
        return self.decoder_states(decoder_input_ids, memory, attention_mask, decoder_attention_mask,
                                   segment_ids=segment_ids, decoder_segment_ids=decoder_segment_ids)

    def init_state(self, memory: jax.Array, attention_mask: jax.Array | None, max_len: int,
                   layers: list[nnx.Module] | None = None) -> DecodeState:
        """An empty decoder state for ``max_len`` target tokens reading ``memory: [batch, src, hidden]``: every
        decoder layer's cross-attention keys and values, projected here once for the whole decode loop.
        ``layers``: the decoder's ``decoding_layers()``."""
        layers = self.decoder.decoding_layers() if layers is None else layers
        projected = [layer.cross_attention.keys_values(memory) for layer in layers]
        valid = (jnp.ones(memory.shape[:2], jnp.int32) if attention_mask is None
                 else jnp.asarray(attention_mask).astype(jnp.int32))
        state = DecodeState.create(self.decoder.config, memory.shape[0], max_len)
        return state.with_memory(tuple(k for k, _ in projected), tuple(v for _, v in projected), valid)


class Seq2SeqForConditionalGeneration(Seq2SeqModel):
    """Encoder, decoder and language-model head (transformers' ``T5ForConditionalGeneration``): logits
    ``[batch, target, vocab]`` of the next target token at every target position."""

    task = "seq2seq_lm"

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.lm_head = LMHead(config, use_bias=False, rngs=rngs)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """The head alone: decoder states ``[batch, n, hidden]`` → ``[batch, n, vocab]`` (the compute dtype), after
        T5's ``hidden_size ** -0.5`` where the config scales the decoder's output."""
        if self.config.scale_decoder_output:
            hidden = hidden * jnp.asarray(self.config.hidden_size ** -0.5, hidden.dtype)
        return self.lm_head(hidden, self.shared)

    def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                      decoder_input_ids: jax.Array | None = None, decoder_attention_mask: jax.Array | None = None, *,
                      segment_ids: jax.Array | None = None, decoder_segment_ids: jax.Array | None = None
                      ) -> jax.Array:
        """The decoder's final states ``[batch, target, hidden]`` before the head (a loss can project them in
        chunks with :meth:`logits`)."""
        return super().__call__(input_ids, attention_mask, decoder_input_ids, decoder_attention_mask,
                                segment_ids=segment_ids, decoder_segment_ids=decoder_segment_ids).hidden

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 decoder_input_ids: jax.Array | None = None, decoder_attention_mask: jax.Array | None = None, *,
                 segment_ids: jax.Array | None = None, decoder_segment_ids: jax.Array | None = None) -> jax.Array:
        return self.logits(self.hidden_states(input_ids, attention_mask, decoder_input_ids, decoder_attention_mask,
                                              segment_ids=segment_ids, decoder_segment_ids=decoder_segment_ids))

    def decode(self, decoder_input_ids: jax.Array, state: DecodeState, *, last_only: bool = False,
               layers: list[nnx.Module] | None = None) -> tuple[jax.Array, DecodeState]:
        """One cached decoder step: ``[batch, q]`` new target ids → (logits ``[batch, q, vocab]``, or the last
        position's with ``last_only``; the updated state). ``state``: :meth:`init_state`'s."""
        hidden, state = self.decoder.decode(decoder_input_ids, state, layers=layers, token_table=self.shared)
        if last_only:
            hidden = hidden[:, -1:]
        return self.logits(hidden), state
