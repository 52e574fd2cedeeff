"""The score → softmax → weighted-sum core of attention, with a hand-written backward pass.

``softmax_attention`` computes ``softmax(q·kᵀ/√d + bias, masked) · v`` and differentiates it with the closed-form
attention gradient (the one flash attention uses) instead of JAX's autodiff of the softmax:

    dV = Pᵀ·dO,   dP = dO·Vᵀ,   dS = P ⊙ (dP − rowsum(dO ⊙ O)),   dQ = dS·K/√d,   dK = dSᵀ·Q/√d

It keeps only ``P`` and ``O`` for the backward pass and needs one elementwise pass over the ``[q, k]`` scores
there, where autodiff of ``exp / sum`` keeps several score-sized intermediates and walks them several times. On the
2-core CPU a GPT-2-layout layer (batch 8 × 256, 6 heads of 64) takes 34 ms forward + backward this way against 65 ms
through ``jax.nn.dot_product_attention``'s XLA path (README, Performance). On GPUs ``jax.nn.dot_product_attention``
can run cuDNN's fused flash attention instead, which never materialises ``P``; ``attend`` picks it there.

Grouped-query heads are handled by grouping the query heads (``[batch, kv_heads, groups, q, head_dim]``), never by
copying keys and values. Fully masked rows (pad queries) attend uniformly, as in ``jax.nn.dot_product_attention``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from models.config import ATTENTION_IMPLS


def _group_heads(query: jax.Array, kv_heads: int) -> jax.Array:
    """``[batch, q, heads, d]`` → ``[batch, kv_heads, groups, q, d]``."""
    batch, q_len, heads, head_dim = query.shape
    grouped = query.reshape(batch, q_len, kv_heads, heads // kv_heads, head_dim)
    return grouped.transpose(0, 2, 3, 1, 4)


def _ungroup_heads(grouped: jax.Array) -> jax.Array:
    """``[batch, kv_heads, groups, q, d]`` → ``[batch, q, heads, d]``."""
    batch, kv_heads, groups, q_len, head_dim = grouped.shape
    return grouped.transpose(0, 3, 1, 2, 4).reshape(batch, q_len, kv_heads * groups, head_dim)


def _allowed(mask: jax.Array | None, is_causal: bool, grouped_shape: tuple[int, ...]) -> jax.Array | None:
    """Which scores take part (True), broadcastable to ``grouped_shape``; None when all do."""
    allowed = None if mask is None else _to_grouped(mask.astype(bool), grouped_shape)
    if is_causal:
        q_len, k_len = grouped_shape[-2:]
        causal_mask = jnp.tril(jnp.ones((q_len, k_len), bool), k_len - q_len)
        allowed = causal_mask if allowed is None else allowed & causal_mask
    return allowed


def attention_probabilities(query: jax.Array, key: jax.Array, mask: jax.Array | None, bias: jax.Array | None,
                            is_causal: bool) -> jax.Array:
    """Softmax weights ``[batch, kv_heads, groups, q, k]`` in float32.

    ``query: [batch, q, heads, d]``, ``key: [batch, k, kv_heads, d]``, ``mask``: boolean, broadcastable to
    ``[batch, heads, q, k]`` (True = may attend), ``bias``: additive, broadcastable to ``[batch, heads, q, k]``.
    ``is_causal`` lets query ``i`` see keys ``<= i + (k - q)``.
    """
    kv_heads, head_dim = key.shape[2], key.shape[3]
    grouped_query = _group_heads(query * jnp.asarray(1.0 / math.sqrt(head_dim), query.dtype), kv_heads)
    scores = jnp.einsum("bhgqd,bkhd->bhgqk", grouped_query, key, preferred_element_type=jnp.float32)
    shape = scores.shape
    if bias is not None:
        scores = scores + _to_grouped(bias.astype(jnp.float32), shape)
    allowed = _allowed(mask, is_causal, shape)
    if allowed is not None:
        scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
    shifted = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    return shifted / jnp.sum(shifted, axis=-1, keepdims=True)


def _to_grouped(array: jax.Array, grouped_shape: tuple[int, ...]) -> jax.Array:
    """Broadcast a ``[batch|1, heads|1, q|1, k]`` array to the grouped ``[batch, kv_heads, groups, q, k]`` layout."""
    batch, kv_heads, groups, q_len, k_len = grouped_shape
    array = jnp.broadcast_to(array, (array.shape[0], array.shape[1], q_len, k_len))
    if array.shape[1] == 1:
        return array[:, :, None]
    return array.reshape(array.shape[0], kv_heads, groups, q_len, k_len)


def _weighted_values(probs: jax.Array, value: jax.Array) -> jax.Array:
    """``probs: [batch, kv_heads, groups, q, k]``, ``value: [batch, k, kv_heads, d]`` → ``[batch, kv_heads, groups,
    q, d]`` in the value dtype."""
    return jnp.einsum("bhgqk,bkhd->bhgqd", probs.astype(value.dtype), value)


def attention_with_weights(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array | None,
                           bias: jax.Array | None, is_causal: bool) -> tuple[jax.Array, jax.Array]:
    """``(context [batch, q, heads, d], weights [batch, heads, q, k])``, differentiated by autodiff."""
    probs = attention_probabilities(query, key, mask, bias, is_causal)
    batch, kv_heads, groups, q_len, k_len = probs.shape
    return (_ungroup_heads(_weighted_values(probs, value)),
            probs.reshape(batch, kv_heads * groups, q_len, k_len))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def softmax_attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array | None,
                      bias: jax.Array | None, is_causal: bool) -> jax.Array:
    """``softmax(q·kᵀ/√d + bias) · v`` with the closed-form backward pass.

    ``query: [batch, q, heads, d]``, ``key`` / ``value: [batch, k, kv_heads, d]``, ``mask``: boolean broadcastable to
    ``[batch, heads, q, k]`` or None, ``bias``: additive, same broadcast, or None. Returns ``[batch, q, heads, d]``.
    """
    return _softmax_attention_forward(query, key, value, mask, bias, is_causal)[0]


def _softmax_attention_forward(query, key, value, mask, bias, is_causal):
    # Named so that a remat policy can keep them (models/layers/stack.py): recomputing them costs a forward pass.
    probs = checkpoint_name(attention_probabilities(query, key, mask, bias, is_causal), "attention_probs")
    grouped_context = checkpoint_name(_weighted_values(probs, value), "attention_context")
    return _ungroup_heads(grouped_context), (query, key, value, mask, bias, probs, grouped_context)


def _softmax_attention_backward(is_causal, residuals, context_grad):
    query, key, value, mask, bias, probs, grouped_context = residuals
    kv_heads, head_dim = key.shape[2], key.shape[3]
    grouped_grad = _group_heads(context_grad, kv_heads)  # [batch, kv_heads, groups, q, d]
    value_grad = jnp.einsum("bhgqk,bhgqd->bkhd", probs.astype(grouped_grad.dtype), grouped_grad)
    probs_grad = jnp.einsum("bhgqd,bkhd->bhgqk", grouped_grad, value, preferred_element_type=jnp.float32)
    row_dot = jnp.sum(grouped_grad.astype(jnp.float32) * grouped_context.astype(jnp.float32), axis=-1,
                      keepdims=True)
    scores_grad = probs * (probs_grad - row_dot)  # d(loss)/d(scaled scores + bias), float32
    allowed = _allowed(mask, is_causal, probs.shape)
    if allowed is not None:  # masked scores are constants: no gradient (matters in fully masked rows only)
        scores_grad = jnp.where(allowed, scores_grad, 0.0)
    scale = 1.0 / math.sqrt(head_dim)
    compute = query.dtype
    scaled_scores_grad = (scores_grad * scale).astype(compute)
    query_grad = _ungroup_heads(jnp.einsum("bhgqk,bkhd->bhgqd", scaled_scores_grad, key))
    key_grad = jnp.einsum("bhgqk,bhgqd->bkhd", scaled_scores_grad, _group_heads(query, kv_heads))
    bias_grad = None
    if bias is not None:
        batch, _, groups, q_len, k_len = scores_grad.shape
        full = scores_grad.reshape(batch, kv_heads * groups, q_len, k_len)
        reduce_axes = tuple(axis for axis, size in enumerate(bias.shape) if size == 1 and full.shape[axis] != 1)
        bias_grad = jnp.sum(full, axis=reduce_axes, keepdims=True).reshape(bias.shape).astype(bias.dtype)
    return query_grad, key_grad, value_grad.astype(value.dtype), None, bias_grad


softmax_attention.defvjp(_softmax_attention_forward, _softmax_attention_backward)


def attend(query: jax.Array, key: jax.Array, value: jax.Array, *, mask: jax.Array | None, bias: jax.Array | None,
           is_causal: bool, impl: str = "auto") -> jax.Array:
    """Attention context ``[batch, q, heads, d]`` through the chosen implementation.

    ``impl="fused"``: ``jax.nn.dot_product_attention`` (cuDNN flash attention on GPU when shapes and dtypes allow,
    XLA otherwise); ``"softmax"``: ``softmax_attention`` above; ``"auto"``: fused on GPU, softmax elsewhere (the
    faster of the two measured on CPU).
    """
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention impl {impl!r}: expected one of {ATTENTION_IMPLS}")
    if impl == "auto":
        impl = "fused" if jax.default_backend() == "gpu" else "softmax"
    if impl == "fused":
        return jax.nn.dot_product_attention(query, key, value, bias=bias, mask=mask, is_causal=is_causal)
    return softmax_attention(query, key, value, mask, bias, is_causal)
