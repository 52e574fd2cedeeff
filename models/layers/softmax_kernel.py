"""The score → softmax → weighted-sum core of attention, with a hand-written backward pass.

``softmax_attention`` computes ``softmax(q·kᵀ/√d + bias, masked) · v`` and differentiates it with the closed-form
attention gradient (the one flash attention uses) instead of JAX's autodiff of the softmax:

    dV = Pᵀ·dO,   dP = dO·Vᵀ,   dS = P ⊙ (dP − rowsum(dO ⊙ O)),   dQ = dS·K/√d,   dK = dSᵀ·Q/√d

It keeps only ``P`` and ``O`` for the backward pass and needs one elementwise pass over the ``[q, k]`` scores
there, where autodiff of ``exp / sum`` keeps several score-sized intermediates and walks them several times. On the
2-core CPU a GPT-2-layout layer (batch 8 × 256, 6 heads of 64) takes 34 ms forward + backward this way against 65 ms
through ``jax.nn.dot_product_attention``'s XLA path (README, Performance). On GPUs ``jax.nn.dot_product_attention``
can run cuDNN's fused flash attention instead, which never materialises ``P``; ``attention_core.attend`` picks it
there.

Everything runs heads-major: queries ``[batch, kv_heads, groups · q, head_dim]`` (the query heads sharing a key/value
head stacked as rows: grouped-query attention without copying keys and values), keys and values ``[batch, kv_heads,
k, head_dim]``; each (batch, kv head) pair is one matmul, and the layouts are transposed once on the way in and
out. Fully masked rows (pad queries) attend uniformly, as in ``jax.nn.dot_product_attention``.

Causal self-attention over 128 positions or more runs in query blocks (``causal_blocks``): block ``j`` reads only
the keys up to its own last query, so most of the masked upper triangle is never computed. 4 blocks do 62.5% of the
score and weighted-sum FLOPs; on the 2-core CPU the ``gpt_train`` step went from 1,434 to 1,348 ms.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from flaxzoo.models.layers.masking import causal_mask, symmetric_band, window_band


def _heads_major(query: jax.Array, kv_heads: int) -> jax.Array:
    """``[batch, q, heads, d]`` → ``[batch, kv_heads, groups · q, d]``: the query heads that share a key/value head
    become one block of rows, so each (batch, kv head) pair is one matmul."""
    batch, q_len, heads, head_dim = query.shape
    grouped = query.reshape(batch, q_len, kv_heads, heads // kv_heads, head_dim).transpose(0, 2, 3, 1, 4)
    return grouped.reshape(batch, kv_heads, heads // kv_heads * q_len, head_dim)


def _sequence_major(rows: jax.Array, q_len: int) -> jax.Array:
    """Inverse of ``_heads_major``: ``[batch, kv_heads, groups · q, d]`` → ``[batch, q, heads, d]``."""
    batch, kv_heads, grouped_len, head_dim = rows.shape
    groups = grouped_len // q_len
    grouped = rows.reshape(batch, kv_heads, groups, q_len, head_dim).transpose(0, 3, 1, 2, 4)
    return grouped.reshape(batch, q_len, kv_heads * groups, head_dim)


def _to_rows(array: jax.Array, kv_heads: int, groups: int) -> jax.Array:
    """A ``[batch|1, heads|1, q|1, k]`` mask or bias in the ``[batch|1, kv_heads|1, groups · q, k]`` score layout."""
    lead, heads, q_len, k_len = array.shape
    if heads == 1:
        return jnp.broadcast_to(array[:, :, None], (lead, 1, groups, q_len, k_len)).reshape(
            lead, 1, groups * q_len, k_len)
    return array.reshape(lead, kv_heads, groups * q_len, k_len)


def window_mask(q_len: int, k_len: int, window: int | None) -> jax.Array:
    """``[q, k]`` booleans of bottom-right-aligned causal attention: query ``i`` sees keys ``j <= i + (k - q)`` and,
    with a ``window``, only ``j > i + (k - q) - window`` (itself and the ``window - 1`` keys before it)."""
    allowed = causal_mask(q_len, k_len, k_len - q_len)
    if window is not None:
        allowed &= window_band(q_len, k_len, k_len - q_len, window)
    return allowed


def _allowed(mask: jax.Array | None, is_causal: bool, kv_heads: int, groups: int, q_len: int,
             k_len: int, window: int | None = None) -> jax.Array | None:
    """Which scores take part (True), broadcastable to ``[batch, kv_heads, groups · q, k]``; None when all do.
    ``window`` narrows the causal mask; without ``is_causal`` it is a bidirectional window
    (``masking.symmetric_band``), which callers pass only when no ``mask`` holds it already."""
    allowed = None
    if mask is not None:
        mask = jnp.broadcast_to(mask.astype(bool), (*mask.shape[:2], q_len, k_len))
        allowed = _to_rows(mask, kv_heads, groups)
    if is_causal:
        causal_mask = jnp.tile(window_mask(q_len, k_len, window), (groups, 1))
        allowed = causal_mask if allowed is None else allowed & causal_mask
    elif window is not None:
        band = jnp.tile(symmetric_band(q_len, k_len, k_len - q_len, window), (groups, 1))
        allowed = band if allowed is None else allowed & band
    return allowed


def soft_cap(scores: jax.Array, cap: float | None) -> jax.Array:
    """``cap · tanh(scores / cap)`` (Gemma 2's attention and logit soft-capping); ``scores`` unchanged for None."""
    return scores if cap is None else cap * jnp.tanh(scores / cap)


def _scores_to_probs(scores: jax.Array, mask: jax.Array | None, bias: jax.Array | None, is_causal: bool,
                     groups: int, q_len: int, window: int | None = None, softcap: float | None = None) -> jax.Array:
    """Softmax over the keys of float32 ``scores: [batch, kv_heads, groups · q, k]`` after the soft cap, the bias
    and the mask."""
    kv_heads, k_len = scores.shape[1], scores.shape[-1]
    scores = soft_cap(scores, softcap)
    if bias is not None:
        bias = jnp.broadcast_to(bias.astype(jnp.float32), (*bias.shape[:2], q_len, k_len))
        scores = scores + _to_rows(bias, kv_heads, groups)
    allowed = _allowed(mask, is_causal, kv_heads, groups, q_len, k_len, window)
    if allowed is not None:
        scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
    shifted = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    return shifted / jnp.sum(shifted, axis=-1, keepdims=True)


def _forward(query, key, value, mask, bias, dropout, is_causal, window=None, softcap=None):
    """Context ``[batch, q, heads, d]`` and what the backward pass needs, all in the heads-major layout.

    ``dropout``: None, or the ``[batch|1, heads|1, q, k]`` multiplier of the attention probabilities (0 for a dropped
    weight, ``1 / (1 - rate)`` for a kept one)."""
    q_len, heads, head_dim = query.shape[1:]
    kv_heads = key.shape[2]
    groups = heads // kv_heads
    rows = _heads_major(query * jnp.asarray(1.0 / math.sqrt(head_dim), query.dtype), kv_heads)
    keys = key.transpose(0, 2, 1, 3)  # [batch, kv_heads, k, d]
    values = value.transpose(0, 2, 1, 3)
    scores = jnp.einsum("bhqd,bhkd->bhqk", rows, keys, preferred_element_type=jnp.float32)
    # Named so that a remat policy can keep them (models/layers/stack.py): recomputing them costs a forward pass.
    # The output is built from the named value, so a remat backward pass that needs it reuses the kept one.
    probs = checkpoint_name(_scores_to_probs(scores, mask, bias, is_causal, groups, q_len, window, softcap),
                            "attention_probs")
    kept = probs if dropout is None else probs * _dropout_rows(dropout, kv_heads, groups, q_len, scores.shape[-1])
    context_rows = checkpoint_name(jnp.einsum("bhqk,bhkd->bhqd", kept.astype(value.dtype), values),
                                   "attention_context")
    return _sequence_major(context_rows, q_len), (rows, keys, values, probs, context_rows)


def _dropout_rows(dropout: jax.Array, kv_heads: int, groups: int, q_len: int, k_len: int) -> jax.Array:
    dropout = jnp.broadcast_to(dropout.astype(jnp.float32), (*dropout.shape[:2], q_len, k_len))
    return _to_rows(dropout, kv_heads, groups)


def attention_with_weights(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array | None,
                           bias: jax.Array | None, is_causal: bool, dropout: jax.Array | None = None, *,
                           window: int | None = None, softcap: float | None = None
                           ) -> tuple[jax.Array, jax.Array]:
    """``(context [batch, q, heads, d], weights [batch, heads, q, k])``, differentiated by autodiff.

    ``query: [batch, q, heads, d]``, ``key`` / ``value: [batch, k, kv_heads, d]``, ``mask``: boolean broadcastable to
    ``[batch, heads, q, k]`` (True = may attend) or None, ``bias``: additive, same broadcast, or None. ``is_causal``
    lets query ``i`` see keys ``<= i + (k - q)`` (bottom-right alignment). ``dropout``: None or the multiplier of the
    weights, same broadcast (the returned weights are before dropout). ``window`` / ``softcap``: as in
    :func:`attend`.
    """
    context, (_, _, _, probs, _) = _forward(query, key, value, as_4d(mask), as_4d(bias), as_4d(dropout),
                                            is_causal, window, softcap)
    batch, kv_heads, grouped_len, k_len = probs.shape
    q_len = query.shape[1]
    return context, probs.reshape(batch, kv_heads * (grouped_len // q_len), q_len, k_len)


def softmax_attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array | None,
                      bias: jax.Array | None, is_causal: bool, dropout: jax.Array | None = None, *,
                      window: int | None = None, softcap: float | None = None) -> jax.Array:
    """``dropout(softmax(q·kᵀ/√d + bias)) · v`` with the closed-form backward pass; arguments as in
    ``attention_with_weights``. Returns ``[batch, q, heads, d]``.

    Causal self-attention (``q == k``) without dropout runs in blocks of queries (:func:`causal_blocks`): block ``j``
    reads only the keys up to its own end, which skips most of the masked upper triangle (4 blocks: 62.5% of the
    score and weighted-sum FLOPs). The result is the same, fully masked rows included."""
    mask, bias, dropout = as_4d(mask), as_4d(bias), as_4d(dropout)
    q_len = query.shape[1]
    blocks = causal_blocks(q_len) if is_causal and q_len == key.shape[1] and dropout is None else 1
    if blocks == 1:
        return _softmax_attention(query, key, value, mask, bias, dropout, is_causal, window, softcap)
    size = q_len // blocks
    heads, kv_heads = query.shape[2], key.shape[2]
    # A fully masked row attends uniformly to every key (as jax.nn.dot_product_attention): the mean of all values.
    uniform = jnp.repeat(jnp.mean(value, axis=1, keepdims=True), heads // kv_heads, axis=2)  # [batch, 1, heads, d]
    contexts = []
    for j in range(blocks):
        queries, end = slice(j * size, (j + 1) * size), (j + 1) * size
        block_mask = _block(mask, queries, end)
        context = _softmax_attention(query[:, queries], key[:, :end], value[:, :end], block_mask,
                                     _block(bias, queries, end), None, True, window, softcap)
        if block_mask is not None:
            causal = window_mask(size, end, window)
            attends = jnp.any(block_mask.astype(bool) & causal, axis=-1)  # [batch|1, heads|1, size]
            context = jnp.where(attends.transpose(0, 2, 1)[..., None], context, uniform.astype(context.dtype))
        contexts.append(context)
    return jnp.concatenate(contexts, axis=1)



def cached_attention(query: jax.Array, key_rows: jax.Array, value_rows: jax.Array, mask: jax.Array | None,
                     bias: jax.Array | None, is_causal: bool, *, window: int | None = None,
                     softcap: float | None = None) -> jax.Array:
    """``softmax(q·kᵀ/√d + bias) · v`` of ``query: [batch, q, heads, d]`` over a KV cache kept as ``key_rows`` /
    ``value_rows: [batch · kv_heads, max_len, d]`` (``attention.KVCache``), for a cached decode step; ``mask`` /
    ``bias`` / ``window`` / ``softcap`` as in :func:`softmax_attention`. Returns ``[batch, q, heads, d]``.

    The matmuls read the cache buffers in their own shape: given a ``[batch, kv_heads, ...]`` view of them instead,
    XLA fused the step's in-place cache write into that view too, a copy of the whole cache per reader and step
    (``models/layers/DECODING.md``)."""
    batch, q_len, heads, head_dim = query.shape
    kv_heads = key_rows.shape[0] // batch
    groups = heads // kv_heads
    rows = _heads_major(query * jnp.asarray(1.0 / math.sqrt(head_dim), query.dtype), kv_heads)
    scores = jnp.einsum("nqd,nkd->nqk", rows.reshape(batch * kv_heads, groups * q_len, head_dim), key_rows,
                        preferred_element_type=jnp.float32)
    probs = _scores_to_probs(scores.reshape(batch, kv_heads, groups * q_len, -1), as_4d(mask), as_4d(bias),
                             is_causal, groups, q_len, window, softcap)
    context = jnp.einsum("nqk,nkd->nqd", probs.reshape(batch * kv_heads, groups * q_len, -1).astype(value_rows.dtype),
                         value_rows)
    return _sequence_major(context.reshape(batch, kv_heads, groups * q_len, head_dim), q_len)

CAUSAL_BLOCK_QUERIES = 64  # the smallest query block worth its own matmuls on the 2-core CPU (train/tools/bench/PERFORMANCE.md)
MAX_CAUSAL_BLOCKS = 8


def causal_blocks(q_len: int) -> int:
    """How many query blocks causal self-attention over ``q_len`` positions runs in: as many blocks of at least
    ``CAUSAL_BLOCK_QUERIES`` queries as divide ``q_len``, at most ``MAX_CAUSAL_BLOCKS`` (1 = unblocked)."""
    blocks = min(MAX_CAUSAL_BLOCKS, q_len // CAUSAL_BLOCK_QUERIES)
    while blocks > 1 and q_len % blocks:
        blocks -= 1
    return max(blocks, 1)


def _block(array: jax.Array | None, queries: slice, end: int) -> jax.Array | None:
    """Rows ``queries`` and keys ``[:end]`` of a ``[batch|1, heads|1, q|1, k|1]`` mask or bias."""
    if array is None:
        return None
    rows = array[:, :, queries] if array.shape[2] != 1 else array
    return rows[..., :end] if array.shape[3] != 1 else rows


def as_4d(array: jax.Array | None) -> jax.Array | None:
    """A ``[k]`` / ``[q, k]`` / ``[heads, q, k]`` mask or bias with leading axes of size 1 added (autodiff sums the
    bias gradient back over them)."""
    if array is None or array.ndim == 4:
        return array
    if array.ndim > 4:
        raise ValueError(f"attention mask/bias has shape {tuple(array.shape)}: expected at most 4 axes "
                         "broadcastable to [batch, heads, q, k]")
    return array.reshape((1,) * (4 - array.ndim) + tuple(array.shape))


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _softmax_attention(query, key, value, mask, bias, dropout, is_causal, window, softcap):
    return _forward(query, key, value, mask, bias, dropout, is_causal, window, softcap)[0]


def _softmax_attention_forward(query, key, value, mask, bias, dropout, is_causal, window, softcap):
    context, (rows, keys, values, probs, context_rows) = _forward(query, key, value, mask, bias, dropout, is_causal,
                                                                  window, softcap)
    return context, (rows, keys, values, probs, context_rows, mask, bias, dropout)


def _softmax_attention_backward(is_causal, window, softcap, residuals, context_grad):
    rows, keys, values, probs, context_rows, mask, bias, dropout = residuals  # rows/keys/values: the inputs' dtypes
    batch, q_len, heads, head_dim = context_grad.shape
    kv_heads = keys.shape[1]
    groups = heads // kv_heads
    grad_rows = _heads_major(context_grad, kv_heads)  # [batch, kv_heads, groups · q, d]
    # With dropout D the output is (P ⊙ D)·V: dV and dP take D, and rowsum(dO ⊙ O) = rowsum(dP ⊙ P) still holds.
    multiplier = None if dropout is None else _dropout_rows(dropout, kv_heads, groups, q_len, keys.shape[2])
    kept = probs if multiplier is None else probs * multiplier
    value_grad = jnp.einsum("bhqk,bhqd->bhkd", kept.astype(grad_rows.dtype), grad_rows)
    probs_grad = jnp.einsum("bhqd,bhkd->bhqk", grad_rows, values, preferred_element_type=jnp.float32)
    if multiplier is not None:
        probs_grad = probs_grad * multiplier
    row_dot = jnp.sum(grad_rows.astype(jnp.float32) * context_rows.astype(jnp.float32), axis=-1, keepdims=True)
    biased_grad = probs * (probs_grad - row_dot)  # d(loss)/d(capped scores + bias), float32
    allowed = _allowed(mask, is_causal, kv_heads, groups, q_len, keys.shape[2], window)
    if allowed is not None:  # masked scores are constants: no gradient (matters in fully masked rows only)
        biased_grad = jnp.where(allowed, biased_grad, 0.0)
    scores_grad = biased_grad
    if softcap is not None:  # d(c·tanh(s/c))/ds = 1 - tanh²(s/c); the raw scores are recomputed, not kept
        raw = jnp.einsum("bhqd,bhkd->bhqk", rows, keys, preferred_element_type=jnp.float32)
        scores_grad = biased_grad * (1.0 - jnp.square(jnp.tanh(raw / softcap)))
    scaled_scores_grad = (scores_grad * (1.0 / math.sqrt(head_dim))).astype(rows.dtype)
    query_grad = _sequence_major(jnp.einsum("bhqk,bhkd->bhqd", scaled_scores_grad, keys), q_len)
    # rows hold the query already scaled by 1/√d, which is the factor dK needs.
    key_grad = jnp.einsum("bhqk,bhqd->bhkd", scores_grad.astype(rows.dtype), rows)
    bias_grad = None
    if bias is not None:
        full = biased_grad.reshape(batch, kv_heads, groups, q_len, -1).reshape(batch, heads, q_len, -1)
        reduce_axes = tuple(axis for axis, size in enumerate(bias.shape) if size == 1 and full.shape[axis] != 1)
        bias_grad = jnp.sum(full, axis=reduce_axes, keepdims=True).reshape(bias.shape).astype(bias.dtype)
    dropout_grad = None if dropout is None else jnp.zeros_like(dropout)
    return (query_grad.astype(rows.dtype), key_grad.transpose(0, 2, 1, 3).astype(keys.dtype),
            value_grad.transpose(0, 2, 1, 3).astype(values.dtype), None, bias_grad, dropout_grad)


_softmax_attention.defvjp(_softmax_attention_forward, _softmax_attention_backward)
