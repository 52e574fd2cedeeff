"""The layer stack both families share: input checks, embeddings, masks, positions, blocks, final norm."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.config import TransformerConfig
from models.layers.attention import KVCache, make_attention_mask
from models.layers.block import TransformerBlock
from models.layers.embeddings import InputEmbeddings, check_index_range, is_concrete
from models.layers.norms import make_norm
from models.layers.positions import alibi_bias

# The remat policies a config can name: what each layer keeps for the backward pass.
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,  # keep only the layer's input; recompute the rest
    # Keep the weight-matmul outputs and the attention kernel's residuals (its softmax weights and output).
    "dots": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        jax.checkpoint_policies.save_only_these_names("attention_probs", "attention_context")),
}


class StackOutput(NamedTuple):
    """``hidden: [batch, seq, hidden]``; ``cache``: one KVCache per layer (decoding only); ``attention_weights``:
    one ``[batch, heads, q, k]`` array per layer when asked for."""

    hidden: jax.Array
    cache: tuple[KVCache, ...] | None = None
    attention_weights: tuple[jax.Array, ...] | None = None


def _check_mask(mask, expected_shape: tuple[int, ...], name: str) -> None:
    if mask is None:
        return
    if tuple(mask.shape) != tuple(expected_shape):
        raise ValueError(f"{name} has shape {tuple(mask.shape)}: expected {tuple(expected_shape)} "
                         "(one entry per token, 1 = real token, 0 = padding)")
    if is_concrete(mask):
        values = np.unique(np.asarray(mask))
        if not np.isin(values, [0, 1]).all():
            raise ValueError(f"{name} holds values {values.tolist()}: expected only 0 and 1")


class TransformerStack(nnx.Module):
    """Embeddings → ``num_layers`` blocks → final norm (pre-LN models). Causal or bidirectional per the config."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embeddings = InputEmbeddings(config, rngs=rngs)
        self.layers = nnx.List([TransformerBlock(config, rngs=rngs) for _ in range(config.num_layers)])
        self.final_norm = make_norm(config, rngs) if config.final_norm else None

    def default_positions(self, attention_mask: jax.Array | None, batch: int, seq: int,
                          offset: jax.Array | int = 0) -> jax.Array:
        """``[batch, seq]`` positions. Decoders count real tokens only (``cumsum(mask) - 1``) so left padding does
        not shift them; encoders use ``0..seq-1`` as BERT does."""
        if attention_mask is not None and self.config.causal:
            return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)
        return jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32) + offset, (batch, seq))

    def check_inputs(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                     total_length: int | None = None, *, inputs_embeds=None) -> None:
        """Raise ``ValueError`` for inputs the compiled model would silently mishandle."""
        config = self.config
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids [batch, seq] and inputs_embeds [batch, seq, hidden]")
        if inputs_embeds is not None:
            if inputs_embeds.ndim != 3 or inputs_embeds.shape[-1] != config.hidden_size:
                raise ValueError(f"inputs_embeds has shape {tuple(inputs_embeds.shape)}: expected "
                                 f"[batch, seq, {config.hidden_size}]")
            shape = tuple(inputs_embeds.shape[:2])
        else:
            if input_ids.ndim != 2:
                raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}: expected [batch, seq]")
            if not jnp.issubdtype(input_ids.dtype, jnp.integer):
                raise ValueError(f"input_ids has dtype {input_ids.dtype}: expected integer token ids")
            check_index_range(input_ids, config.vocab_size, "input_ids")
            shape = tuple(input_ids.shape)
        length = total_length if total_length is not None else shape[1]
        if config.position in ("learned", "sinusoidal") and length > config.max_position_embeddings:
            raise ValueError(f"sequence length {length} exceeds max_position_embeddings="
                             f"{config.max_position_embeddings} of this model's {config.position} positions")
        _check_mask(attention_mask, shape, "attention_mask")
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
                 inputs_embeds: jax.Array | None = None, segment_ids: jax.Array | None = None,
                 cache: tuple[KVCache, ...] | None = None,
                 cache_index: jax.Array | None = None, key_valid: jax.Array | None = None,
                 return_attention_weights: bool = False) -> StackOutput:
        """Run the stack on ``input_ids: [batch, seq]``.

        ``attention_mask: [batch, seq]`` (1 = token, 0 = padding). For decoding against a cache, pass ``cache``,
        ``cache_index`` (the slot of the first new token) and ``key_valid: [batch, max_len]`` (which cache slots hold
        real tokens, including the new ones) instead of ``attention_mask``, and explicit ``position_ids``.

        ``inputs_embeds: [batch, seq, hidden]``, given instead of ``input_ids`` (which must then be None), replaces the
        token-embedding lookup; positions, token types and the embedding norm are still added. It lets a caller
        differentiate with respect to the inputs (e.g. to check causality) or feed soft prompts.
        """
        config = self.config
        batch, seq = (input_ids if inputs_embeds is None else inputs_embeds).shape[:2]
        if cache is None:
            self.check_inputs(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds=inputs_embeds)
            if position_ids is None:
                position_ids = self.default_positions(attention_mask, batch, seq)
            query_slots = key_slots = jnp.arange(seq)
            key_positions = position_ids
            mask = make_attention_mask(attention_mask, causal=config.causal and attention_mask is not None,
                                       query_slots=query_slots, key_slots=key_slots)
        else:
            if position_ids is None or key_valid is None:
                raise ValueError("decoding with a cache needs position_ids and key_valid")
            max_len = cache[0].key.shape[1]
            query_slots = cache_index + jnp.arange(seq)
            key_slots = jnp.arange(max_len)
            # A cache slot's position: real tokens are counted, as in default_positions.
            key_positions = jnp.maximum(jnp.cumsum(key_valid.astype(jnp.int32), axis=-1) - 1, 0)
            mask = make_attention_mask(key_valid, causal=config.causal, query_slots=query_slots,
                                       key_slots=key_slots)
        bias = (alibi_bias(config.num_heads, position_ids, key_positions, causal=config.causal)
                if config.position == "alibi" else None)
        x = self.embeddings(input_ids, position_ids, token_type_ids, inputs_embeds=inputs_embeds)
        new_cache, weights = [], []
        if cache is None and not return_attention_weights and (config.remat != "none" or config.scan_layers):
            x = self._run_layers_functional(x, positions=position_ids, mask=mask, bias=bias)
        else:
            for i, layer in enumerate(self.layers):
                x, layer_cache, layer_weights = layer(
                    x, positions=position_ids, mask=mask, bias=bias, cache=None if cache is None else cache[i],
                    cache_index=cache_index, return_weights=return_attention_weights)
                new_cache.append(layer_cache)
                weights.append(layer_weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return StackOutput(x, tuple(new_cache) if cache is not None else None,
                           tuple(weights) if return_attention_weights else None)

    def _run_layers_functional(self, x: jax.Array, *, positions: jax.Array, mask: jax.Array | None,
                               bias: jax.Array | None) -> jax.Array:
        """The layers as pure functions of their state, so that ``jax.checkpoint`` (``config.remat``) and
        ``lax.scan`` (``config.scan_layers``) can wrap them. ``[batch, seq, hidden]`` in and out.

        Parameters stay where they are (``layers.0 ... layers.{L-1}``): a scan stacks them into ``[L, ...]`` arrays
        inside the computation only, so checkpoints and the Hugging Face mapping see the same layout with either
        option. Non-parameter state the layers change (dropout RNG counters, in training mode with ``dropout`` > 0)
        is written back afterwards.
        """
        config = self.config

        def apply(graphdef, params, rest, h):
            layer = nnx.merge(graphdef, params, rest)
            h, _, _ = layer(h, positions=positions, mask=mask, bias=bias)
            return h, nnx.state(layer, nnx.Not(nnx.Param))

        if config.remat != "none":
            apply = jax.checkpoint(apply, policy=REMAT_POLICIES[config.remat], static_argnums=(0,),
                                   prevent_cse=not config.scan_layers)
        # Dropout in training mode advances its RNG counters; nothing else changes (and eval mode writes nothing).
        mutates = config.dropout > 0 and any(not m.deterministic for _, m in nnx.iter_graph(self.layers[0])
                                             if isinstance(m, nnx.Dropout))
        splits = [nnx.split(layer, nnx.Param, ...) for layer in self.layers]
        graphdef = splits[0][0]
        if not config.scan_layers or any(g != graphdef for g, _, _ in splits):
            for layer, (graphdef, params, rest) in zip(self.layers, splits):
                x, new_rest = apply(graphdef, params, rest, x)
                if mutates:
                    nnx.update(layer, new_rest)
            return x
        stacked_params, stacked_rest = jax.tree.map(lambda *leaves: jnp.stack(leaves),
                                                    *[(params, rest) for _, params, rest in splits])

        def body(h, layer_state):
            return apply(graphdef, *layer_state, h)

        x, new_rests = jax.lax.scan(body, x, (stacked_params, stacked_rest))
        if mutates:
            for i, layer in enumerate(self.layers):
                nnx.update(layer, jax.tree.map(lambda leaf: leaf[i], new_rests))
        return x

    def init_cache(self, batch: int, max_len: int) -> tuple[KVCache, ...]:
        """Empty per-layer caches ``[batch, max_len, kv_heads, head_dim]``."""
        return tuple(KVCache.zeros(self.config, batch, max_len) for _ in range(self.config.num_layers))


# ------------------------------------------------------------------------------------------ the two parameter layouts
# With ``scan_layers`` the blocks' parameters live stacked: ``(..., "layers", <rest>)`` of shape ``[num_layers, ...]``.
# Without it each block is its own entry: ``(..., "layers", i, <rest>)``. Checkpoint formats (Hugging Face, GGUF,
# flaxzoo checkpoints) are read and written per layer and converted with these two functions at the boundary.
LAYERS = "layers"
LAYER_AXIS = "layers"  # the logical name of the stacked axis (replicated: every device runs every layer)


def _layers_position(path: tuple) -> int | None:
    return path.index(LAYERS) if LAYERS in path else None


def stack_layer_values(values: dict[tuple, Any], num_layers: int) -> dict[tuple, Any]:
    """Per-layer ``{(..., "layers", i, *rest): [...]}`` → stacked ``{(..., "layers", *rest): [num_layers, ...]}``.

    Other entries pass through. Raises ``ValueError`` naming the first parameter some layer lacks."""
    out: dict[tuple, Any] = {}
    groups: dict[tuple, dict[int, Any]] = {}
    for path, value in values.items():
        at = _layers_position(path)
        if at is None or at + 1 >= len(path) or not isinstance(path[at + 1], int):
            out[path] = value
            continue
        groups.setdefault(path[:at + 1] + path[at + 2:], {})[path[at + 1]] = value
    for path, per_layer in groups.items():
        if sorted(per_layer) != list(range(num_layers)):
            missing = sorted(set(range(num_layers)) - set(per_layer))
            raise ValueError(f"{'.'.join(map(str, path))}: no value for layer(s) {missing} of {num_layers}")
        out[path] = np.stack([np.asarray(per_layer[i]) for i in range(num_layers)]) if all(
            isinstance(per_layer[i], np.ndarray) for i in range(num_layers)) else jnp.stack(
            [per_layer[i] for i in range(num_layers)])
    return out


def unstack_layer_values(values: dict[tuple, Any], num_layers: int) -> dict[tuple, Any]:
    """Inverse of ``stack_layer_values``: entries below ``layers`` that are not per-layer already are split along
    their first axis (which must be ``num_layers`` long)."""
    out: dict[tuple, Any] = {}
    for path, value in values.items():
        at = _layers_position(path)
        if at is None or (at + 1 < len(path) and isinstance(path[at + 1], int)):
            out[path] = value
            continue
        if value.shape[:1] != (num_layers,):
            raise ValueError(f"{'.'.join(map(str, path))} has shape {tuple(value.shape)}: expected a leading "
                             f"axis of num_layers={num_layers} (stacked layers)")
        for i in range(num_layers):
            out[path[:at + 1] + (i,) + path[at + 1:]] = value[i]
    return out
