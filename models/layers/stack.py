"""The layer stack both families share: input checks, embeddings, the attention layout, blocks, final norm.

The blocks are stored one of two ways. ``config.scan_layers=False``: ``layers`` is an ``nnx.List`` of blocks (paths
``layers.0 ...``), run by a Python loop. ``scan_layers=True``: ``layers`` is ONE block whose parameters are stacked
``[num_layers, ...]`` (logical axis ``"layers"``), run by ``lax.scan`` as MaxText does: one
compiled layer body and no per-step stacking copy. Checkpoint formats are converted at the boundary
(``layer_layout.stack_layer_values`` / ``unstack_layer_values``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.attention import KVCache
from flaxzoo.models.layers.block import TransformerBlock
from flaxzoo.models.layers.decode_state import DecodeState
from flaxzoo.models.layers.embeddings import (InputEmbeddings, TokenEmbedding, as_index_array, check_index_range,
                                              check_token_ids, is_concrete)
from flaxzoo.models.layers.layer_layout import LAYER_AXIS
from flaxzoo.models.layers.masking import AttentionLayout, full_sequence_layout, input_positions
from flaxzoo.models.layers.norms import make_norm
from flaxzoo.models.layers.partitioning import HIDDEN, constrain
from flaxzoo.models.layers.relative_attention import RelativeEmbeddings
from flaxzoo.models.layers.relative_bias import position_bias_table

# The remat policies a config can name: what each layer keeps for the backward pass.
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,  # keep only the layer's input; recompute the rest
    # Keep the weight-matmul outputs and the attention kernel's residuals (its softmax weights and output).
    "dots": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        jax.checkpoint_policies.save_only_these_names("attention_probs", "attention_context")),
}


class StackOutput(NamedTuple):
    """``hidden: [batch, seq, hidden]``; ``attention_weights``: one ``[batch, heads, q, k]`` array per layer when
    asked for."""

    hidden: jax.Array
    attention_weights: tuple[jax.Array, ...] | None = None


def _check_binary(mask, expected_shape: tuple[int, ...], name: str) -> None:
    if mask is None:
        return
    if tuple(mask.shape) != tuple(expected_shape):
        raise ValueError(f"{name} has shape {tuple(mask.shape)}: expected {tuple(expected_shape)} "
                         "(one entry per token, 1 = real token, 0 = padding)")
    if is_concrete(mask):
        values = np.unique(np.asarray(mask))
        if not np.isin(values, [0, 1]).all():
            raise ValueError(f"{name} holds values {values.tolist()}: expected only 0 and 1")


def _check_segments(segment_ids, expected_shape: tuple[int, ...]) -> None:
    if segment_ids is None:
        return
    if tuple(segment_ids.shape) != tuple(expected_shape):
        raise ValueError(f"segment_ids has shape {tuple(segment_ids.shape)}: expected {tuple(expected_shape)}")
    if is_concrete(segment_ids):
        ids = np.asarray(segment_ids)
        if ids.size and ids.min() < 0:
            raise ValueError(f"segment_ids contains {int(ids.min())}: expected document numbers >= 1 (0 = padding)")
        real = np.where(ids > 0, ids, 0)
        running = np.maximum.accumulate(real, axis=-1)
        bad = np.argwhere((ids > 0) & (ids < running))
        if bad.size:
            row, col = map(int, bad[0])
            raise ValueError(f"segment_ids row {row} goes back to document {int(ids[row, col])} at position {col} "
                             f"after document {int(running[row, col])}: expected documents numbered in order along "
                             "each row (1, 1, 2, 2, 2, 3, ...; 0 = padding)")


def stack_modules(modules: list[nnx.Module]) -> nnx.Module:
    """Modules of one structure as ONE module whose variables are stacked ``[len(modules), ...]``; parameters get
    the logical axis ``"layers"`` in front of their own names.

    The blocks are built one by one first, so that a stacked model holds exactly the parameters (and dropout
    streams) of the unstacked one with the same seed: ``scan_layers`` changes how the stack runs, never its values.
    """
    graphdef, _ = nnx.split(modules[0])

    def stacked(*variables: nnx.Variable) -> nnx.Variable:
        first = variables[0]
        out = first.replace(jnp.stack([v.get_value() for v in variables]))
        axes = first.get_metadata().get("out_sharding")
        if axes is not None:
            out.set_metadata(out_sharding=(LAYER_AXIS, *axes))
        return out

    states = [nnx.state(m) for m in modules]
    return nnx.merge(graphdef, jax.tree.map(stacked, *states, is_leaf=lambda x: isinstance(x, nnx.Variable)))


class TransformerStack(nnx.Module):
    """Embeddings → ``num_layers`` blocks → final norm (pre-LN models). Causal or bidirectional per the config."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, block: type = TransformerBlock,
                 shared_tokens: bool = False):
        """``block``: the layer class (``block(config, rngs=...)``, called as ``TransformerBlock`` is); a family with
        other layers passes its own. ``shared_tokens``: the stack has no token table of its own; each call passes
        the model's (``token_table``), as an encoder-decoder's two stacks share one."""
        self.config = config
        self.embeddings = InputEmbeddings(config, rngs=rngs, own_tokens=not shared_tokens)
        if config.shared_layers:  # ALBERT: one block's parameters for every layer, in both layouts
            self.shared_layer = block(config, rngs=rngs)
            self.layers = None
        else:
            blocks = [block(config, rngs=rngs) for _ in range(config.num_layers)]
            self.layers = stack_modules(blocks) if config.scan_layers else nnx.List(blocks)
        self.final_norm = make_norm(config, rngs) if config.final_norm else None
        # DeBERTa: one relative-distance table for all layers, handed to them in the call's layout
        self.relative = RelativeEmbeddings(config, rngs=rngs) if config.relative_attention else None
        # T5, mT5: one position-bias table for all layers of the stack (umT5's are per layer, in the attention)
        self.position_bias = (position_bias_table(config, rngs)
                              if config.position_bias_buckets and not config.position_bias_per_layer else None)

    def check_inputs(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, *,
                     segment_ids=None, inputs_embeds=None) -> None:
        """Raise ``ValueError`` for inputs the compiled model would silently mishandle (values are checked when
        known, i.e. outside ``jit``)."""
        config = self.config
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids [batch, seq] and inputs_embeds [batch, seq, hidden]")
        if inputs_embeds is not None:
            if inputs_embeds.ndim != 3 or inputs_embeds.shape[-1] != config.embedding_width:
                raise ValueError(f"inputs_embeds has shape {tuple(inputs_embeds.shape)}: expected "
                                 f"[batch, seq, {config.embedding_width}]")
            shape = tuple(inputs_embeds.shape[:2])
        else:
            shape = tuple(input_ids.shape)
            check_token_ids(input_ids, config)
        if 0 in shape:
            raise ValueError(f"{'input_ids' if inputs_embeds is None else 'inputs_embeds'} has shape {shape} "
                             "[batch, seq]: expected at least one row and one token")
        if config.position in ("learned", "sinusoidal") and position_ids is None and \
                shape[1] + config.position_offset > config.max_position_embeddings:
            raise ValueError(f"sequence length {shape[1]} exceeds max_position_embeddings="
                             f"{config.max_position_embeddings} of this model's {config.position} positions"
                             + (f" (minus position_offset={config.position_offset})" if config.position_offset
                                else ""))
        _check_binary(attention_mask, shape, "attention_mask")
        _check_segments(segment_ids, shape)
        if token_type_ids is not None:
            if tuple(token_type_ids.shape) != shape:
                raise ValueError(f"token_type_ids has shape {tuple(token_type_ids.shape)}: expected {shape}")
            if not config.type_vocab_size:
                raise ValueError("token_type_ids given but this model has no token-type embeddings "
                                 "(type_vocab_size=0)")
            check_index_range(token_type_ids, config.type_vocab_size, "token_type_ids")
        if position_ids is not None:
            if tuple(position_ids.shape) != shape:
                raise ValueError(f"position_ids has shape {tuple(position_ids.shape)}: expected {shape}")
            if config.position in ("learned", "sinusoidal"):
                check_index_range(position_ids, config.max_position_embeddings, "position_ids")

    def __call__(self, input_ids: jax.Array | None, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, *,
                 segment_ids: jax.Array | None = None, inputs_embeds: jax.Array | None = None,
                 return_attention_weights: bool = False, token_table: TokenEmbedding | None = None,
                 memory: jax.Array | None = None, cross: AttentionLayout | None = None) -> StackOutput:
        """Run the stack over whole sequences: ``input_ids: [batch, seq]`` int (arrays or lists of ints).

        ``attention_mask: [batch, seq]`` (1 = token, 0 = padding). ``segment_ids: [batch, seq]`` int: packed
        documents numbered from 1 within a row (0 = padding); a token attends only to its own document, and
        positions restart at each document. ``position_ids`` override the positions (``masking.py`` gives the
        defaults). ``inputs_embeds: [batch, seq, hidden]``, given instead of ``input_ids`` (which must then be None),
        replaces the token-embedding lookup; positions, token types and the embedding norm are still added.

        ``token_table``: the model's shared token table (a stack built with ``shared_tokens``). ``memory: [batch,
        src, hidden]`` and ``cross``: an encoder-decoder's decoder stack reads the encoder's output through the
        layout ``cross`` (``masking.cross_layout``).

        Inside ``jit`` the values are not checked: an id outside the vocabulary gives NaNs in its row's outputs.
        """
        config = self.config
        input_ids = as_index_array(input_ids, "input_ids")
        attention_mask = as_index_array(attention_mask, "attention_mask", allow_bool=True)
        segment_ids = as_index_array(segment_ids, "segment_ids")
        token_type_ids = as_index_array(token_type_ids, "token_type_ids")
        position_ids = as_index_array(position_ids, "position_ids")
        self.check_inputs(input_ids, attention_mask, token_type_ids, position_ids, segment_ids=segment_ids,
                          inputs_embeds=inputs_embeds)
        batch, seq = (input_ids if inputs_embeds is None else inputs_embeds).shape[:2]
        if position_ids is None:
            position_ids = input_positions(config, seq, batch, attention_mask=attention_mask,
                                           segment_ids=segment_ids, input_ids=input_ids)
        layout = full_sequence_layout(config, position_ids, attention_mask=attention_mask, segment_ids=segment_ids)
        if self.relative is not None:
            layout = layout.replace(relative_embeddings=self.relative())
        layout = self._with_position_bias(layout).replace(memory=memory, cross=cross)
        x = self.embeddings(input_ids, position_ids, token_type_ids, inputs_embeds=inputs_embeds, tokens=token_table)
        x, weights = self._run_layers(x, layout, return_attention_weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return StackOutput(x, weights)

    def _with_position_bias(self, layout: AttentionLayout) -> AttentionLayout:
        """``layout`` with the stack's shared T5 bias ``[batch, heads, q, k]`` of its positions, if it has one."""
        if self.position_bias is None:
            return layout
        return layout.replace(position_bias=self.position_bias(layout.query_positions, layout.key_positions))

    def decode(self, input_ids: jax.Array, state: DecodeState, new_valid: jax.Array | None = None, *,
               layers: list[nnx.Module] | None = None, token_table: TokenEmbedding | None = None
               ) -> tuple[jax.Array, DecodeState]:
        """Run ``q`` new tokens ``input_ids: [batch, q]`` against the cache: returns ``(hidden [batch, q, hidden],
        the state with their keys and values written)``. ``new_valid: [batch, q]`` marks real tokens (default all;
        a left-padded prompt passes its mask). Positions continue each row's count of real tokens (its slots with
        ``config.slot_positions``), plus ``config.position_offset``. ``layers``:
        :meth:`decoding_layers`, taken once before a decode loop (default: taken here). ``token_table``: as in
        :meth:`__call__`. A state made for an encoder's output (``DecodeState.with_memory``) gives each layer its
        cross-attention keys and values."""
        config = self.config
        input_ids = as_index_array(input_ids, "input_ids", expected="[batch, q]")
        if tuple(input_ids.shape[:1]) != (state.batch,):
            raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}: the decode state holds {state.batch} "
                             "rows")
        check_token_ids(input_ids, config)
        new_valid = jnp.ones(input_ids.shape, jnp.int32) if new_valid is None else new_valid
        _check_binary(new_valid, tuple(input_ids.shape), "new_valid")
        layout, next_state = state.advance(new_valid, config.position_offset, config.slot_positions)
        if config.position in ("learned", "sinusoidal") and is_concrete(layout.query_positions):
            check_index_range(layout.query_positions, config.max_position_embeddings, "decode positions",
                              f"positions of this model's {config.position} table")
        x = self.embeddings(input_ids, layout.query_positions, tokens=token_table)
        x, keys, values = self._decode_layers(self._with_position_bias(layout), x, state,
                                              self.decoding_layers() if layers is None else layers)
        if self.final_norm is not None:
            x = self.final_norm(x)
        x = jnp.where(next_state.overflowed, jnp.nan, x)  # written past the cache (inside jit): never a clamp
        return x, next_state.replace(keys=keys, values=values)

    def decoding_layers(self) -> list[nnx.Module]:
        """The blocks a cached decode step runs, one module per layer whatever the training layout: stacked
        (``scan_layers``) parameters are sliced by layer here, so that a decode loop given them reads each layer's
        weights in place (slices taken inside the loop are copied every step, and a scan over the layers copies the
        whole cache every step: ``models/layers/DECODING.md``). Dropout counters of sliced layers are not written
        back."""
        config = self.config
        if config.shared_layers:
            return [self.shared_layer] * config.num_layers
        if config.scan_layers:
            graphdef, state = nnx.split(self.layers)
            return [nnx.merge(graphdef, jax.tree.map(lambda leaf, i=i: leaf[i], state))
                    for i in range(config.num_layers)]
        return list(self.layers)

    def _decode_layers(self, layout: AttentionLayout, x: jax.Array, state: DecodeState, layers: list[nnx.Module]
                       ) -> tuple[jax.Array, tuple[jax.Array, ...], tuple[jax.Array, ...]]:
        """A cached decode step through ``layers`` (:meth:`decoding_layers`), one after another: ``x: [batch, q,
        hidden]``; the state's ``keys`` / ``values`` are one ``[batch · kv_heads, max_len, head_dim]`` buffer per
        layer, each written in place. Returns ``(x, keys, values)``."""
        kinds = self.config.sliding_layers
        new_keys, new_values = [], []
        for i, layer in enumerate(layers):
            cross = {} if not state.memory_keys else {"memory_kv": KVCache(state.memory_keys[i],
                                                                            state.memory_values[i])}
            x, cache, _ = layer(constrain(x, HIDDEN), layout, cache=KVCache(state.keys[i], state.values[i]),
                                sliding=kinds[i], **cross)
            x = constrain(x, HIDDEN)
            new_keys.append(cache.key)
            new_values.append(cache.value)
        return x, tuple(new_keys), tuple(new_values)

    def _run_layers(self, x: jax.Array, layout: AttentionLayout, return_weights: bool
                    ) -> tuple[jax.Array, tuple[jax.Array, ...] | None]:
        """The blocks over whole sequences ``x: [batch, seq, hidden]`` (cached decoding: :meth:`_decode_layers`).
        Returns ``(x, per-layer weights or None)``.

        Each block runs as a pure function of its state, so that ``jax.checkpoint`` (``config.remat``) and
        ``lax.scan`` (stacked layers) can wrap it. Non-parameter state the blocks change (dropout RNG counters, in
        training mode) is written back afterwards.
        """
        config = self.config

        kinds = config.sliding_layers  # per layer: through the sliding window or not
        mixed = len(set(kinds)) > 1

        def apply(graphdef, params, rest, h, sliding):
            layer = nnx.merge(graphdef, params, rest)
            h, _, weights = layer(constrain(h, HIDDEN), layout, return_weights=return_weights, sliding=sliding)
            return (constrain(h, HIDDEN), weights), nnx.state(layer, nnx.Not(nnx.Param))

        if config.remat != "none" and not return_weights:
            # A Python bool ``sliding`` is static; a scan over both kinds passes it traced.
            apply = jax.checkpoint(apply, policy=REMAT_POLICIES[config.remat],
                                   static_argnums=(0,) if config.scan_layers and mixed else (0, 4),
                                   prevent_cse=not config.scan_layers)
        blocks = self.shared_layer if config.shared_layers else self.layers
        mutates = any(isinstance(m, nnx.Dropout) and not m.deterministic and m.rate > 0
                      for _, m in nnx.iter_graph(blocks))
        sliding = jnp.asarray(kinds) if mixed else None
        if config.shared_layers and config.scan_layers:
            # One block's parameters, closed over by a scan of num_layers steps (no stacked copy); its other state
            # (dropout RNG counters) is carried from step to step.
            graphdef, params, rest = nnx.split(self.shared_layer, nnx.Param, ...)

            def shared_body(carry, layer_sliding):
                h, layer_rest = carry
                (h, weights), new_rest = apply(graphdef, params, layer_rest, h,
                                               layer_sliding if mixed else kinds[0])
                return (h, new_rest), weights

            (x, new_rest), weights = jax.lax.scan(shared_body, (x, rest), sliding, length=config.num_layers)
            if mutates:
                nnx.update(self.shared_layer, new_rest)
            return x, tuple(weights[i] for i in range(config.num_layers)) if return_weights else None
        if config.scan_layers:
            graphdef, params, rest = nnx.split(self.layers, nnx.Param, ...)

            def body(h, layer_state):
                layer_params, layer_rest, layer_sliding = layer_state
                (h, weights), new_rest = apply(graphdef, layer_params, layer_rest, h,
                                               layer_sliding if mixed else kinds[0])
                return h, (weights, new_rest)

            x, (weights, new_rest) = jax.lax.scan(body, x, (params, rest, sliding))
            if mutates:
                nnx.update(self.layers, new_rest)
            return x, tuple(weights[i] for i in range(config.num_layers)) if return_weights else None
        all_weights = []
        for i, layer in enumerate([blocks] * config.num_layers if config.shared_layers else blocks):
            graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
            (x, weights), new_rest = apply(graphdef, params, rest, x, kinds[i])
            if mutates:
                nnx.update(layer, new_rest)
            all_weights.append(weights)
        return x, tuple(all_weights) if return_weights else None

    def init_state(self, batch: int, max_len: int) -> DecodeState:
        """An empty decode state for ``batch`` rows of up to ``max_len`` tokens."""
        return DecodeState.create(self.config, batch, max_len)
