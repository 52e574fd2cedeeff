"""Autoregressive generation: one compiled program (prefill + ``lax.while_loop`` over cached decode steps).

The program is compiled once per model, batch shape, ``max_new_tokens`` and kind of decoding (greedy, sampling,
with or without top-k / top-p): the values of ``temperature``, ``top_k``, ``top_p``, the stop ids and the key are
arguments, so changing them does not recompile.
"""

from __future__ import annotations

import secrets
from functools import partial
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxzoo.models.layers.embeddings import as_index_array, check_token_ids
from flaxzoo.models.sampling import check_sampling_args, sample_logits


def left_align(input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Move each row's real tokens to the right end (left padding), so every row's next token goes to the same
    cache slot. Each row's real tokens must be contiguous (left or right padding)."""
    batch, prompt_len = input_ids.shape
    lengths = attention_mask.sum(axis=1)
    starts = attention_mask.argmax(axis=1)
    for row in range(batch):
        if lengths[row] == 0:
            raise ValueError(f"prompt row {row} has no real tokens (attention_mask is all zeros)")
        if not attention_mask[row, starts[row]:starts[row] + lengths[row]].all():
            raise ValueError(f"attention_mask row {row} is not contiguous: expected left or right padding")
    slots = np.arange(prompt_len)[None, :]
    first_slot = (prompt_len - lengths)[:, None]
    source = np.clip(starts[:, None] + slots - first_slot, 0, prompt_len - 1)
    valid = slots >= first_slot
    aligned = np.where(valid, np.take_along_axis(input_ids, source, axis=1), 0)
    return aligned.astype(np.int32), valid.astype(np.int32)


@partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "greedy"))
def _generate(graphdef, state, input_ids, prompt_mask, rng, temperature, top_k, top_p, stop_ids, fill, *,
              max_new_tokens, greedy):
    """``[batch, max_new_tokens]`` new tokens. ``stop_ids: [n]`` (-1 entries match nothing); ``fill``: the id written
    after a stop."""
    model = nnx.merge(graphdef, state)
    model.eval()
    batch, prompt_len = input_ids.shape
    # The last new token is never fed back, so the cache needs one slot less than prompt + new tokens.
    decode_state = model.init_state(batch, prompt_len + max_new_tokens - 1)
    logits, decode_state = model.decode(input_ids, decode_state, prompt_mask, last_only=True)

    def pick(logits, step, done):
        if greedy:
            token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
        else:
            token = sample_logits(logits[:, -1], jax.random.fold_in(rng, step), temperature, top_k, top_p)
        token = jnp.where(done, fill, token)
        return token, done | (token[:, None] == stop_ids[None, :]).any(axis=-1)

    first, done = pick(logits, 0, jnp.zeros((batch,), bool))
    tokens = jnp.full((batch, max_new_tokens), fill, jnp.int32).at[:, 0].set(first)

    def keep_going(carry):
        step, _, _, _, done = carry
        return (step < max_new_tokens) & ~done.all()

    def step_fn(carry):
        step, tokens, last, decode_state, done = carry
        logits, decode_state = model.decode(last[:, None], decode_state)
        token, done = pick(logits, step, done)
        return step + 1, tokens.at[:, step].set(token), token, decode_state, done

    return jax.lax.while_loop(keep_going, step_fn, (jnp.int32(1), tokens, first, decode_state, done))[1]


def _stop_ids(eos_token_id, vocab_size: int) -> tuple[int, ...]:
    if eos_token_id is None:
        return ()
    ids = (eos_token_id,) if isinstance(eos_token_id, (int, np.integer)) else tuple(eos_token_id)
    for token in ids:
        if not isinstance(token, (int, np.integer)) or isinstance(token, bool) or not 0 <= token < vocab_size:
            raise ValueError(f"eos_token_id={eos_token_id!r}: expected a token id in [0, {vocab_size}) or a list "
                             "of them")
    if not ids:
        raise ValueError("eos_token_id=[]: expected a token id, a non-empty list of them, or None")
    return tuple(int(t) for t in ids)


def _padded_stop_ids(stop_ids: tuple[int, ...]) -> np.ndarray:
    """The stop ids padded with -1 (never a token) to 8 or the next power of two: few shapes, few compilations."""
    size = max(8, 1 << max(len(stop_ids) - 1, 0).bit_length())
    padded = np.full((size,), -1, np.int32)
    padded[:len(stop_ids)] = stop_ids
    return padded


