"""The score → softmax → weighted-sum core of attention, with a hand-written backward pass.

``softmax_attention`` computes ``softmax(q·kᵀ/√d + bias, masked) · v`` and differentiates it with the closed-form
attention gradient (the one flash attention uses) instead of JAX's autodiff of the softmax:

    dV = Pᵀ·dO,   dP = dO·Vᵀ,   dS = P ⊙ (dP − rowsum(dO ⊙ O)),   dQ = dS·K/√d,   dK = dSᵀ·Q/√d

It keeps only ``P`` and ``O`` for the backward pass and needs one elementwise pass over the ``[q, k]`` scores
there, where autodiff of ``exp / sum`` keeps several score-sized intermediates and walks them several times. On the
2-core CPU a GPT-2-layout layer (batch 8 × 256, 6 heads of 64) takes 34 ms forward + backward this way against 65 ms
through ``jax.nn.dot_product_attention``'s XLA path (README, Performance). On GPUs ``jax.nn.dot_product_attention``
can run cuDNN's fused flash attention instead, which never materialises ``P``; ``attend`` picks it there.

Everything runs heads-major: queries ``[batch, kv_heads, groups · q, head_dim]`` (the query heads sharing a key/value
head stacked as rows: grouped-query attention without copying keys and values), keys and values ``[batch, kv_heads,
k, head_dim]``; each (batch, kv head) pair is one matmul, and the layouts are transposed once on the way in and
out. Fully masked rows (pad queries) attend uniformly, as in ``jax.nn.dot_product_attention``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from models.config import ATTENTION_IMPLS


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


def _allowed(mask: jax.Array | None, is_causal: bool, kv_heads: int, groups: int, q_len: int,
             k_len: int) -> jax.Array | None:
    """Which scores take part (True), broadcastable to ``[batch, kv_heads, groups · q, k]``; None when all do."""
    allowed = None
    if mask is not None:
        mask = jnp.broadcast_to(mask.astype(bool), (*mask.shape[:2], q_len, k_len))
        allowed = _to_rows(mask, kv_heads, groups)
    if is_causal:
        causal_mask = jnp.tril(jnp.ones((q_len, k_len), bool), k_len - q_len)
        causal_mask = jnp.tile(causal_mask, (groups, 1))
        allowed = causal_mask if allowed is None else allowed & causal_mask
    return allowed


def _scores_to_probs(scores: jax.Array, mask: jax.Array | None, bias: jax.Array | None, is_causal: bool,
                     groups: int, q_len: int) -> jax.Array:
    """Softmax over the keys of float32 ``scores: [batch, kv_heads, groups · q, k]`` after the bias and mask."""
    kv_heads, k_len = scores.shape[1], scores.shape[-1]
    if bias is not None:
        bias = jnp.broadcast_to(bias.astype(jnp.float32), (*bias.shape[:2], q_len, k_len))
        scores = scores + _to_rows(bias, kv_heads, groups)
    allowed = _allowed(mask, is_causal, kv_heads, groups, q_len, k_len)
    if allowed is not None:
        scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
    shifted = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    return shifted / jnp.sum(shifted, axis=-1, keepdims=True)


def _forward(query, key, value, mask, bias, is_causal):
    """Context ``[batch, q, heads, d]`` and what the backward pass needs, all in the heads-major layout."""
    q_len, heads, head_dim = query.shape[1:]
    kv_heads = key.shape[2]
    groups = heads // kv_heads
    rows = _heads_major(query * jnp.asarray(1.0 / math.sqrt(head_dim), query.dtype), kv_heads)
    keys = key.transpose(0, 2, 1, 3)  # [batch, kv_heads, k, d]
    values = value.transpose(0, 2, 1, 3)
    scores = jnp.einsum("bhqd,bhkd->bhqk", rows, keys, preferred_element_type=jnp.float32)
    # Named so that a remat policy can keep them (models/layers/stack.py): recomputing them costs a forward pass.
    # The output is built from the named value, so a remat backward pass that needs it reuses the kept one.
    probs = checkpoint_name(_scores_to_probs(scores, mask, bias, is_causal, groups, q_len), "attention_probs")
    context_rows = checkpoint_name(jnp.einsum("bhqk,bhkd->bhqd", probs.astype(value.dtype), values),
                                   "attention_context")
    return _sequence_major(context_rows, q_len), (rows, keys, values, probs, context_rows)


def attention_with_weights(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array | None,
                           bias: jax.Array | None, is_causal: bool) -> tuple[jax.Array, jax.Array]:
    """``(context [batch, q, heads, d], weights [batch, heads, q, k])``, differentiated by autodiff.

    ``query: [batch, q, heads, d]``, ``key`` / ``value: [batch, k, kv_heads, d]``, ``mask``: boolean broadcastable to
    ``[batch, heads, q, k]`` (True = may attend) or None, ``bias``: additive, same broadcast, or None. ``is_causal``
    lets query ``i`` see keys ``<= i + (k - q)``.
    """
    context, (_, _, _, probs, _) = _forward(query, key, value, _as_4d(mask), _as_4d(bias), is_causal)
    batch, kv_heads, grouped_len, k_len = probs.shape
    q_len = query.shape[1]
    return context, probs.reshape(batch, kv_heads * (grouped_len // q_len), q_len, k_len)


def softmax_attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array | None,
                      bias: jax.Array | None, is_causal: bool) -> jax.Array:
    """``softmax(q·kᵀ/√d + bias) · v`` with the closed-form backward pass; arguments as in
    ``attention_with_weights``. Returns ``[batch, q, heads, d]``."""
    return _softmax_attention(query, key, value, _as_4d(mask), _as_4d(bias), is_causal)


def _as_4d(array: jax.Array | None) -> jax.Array | None:
    """A ``[k]`` / ``[q, k]`` / ``[heads, q, k]`` mask or bias with leading axes of size 1 added (autodiff sums the
    bias gradient back over them)."""
    if array is None or array.ndim == 4:
        return array
    if array.ndim > 4:
        raise ValueError(f"attention mask/bias has shape {tuple(array.shape)}: expected at most 4 axes "
                         "broadcastable to [batch, heads, q, k]")
    return array.reshape((1,) * (4 - array.ndim) + tuple(array.shape))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _softmax_attention(query, key, value, mask, bias, is_causal):
    return _forward(query, key, value, mask, bias, is_causal)[0]


def _softmax_attention_forward(query, key, value, mask, bias, is_causal):
    context, (rows, keys, values, probs, context_rows) = _forward(query, key, value, mask, bias, is_causal)
    return context, (rows, keys, values, probs, context_rows, mask, bias)


def _softmax_attention_backward(is_causal, residuals, context_grad):
    rows, keys, values, probs, context_rows, mask, bias = residuals  # rows/keys/values: the inputs' dtypes
    batch, q_len, heads, head_dim = context_grad.shape
    kv_heads = keys.shape[1]
    groups = heads // kv_heads
    grad_rows = _heads_major(context_grad, kv_heads)  # [batch, kv_heads, groups · q, d]
    value_grad = jnp.einsum("bhqk,bhqd->bhkd", probs.astype(grad_rows.dtype), grad_rows)
    probs_grad = jnp.einsum("bhqd,bhkd->bhqk", grad_rows, values, preferred_element_type=jnp.float32)
    row_dot = jnp.sum(grad_rows.astype(jnp.float32) * context_rows.astype(jnp.float32), axis=-1, keepdims=True)
    scores_grad = probs * (probs_grad - row_dot)  # d(loss)/d(scaled scores + bias), float32
    allowed = _allowed(mask, is_causal, kv_heads, groups, q_len, keys.shape[2])
    if allowed is not None:  # masked scores are constants: no gradient (matters in fully masked rows only)
        scores_grad = jnp.where(allowed, scores_grad, 0.0)
    scaled_scores_grad = (scores_grad * (1.0 / math.sqrt(head_dim))).astype(rows.dtype)
    query_grad = _sequence_major(jnp.einsum("bhqk,bhkd->bhqd", scaled_scores_grad, keys), q_len)
    # rows hold the query already scaled by 1/√d, which is the factor dK needs.
    key_grad = jnp.einsum("bhqk,bhqd->bhkd", scores_grad.astype(rows.dtype), rows)
    bias_grad = None
    if bias is not None:
        full = scores_grad.reshape(batch, kv_heads, groups, q_len, -1).reshape(batch, heads, q_len, -1)
        reduce_axes = tuple(axis for axis, size in enumerate(bias.shape) if size == 1 and full.shape[axis] != 1)
        bias_grad = jnp.sum(full, axis=reduce_axes, keepdims=True).reshape(bias.shape).astype(bias.dtype)
    return (query_grad.astype(rows.dtype), key_grad.transpose(0, 2, 1, 3).astype(keys.dtype),
            value_grad.transpose(0, 2, 1, 3).astype(values.dtype), None, bias_grad)


_softmax_attention.defvjp(_softmax_attention_forward, _softmax_attention_backward)


def resolve_attention_impl(impl: str) -> str:
    """``"softmax"`` or ``"fused"``: what ``impl`` means on the default backend (``"auto"``: fused on GPU)."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention impl {impl!r}: expected one of {ATTENTION_IMPLS}")
    if impl == "auto":
        return "fused" if jax.default_backend() == "gpu" else "softmax"
    return impl


def attend(query: jax.Array, key: jax.Array, value: jax.Array, *, mask: jax.Array | None, bias: jax.Array | None,
           is_causal: bool, impl: str = "auto") -> jax.Array:
    """Attention context ``[batch, q, heads, d]`` through the chosen implementation.

    ``impl="fused"``: ``jax.nn.dot_product_attention`` (cuDNN flash attention on GPU when shapes and dtypes allow,
    XLA otherwise); ``"softmax"``: ``softmax_attention`` above; ``"auto"``: fused on GPU, softmax elsewhere (the
    faster of the two measured on CPU).
    """
    if resolve_attention_impl(impl) == "fused":
        return jax.nn.dot_product_attention(query, key, value, bias=bias, mask=mask, is_causal=is_causal)
    return softmax_attention(query, key, value, mask, bias, is_causal)
