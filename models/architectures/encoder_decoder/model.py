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
import numpy as np
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.attention import heads_major
from flaxzoo.models.layers.block import CrossAttentionBlock, TransformerBlock
from flaxzoo.models.layers.decode_state import DecodeState
from flaxzoo.models.layers.embeddings import LMHead, as_index_array, is_concrete, token_table
from flaxzoo.models.layers.linear import Dense
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
        # heads-major [batch · kv_heads, src, head_dim], the layout the decode step's core reads in place (laid
        # out here once: a [batch, src, kv_heads, head_dim] copy is relaid out by every step)
        projected = [heads_major(*layer.cross_attention.keys_values(memory)) for layer in layers]
        valid = (jnp.ones(memory.shape[:2], jnp.int32) if attention_mask is None
                 else jnp.asarray(attention_mask).astype(jnp.int32))
        state = DecodeState.create(self.decoder.config, memory.shape[0], max_len)
        return state.with_memory(tuple(p.key for p in projected), tuple(p.value for p in projected), valid)


class Seq2SeqForConditionalGeneration(Seq2SeqModel):
    """Encoder, decoder and language-model head (transformers' ``T5ForConditionalGeneration``): logits
    ``[batch, target, vocab]`` of the next target token at every target position."""

    task = "seq2seq_lm"

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.lm_head = LMHead(config, use_bias=config.lm_head_bias, rngs=rngs)  # BART: final_logits_bias

    def logits(self, hidden: jax.Array) -> jax.Array:
        """The head alone: decoder states ``[batch, n, hidden]`` → ``[batch, n, vocab]`` (the compute dtype), after
        T5's ``hidden_size ** -0.5`` where the config scales the decoder's output; plus the vocabulary bias where the
        config has one (``lm_head_bias``)."""
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


def shift_tokens_right(input_ids: jax.Array, start: jax.Array | int, pad_token_id: int | None) -> jax.Array:
    """Teacher-forced decoder inputs from ``[batch, seq]`` ids: ``start`` (an id, or ``[batch]`` ids) then the ids
    without their last one; ``-100`` (an unscored label) becomes ``pad_token_id``. ``[batch, seq]``."""
    input_ids = jnp.asarray(input_ids)
    starts = jnp.broadcast_to(jnp.asarray(start, input_ids.dtype), input_ids.shape[:1])[:, None]
    shifted = jnp.concatenate([starts, input_ids[:, :-1]], axis=1)
    return jnp.where(shifted == -100, 0 if pad_token_id is None else pad_token_id, shifted)


def last_real_tokens(input_ids: jax.Array, attention_mask: jax.Array | None, pad_token_id: int | None) -> jax.Array:
    """``[batch]``: each row's last real token (the mask's, else the last id that is not ``pad_token_id``; mBART's
    language id)."""
    input_ids = jnp.asarray(input_ids)
    if attention_mask is not None:
        real = jnp.asarray(attention_mask) != 0
    else:
        real = jnp.ones(input_ids.shape, bool) if pad_token_id is None else input_ids != pad_token_id
    last = jnp.maximum(jnp.sum(real, axis=1) - 1, 0)
    return jnp.take_along_axis(input_ids, last[:, None], axis=1)[:, 0]


def last_token_of(input_ids: jax.Array, token: int, name: str = "eos_token_id") -> jax.Array:
    """``[batch]``: the index of each row's last ``token`` in ``[batch, seq]`` ids. Outside ``jit``, ``ValueError``
    naming the first row without it (inside ``jit`` such a row reads slot 0)."""
    hits = jnp.asarray(input_ids) == token
    if is_concrete(hits):
        rows = np.flatnonzero(~np.asarray(hits).any(axis=1))
        if rows.size:
            raise ValueError(f"input_ids row {int(rows[0])} holds no {name}={token}: the classifier reads the "
                             "decoder's state at each row's last one (end each example with it)")
    width = hits.shape[1]
    return width - 1 - jnp.argmax(hits[:, ::-1], axis=1)


class Seq2SeqForSequenceClassification(Seq2SeqModel):
    """Encoder, decoder and a classifier (transformers' ``BartForSequenceClassification``): the decoder's state at
    each row's last ``eos_token_id`` of ``input_ids`` → ``pooler`` (hidden → hidden) → tanh → ``score`` (hidden →
    ``num_labels``): logits ``[batch, num_labels]`` (float32). No dropout in the head (transformers'
    ``classifier_dropout`` defaults to 0).

    Without ``decoder_input_ids`` the decoder reads ``input_ids`` shifted right behind ``decoder_start_token_id``
    (with ``config.decoder_start_from_source``: behind each row's last real token, mBART's rule), with no padding
    mask, as transformers does. Unlike transformers, rows may hold different numbers of EOS tokens; a row with none
    raises ``ValueError`` (outside ``jit``)."""

    task = "sequence_classification"

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        if not config.eos_token_ids:
            raise ValueError("Seq2SeqForSequenceClassification reads the decoder at each row's last EOS token: "
                             "expected config.eos_token_id")
        common = dict(use_bias=True, rngs=rngs, init_std=config.initializer_range, dtype=jnp.dtype(config.dtype),
                      param_dtype=jnp.dtype(config.param_dtype))
        self.pooler = Dense((config.hidden_size,), (config.hidden_size,), axes=("embed", None), **common)
        self.score = Dense((config.hidden_size,), (config.num_labels,), axes=("embed", None), **common)

    def decoder_inputs(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        """The decoder's ``[batch, seq]`` inputs when none are given: ``input_ids`` shifted right."""
        config = self.config
        if config.decoder_start_from_source:
            start = last_real_tokens(input_ids, attention_mask, config.pad_token_id)
        elif config.decoder_start_token_id is None:
            raise ValueError("no decoder_input_ids and no config.decoder_start_token_id to shift input_ids behind")
        else:
            start = config.decoder_start_token_id
        return shift_tokens_right(input_ids, start, config.pad_token_id)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 decoder_input_ids: jax.Array | None = None, decoder_attention_mask: jax.Array | None = None
                 ) -> jax.Array:
        """``[batch, seq]`` ids (``attention_mask``: 1 = token) → logits ``[batch, num_labels]``. Given
        ``decoder_input_ids`` must be as long as ``input_ids`` (the EOS positions are read from ``input_ids``)."""
        input_ids = as_index_array(input_ids, "input_ids")
        index = last_token_of(input_ids, self.config.eos_token_ids[0])  # [batch]
        if decoder_input_ids is None:
            decoder_input_ids = self.decoder_inputs(input_ids, attention_mask)
        elif np.shape(decoder_input_ids) != tuple(input_ids.shape):
            raise ValueError(f"decoder_input_ids has shape {np.shape(decoder_input_ids)}: expected that of "
                             f"input_ids {tuple(input_ids.shape)} (the EOS positions are read from input_ids)")
        hidden = super().__call__(input_ids, attention_mask, decoder_input_ids, decoder_attention_mask).hidden
        pooled = jnp.take_along_axis(hidden, index[:, None, None], axis=1)[:, 0]  # [batch, hidden]
        return self.score(jnp.tanh(self.pooler(pooled))).astype(jnp.float32)