def generate(model: nnx.Module, input_ids, max_new_tokens: int, *, attention_mask=None, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, eos_token_id: int | Sequence[int] | None = None,
             rng: jax.Array | None = None, seed: int | None = None) -> jax.Array:
    """Continue each prompt by ``max_new_tokens`` tokens with a KV cache, the whole loop compiled on device.

    Args:
      model: a causal LM (``GPTForCausalLM``).
      input_ids: ``[batch, prompt]`` ints (an array or lists); rows may be padded (left or right) as
        ``attention_mask`` says. Only real tokens are checked against the vocabulary and count against the
        positions a learned / sinusoidal table has.
      attention_mask: ``[batch, prompt]`` 1 for real tokens, 0 for padding; None means no padding.
      temperature: 0 is greedy; otherwise sampling, optionally restricted to the ``top_k`` most likely tokens and/or
        the nucleus of mass ``top_p`` (applied in that order, as transformers does).
      eos_token_id: an id or a list of ids; a row that emits any of them keeps that token and is padded from there
        on (``config.pad_token_id``, or the first stop id when the config has none); the loop ends when all rows
        have stopped. None: never stop early.
      rng / seed: the ``jax.random`` key, or an int seed, for sampling (at most one of them). With neither, sampling
        draws a fresh seed from the operating system each call (two calls give different samples); pass one to
        reproduce a sample. Greedy decoding uses no randomness.

    Returns ``[batch, prompt + max_new_tokens]``: ``input_ids`` unchanged, then each row's new tokens.
    """
    if not hasattr(model, "decode") or not hasattr(model, "init_state"):
        raise ValueError(f"generate needs a causal LM with a KV cache (GPTForCausalLM); got {type(model).__name__}")
    config = model.config
    input_ids = np.asarray(as_index_array(input_ids, "input_ids", expected="[batch, prompt]"))
    if 0 in input_ids.shape:
        raise ValueError(f"input_ids has shape {input_ids.shape}: expected [batch, prompt] with batch >= 1 and "
                         "prompt >= 1")
    if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r}: expected a positive integer")
    temperature, top_k, top_p = check_sampling_args(temperature, top_k, top_p, config.vocab_size)
    stop_ids = _stop_ids(eos_token_id, config.vocab_size)
    mask = np.ones_like(input_ids) if attention_mask is None else np.asarray(
        as_index_array(attention_mask, "attention_mask", expected="[batch, prompt]", allow_bool=True))
    if mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {mask.shape}: expected {input_ids.shape}")
    if not np.isin(mask, [0, 1]).all():
        raise ValueError(f"attention_mask holds values {np.unique(mask).tolist()}: expected only 0 and 1")
    check_token_ids(input_ids[mask == 1], config)
    longest = int(mask.sum(axis=1).max())
    needed = longest + max_new_tokens - 1 + config.position_offset  # the last new token is never fed back
    if config.position in ("learned", "sinusoidal") and needed > config.max_position_embeddings:
        raise ValueError(f"prompt + max_new_tokens = {longest} + {max_new_tokens} tokens need {needed} positions "
                         f"(the last new token is not fed back), more than max_position_embeddings="
                         f"{config.max_position_embeddings} of this model's {config.position} positions (the "
                         "longest prompt's real tokens are counted)")
    if rng is not None and seed is not None:
        raise ValueError("pass at most one of rng (a jax.random key) and seed (an int)")
    if seed is not None and (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool)):
        raise ValueError(f"seed={seed!r}: expected an integer")
    if rng is not None and not (isinstance(rng, jax.Array) and (jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) or (
            rng.dtype == jnp.uint32 and rng.shape == (2,)))):
        raise ValueError(f"rng={rng!r}: expected a jax.random key (jax.random.key(seed)); pass seed=... for an int")
    greedy = temperature == 0.0
    if rng is None:
        rng = jax.random.key(0 if greedy else (secrets.randbits(63) if seed is None else int(seed)))
    fill = config.pad_token_id if config.pad_token_id is not None else (stop_ids[0] if stop_ids else 0)
    aligned_ids, aligned_mask = left_align(input_ids, mask.astype(np.int32))
    graphdef, state = nnx.split(model)
    new_tokens = _generate(graphdef, state, jnp.asarray(aligned_ids), jnp.asarray(aligned_mask), rng,
                           jnp.float32(temperature), jnp.int32(top_k), jnp.float32(top_p),
                           jnp.asarray(_padded_stop_ids(stop_ids)), jnp.int32(fill),
                           max_new_tokens=int(max_new_tokens), greedy=greedy)
    return jnp.concatenate([jnp.asarray(input_ids, jnp.int32), new_tokens], axis=1)
