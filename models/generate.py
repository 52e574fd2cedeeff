"""Autoregressive generation: one compiled program (prefill + ``lax.while_loop`` over cached decode steps)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.layers.embeddings import check_index_range


def sample_logits(logits: jax.Array, rng: jax.Array, *, temperature: float, top_k: int | None,
                  top_p: float | None) -> jax.Array:
    """Pick next tokens from ``logits: [batch, vocab]``: argmax when ``temperature == 0``, else sample from the
    temperature-scaled distribution restricted to the ``top_k`` largest and/or the smallest set of mass ``top_p``."""
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits.astype(jnp.float32) / temperature
    neg_inf = jnp.finfo(jnp.float32).min
    if top_k is not None:
        kth_largest = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth_largest, neg_inf, logits)
    if top_p is not None:
        sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
        cumulative = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
        # Keep a token while the mass before it is below top_p: the first token always stays.
        keep_sorted = (cumulative - jax.nn.softmax(sorted_logits, axis=-1)) < top_p
        threshold = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < threshold, neg_inf, logits)
    return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


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


@partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "temperature", "top_k", "top_p", "eos_token_id"))
def _generate(graphdef, state, input_ids, prompt_mask, rng, *, max_new_tokens, temperature, top_k, top_p,
              eos_token_id):
    model = nnx.merge(graphdef, state)
    model.eval()
    batch, prompt_len = input_ids.shape
    total = prompt_len + max_new_tokens
    key_valid = jnp.concatenate([prompt_mask, jnp.zeros((batch, max_new_tokens), jnp.int32)], axis=1)
    positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)
    lengths = prompt_mask.sum(axis=1)
    logits, cache = model.decode(input_ids, cache=model.init_cache(batch, total), cache_index=0,
                                 key_valid=key_valid, position_ids=positions)
    fill = 0 if eos_token_id is None else eos_token_id
    tokens = jnp.full((batch, max_new_tokens), fill, jnp.int32)
    done = jnp.zeros((batch,), bool)

    def keep_going(carry):
        step, _, _, _, _, done = carry
        return (step < max_new_tokens) & ~done.all()

    def step_fn(carry):
        step, tokens, last_logits, cache, key_valid, done = carry
        next_token = sample_logits(last_logits, jax.random.fold_in(rng, step), temperature=temperature,
                                   top_k=top_k, top_p=top_p)
        next_token = jnp.where(done, fill, next_token)
        tokens = tokens.at[:, step].set(next_token)
        if eos_token_id is not None:
            done = done | (next_token == eos_token_id)
        key_valid = key_valid.at[:, prompt_len + step].set(1)
        logits, cache = model.decode(next_token[:, None], cache=cache, cache_index=prompt_len + step,
                                     key_valid=key_valid, position_ids=(lengths + step)[:, None])
        return step + 1, tokens, logits[:, -1], cache, key_valid, done

    carry = (jnp.int32(0), tokens, logits[:, -1], cache, key_valid, done)
    return jax.lax.while_loop(keep_going, step_fn, carry)[1]


def generate(model: nnx.Module, input_ids, max_new_tokens: int, *, attention_mask=None, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, eos_token_id: int | None = None,
             rng: jax.Array | None = None) -> jax.Array:
    """Continue each prompt by ``max_new_tokens`` tokens with a KV cache, the whole loop compiled on device.

    Args:
      model: a causal LM (``GPTForCausalLM``).
      input_ids: ``[batch, prompt]`` int; rows may be padded (left or right) as ``attention_mask`` says.
      attention_mask: ``[batch, prompt]`` 1 for real tokens, 0 for padding; None means no padding.
      temperature: 0 is greedy; otherwise sampling, optionally with ``top_k`` and/or nucleus ``top_p``.
      eos_token_id: a row stops at this token and is filled with it afterwards; the loop ends when all rows stop.
      rng: a ``jax.random`` key for sampling (default key 0).

    Returns ``[batch, prompt + max_new_tokens]``: ``input_ids`` unchanged, then each row's new tokens.
    """
    if not hasattr(model, "decode"):
        raise ValueError(f"generate needs a causal LM with a KV cache (GPTForCausalLM); got {type(model).__name__}")
    config = model.config
    input_ids = np.asarray(input_ids)
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids has shape {input_ids.shape}: expected [batch, prompt] with prompt >= 1")
    if not np.issubdtype(input_ids.dtype, np.integer):
        raise ValueError(f"input_ids has dtype {input_ids.dtype}: expected integer token ids")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r}: expected a positive integer")
    if temperature < 0:
        raise ValueError(f"temperature={temperature}: expected >= 0")
    if top_k is not None and not 1 <= top_k <= config.vocab_size:
        raise ValueError(f"top_k={top_k}: expected an integer in [1, {config.vocab_size}]")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p={top_p}: expected a probability in (0, 1]")
    if eos_token_id is not None:
        check_index_range(np.asarray([eos_token_id]), config.vocab_size, "eos_token_id")
    mask = np.ones_like(input_ids) if attention_mask is None else np.asarray(attention_mask)
    if mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {mask.shape}: expected {input_ids.shape}")
    model.transformer.decoder.check_inputs(input_ids, mask)
    total = input_ids.shape[1] + max_new_tokens
    if config.position in ("learned", "sinusoidal") and total > config.max_position_embeddings:
        raise ValueError(f"prompt + max_new_tokens = {total} exceeds max_position_embeddings="
                         f"{config.max_position_embeddings}")
    aligned_ids, aligned_mask = left_align(input_ids, mask.astype(np.int32))
    graphdef, state = nnx.split(model)
    new_tokens = _generate(graphdef, state, jnp.asarray(aligned_ids), jnp.asarray(aligned_mask),
                           jax.random.key(0) if rng is None else rng, max_new_tokens=max_new_tokens,
                           temperature=float(temperature), top_k=top_k, top_p=top_p, eos_token_id=eos_token_id)
    return jnp.concatenate([jnp.asarray(input_ids, jnp.int32), new_tokens], axis=1)
