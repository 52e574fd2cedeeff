"""Pallas flash-attention kernels for accelerators: TPU splash attention and the Triton GPU flash attention of
``jax.experimental.pallas.ops``, wrapped to flaxzoo's layouts and masking rules, with predicates saying whether a
call fits each kernel (for the dispatcher in ``attention_core``).

Layouts as in ``attention_core``: ``query: [batch, q, heads, head_dim]``, ``key`` / ``value: [batch, k, kv_heads,
head_dim]`` (query head ``h`` reads key/value head ``h // (heads // kv_heads)``). Masking by segment ids
(``models/layers/masking.py``): a query sees the keys of its own segment (0 = padding), and when causal only keys
``j <= i + (k - q)`` (bottom-right alignment). The softmax scale is ``1 / sqrt(head_dim)``. A query that sees no key
at all gets the mean of all values, as in ``jax.nn.dot_product_attention(..., implementation="xla")``, with the
same gradients (values get ``d_out / k``, queries and keys nothing).

Both kernels want sequence lengths that are multiples of their block sizes; shorter or odd lengths are padded at the
end with segment id ``PAD_SEGMENT``, which no real token has (real ids are >= 0): pads see only pads, real tokens
never see pads, and the pads' outputs are sliced off. Every call runs with ``interpret=True`` on CPU (Pallas
interpret mode, forward and backward), which is how the tests check them.

Constraints, as read in jax 0.10.2's sources:

* splash (``jax/experimental/pallas/ops/tpu/splash_attention/splash_attention_kernel.py``): a TPU (Mosaic) kernel
  over one example ``[heads, seq, d]`` (vmapped over the batch here). ``heads % kv_heads == 0``, handled natively by
  ``make_splash_mha`` (the key/value block of query head ``h`` is ``h // (heads // kv_heads)``: no copies); query
  and key head dims equal; the kv compute block a multiple of 128 (``bkv_compute % NUM_LANES``) and, with segment
  ids, the q and kv blocks multiples of 128 (``_apply_mask_and_soft_cap``) -- in interpret mode too -- so sequences
  are padded to multiples of 128. Separate query and key segment ids (``SegmentIds(q, kv)``) and ``q != k`` are
  fine; causal uses ``CausalMask(offset=k - q)``, and ``q > k`` (negative offset) leaves rows with no key in any
  block: ``1 / 0`` in the kernel (``splash_attention_mask.py``, ``make_causal_mask``: "undefined softmax"), so it
  is refused. The kernel does not scale the scores: the query is scaled here. No head-dim restriction in the source
  (blocks take the whole head dim); float32 / bfloat16 (TPU matmul types) are accepted.
* GPU flash (``jax/experimental/pallas/ops/gpu/attention.py``, ``mha``): a Triton kernel over ``[batch, seq, heads,
  d]``; equal heads for q, k, v (one head index for all three BlockSpecs: GQA repeats the key/value heads here);
  equal q, k, v head dims (ValueError); ONE ``segment_ids [batch, seq]`` for queries and keys, a top-left causal
  mask (``span_q >= span_k``) and a fused backward that needs as many q as kv blocks: so ``q == k`` and the same
  segments for queries and keys. Sequences must be multiples of the blocks (ValueError); Triton blocks are powers of
  two (``jnp.arange`` in the kernel) of at least 16 (``tl.dot``), so the sequence is padded to a multiple of a
  power-of-two block (128, or the next power of two >= 16 of a shorter sequence). The head dim is padded to the next
  power of two inside the kernel (masked loads), so it need not be one; ``tl.dot`` wants >= 16, and jax's own tests
  (``tests/pallas/gpu_ops_test.py``) cover 32, 64 and 128 on compute capability >= 8.0, so the predicate takes
  16 .. 128. float32 runs its dots at ``jax_default_matmul_precision`` (TF32 by default on GPU).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu import attention as gpu_attention
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

from flaxzoo.models.layers.masking import symmetric_band, window_band

PAD_SEGMENT = -1  # the segment id of the positions padding adds: no real token (ids >= 0) shares it
SPLASH_LANES = 128  # splash's blocks are multiples of this (NUM_LANES in splash_attention_kernel.py)
SPLASH_MAX_BLOCK = 512
GPU_MAX_BLOCK = 128  # mha's default forward block
GPU_BACKWARD_BLOCK = 32  # mha's default backward blocks
GPU_HEAD_DIMS = (16, 128)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _pad_seq(x: jax.Array, length: int, value=0) -> jax.Array:
    """``x`` padded along axis 1 (the sequence) to ``length`` with ``value``."""
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, length - x.shape[1])
    return jnp.pad(x, widths, constant_values=value)


def _check_common(query_shape, key_shape, dtype, allowed_dtypes) -> str | None:
    heads, head_dim = query_shape[2], query_shape[3]
    kv_heads, kv_head_dim = key_shape[2], key_shape[3]
    if heads % kv_heads:
        return f"{heads} query heads are not a multiple of {kv_heads} key/value heads"
    if head_dim != kv_head_dim:
        return f"query head_dim {head_dim} != key head_dim {kv_head_dim}"
    if jnp.dtype(dtype) not in tuple(jnp.dtype(d) for d in allowed_dtypes):
        return f"dtype {jnp.dtype(dtype).name} (takes {', '.join(jnp.dtype(d).name for d in allowed_dtypes)})"
    return None


def splash_supported(query_shape: tuple[int, ...], key_shape: tuple[int, ...], dtype, *, causal: bool,
                     platform: str | None = None, interpret: bool = False) -> tuple[bool, str]:
    """Whether :func:`splash_attention` takes a call: ``(ok, reason)``.

    ``query_shape``: ``(batch, q, heads, head_dim)``, ``key_shape``: ``(batch, k, kv_heads, head_dim)``;
    ``platform`` defaults to ``jax.default_backend()`` and must be ``"tpu"`` unless ``interpret``. Query and key
    segments may be different arrays (see the module docstring for the constraints and where they come from)."""
    platform = platform or jax.default_backend()
    if platform != "tpu" and not interpret:
        return False, f"splash attention is a TPU kernel (backend {platform!r})"
    problem = _check_common(query_shape, key_shape, dtype, (jnp.float32, jnp.bfloat16))
    if problem is None and causal and query_shape[1] > key_shape[1]:
        problem = (f"causal with query length {query_shape[1]} > key length {key_shape[1]} (the first rows would "
                   "see no key)")
    if problem is not None:
        return False, f"splash attention does not take {problem}"
    return True, "splash attention (TPU Pallas)"


def gpu_flash_supported(query_shape: tuple[int, ...], key_shape: tuple[int, ...], dtype, *, causal: bool,
                        shared_segments: bool, platform: str | None = None,
                        interpret: bool = False) -> tuple[bool, str]:
    """Whether :func:`gpu_flash_attention` takes a call: ``(ok, reason)``.

    Shapes as in :func:`splash_supported`; ``shared_segments``: the queries' and the keys' segment ids are the same
    array (or there are none). ``causal`` does not change the answer (it needs ``q == k``, which every call
    needs)."""
    del causal
    platform = platform or jax.default_backend()
    if platform != "gpu" and not interpret:
        return False, f"Pallas GPU flash attention is a Triton kernel (backend {platform!r})"
    problem = _check_common(query_shape, key_shape, dtype, (jnp.float32, jnp.bfloat16, jnp.float16))
    head_dim = query_shape[3]
    if problem is None and query_shape[1] != key_shape[1]:
        problem = f"query length {query_shape[1]} != key length {key_shape[1]}"
    elif problem is None and not shared_segments:
        problem = "different query and key segment ids (it takes one segment_ids array for both)"
    elif problem is None and not GPU_HEAD_DIMS[0] <= head_dim <= GPU_HEAD_DIMS[1]:
        problem = f"head_dim={head_dim} (takes {GPU_HEAD_DIMS[0]} .. {GPU_HEAD_DIMS[1]})"
    if problem is not None:
        return False, f"Pallas GPU flash attention does not take {problem}"
    return True, "Pallas GPU flash attention (Triton)"


def _uniform_where_blind(context: jax.Array, value: jax.Array, q_segments: jax.Array, kv_segments: jax.Array,
                         causal: bool, window: int | None = None) -> jax.Array:
    """``context`` with the rows whose query sees no key replaced by the mean of all values (the XLA reference's
    uniform attention). ``context: [batch, q, heads, d]``, ``value: [batch, k, kv_heads, d]``. The ``[batch, q, k]``
    comparison is a fused reduction (never stored). ``window``: the call's sliding window (causal, or
    bidirectional without ``causal``)."""
    q_len, k_len = q_segments.shape[1], kv_segments.shape[1]
    sees = q_segments[:, :, None] == kv_segments[:, None, :]
    if causal:
        sees &= jnp.arange(k_len)[None, :] <= jnp.arange(q_len)[:, None] + (k_len - q_len)
    if window is not None:
        band = (window_band if causal else symmetric_band)(q_len, k_len, k_len - q_len, window)
        sees &= band[None]
    sees_any = jnp.any(sees, axis=-1)[:, :, None, None]  # [batch, q, 1, 1]
    groups = context.shape[2] // value.shape[2]
    uniform = jnp.repeat(jnp.mean(value, axis=1, keepdims=True), groups, axis=2)  # [batch, 1, heads, d]
    return jnp.where(sees_any, context, uniform.astype(context.dtype))


def _largest_block(length: int, largest: int, smallest: int) -> int:
    """The largest power-of-two multiple of ``smallest``, at most ``largest``, that divides ``length``."""
    block = largest
    while length % block:
        block //= 2
    return max(block, smallest)


@functools.lru_cache(maxsize=64)
def _splash_kernel(heads: int, q_len: int, k_len: int, causal_offset: int | None, interpret: bool,
                   window: int | None = None, softcap: float | None = None):
    """A splash MHA kernel for one example (``[heads, q_len, d]`` queries, padded lengths); ``causal_offset``:
    query ``i`` sees keys ``<= i + offset``, None for bidirectional; ``window``: and only keys ``> i + offset -
    window`` (a causal sliding window), or bidirectional ``|j - i| < window``; ``softcap``: splash's logit soft
    cap."""
    if causal_offset is None and window is not None:
        head_mask = splash_mask.LocalMask((q_len, k_len), window_size=(window - 1, window - 1), offset=0)
    elif causal_offset is None:
        head_mask = splash_mask.FullMask((q_len, k_len))
    elif window is not None:
        head_mask = splash_mask.LocalMask((q_len, k_len), window_size=(window - 1, 0), offset=causal_offset)
    else:
        head_mask = splash_mask.CausalMask((q_len, k_len), offset=causal_offset)
    block_q = _largest_block(q_len, SPLASH_MAX_BLOCK, SPLASH_LANES)
    block_kv = _largest_block(k_len, SPLASH_MAX_BLOCK, SPLASH_LANES)
    blocks = splash.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
                               block_q_dkv=block_q, block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv,
                               block_q_dq=block_q, block_kv_dq=block_kv)
    with jax.ensure_compile_time_eval():  # concrete mask-info arrays (cached), also when first built under a jit
        return splash.make_splash_mha(splash_mask.MultiHeadMask([head_mask] * heads), block_sizes=blocks,
                                      head_shards=1, q_seq_shards=1, interpret=interpret,
                                      attn_logits_soft_cap=softcap)


def splash_attention(query: jax.Array, key: jax.Array, value: jax.Array, *, q_segments: jax.Array | None = None,
                     kv_segments: jax.Array | None = None, causal: bool, interpret: bool = False,
                     window: int | None = None, softcap: float | None = None) -> jax.Array:
    """``softmax(q·kᵀ/√d, masked) · v`` through TPU splash attention: ``[batch, q, heads, head_dim]``.

    ``query: [batch, q, heads, head_dim]``, ``key`` / ``value: [batch, k, kv_heads, head_dim]``; ``q_segments:
    [batch, q]`` / ``kv_segments: [batch, k]`` int segment ids (both or neither): a query sees keys of its own
    segment; ``causal``: and keys ``j <= i + (k - q)``. Queries that see no key get the mean of all values (as
    the XLA reference). ``window``: a sliding window (a query sees itself and the ``window - 1`` keys before
    it, and without ``causal`` as many after it); ``softcap``: scores become ``softcap · tanh(score / softcap)``.
    ``interpret``: Pallas interpret mode (runs
    on CPU). Raises ValueError for a call :func:`splash_supported` refuses."""
    batch, q_len, heads, head_dim = query.shape
    k_len = key.shape[1]
    # The platform is the caller's to choose (a compile-only TPU mesh traces on a CPU host): only the shapes are checked.
    ok, reason = splash_supported(query.shape, key.shape, query.dtype, causal=causal, platform="tpu",
                                  interpret=interpret)
    if not ok:
        raise ValueError(reason)
    if (q_segments is None) != (kv_segments is None):
        raise ValueError("pass both q_segments and kv_segments, or neither")
    # With one array for both (self-attention) every query sees at least itself; otherwise some may see nothing.
    may_be_blind = q_segments is not None and q_segments is not kv_segments
    q_pad, k_pad = _round_up(q_len, SPLASH_LANES), _round_up(k_len, SPLASH_LANES)
    segment_ids = None
    if q_segments is None and (q_pad, k_pad) != (q_len, k_len):
        q_segments, kv_segments = jnp.ones((batch, q_len), jnp.int32), jnp.ones((batch, k_len), jnp.int32)
    if q_segments is not None:
        segment_ids = splash.SegmentIds(q=_pad_seq(q_segments.astype(jnp.int32), q_pad, PAD_SEGMENT),
                                        kv=_pad_seq(kv_segments.astype(jnp.int32), k_pad, PAD_SEGMENT))
    kernel = _splash_kernel(heads, q_pad, k_pad, k_len - q_len if causal else None, interpret, window, softcap)
    scaled = query * jnp.asarray(1.0 / math.sqrt(head_dim), query.dtype)  # splash does not scale the scores
    q, k, v = (_pad_seq(x, length).transpose(0, 2, 1, 3)  # [batch, heads, seq, d]
               for x, length in ((scaled, q_pad), (key, k_pad), (value, k_pad)))
    context = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=s))(q, k, v, segment_ids)
    context = context.transpose(0, 2, 1, 3)[:, :q_len]
    if may_be_blind:
        context = _uniform_where_blind(context, value, q_segments, kv_segments, causal, window)
    return context


def gpu_flash_attention(query: jax.Array, key: jax.Array, value: jax.Array, *, segment_ids: jax.Array | None = None,
                        causal: bool, interpret: bool = False) -> jax.Array:
    """``softmax(q·kᵀ/√d, masked) · v`` through Pallas' Triton flash attention (``pallas.ops.gpu.attention.mha``):
    ``[batch, seq, heads, head_dim]``.

    Self-attention only: ``query: [batch, seq, heads, head_dim]``, ``key`` / ``value: [batch, seq, kv_heads,
    head_dim]`` (GQA: the key/value heads are repeated to every query head, which the kernel needs);
    ``segment_ids: [batch, seq]`` for queries and keys alike, or None; ``causal``: query ``i`` sees keys ``<= i``.
    Every query sees at least itself, so no row is fully masked. ``interpret``: Pallas interpret mode (runs on
    CPU). Raises ValueError for a call :func:`gpu_flash_supported` refuses."""
    batch, seq, heads, head_dim = query.shape
    ok, reason = gpu_flash_supported(query.shape, key.shape, query.dtype, causal=causal, shared_segments=True,
                                     platform="gpu", interpret=interpret)
    if not ok:
        raise ValueError(reason)
    block = min(GPU_MAX_BLOCK, max(16, _next_power_of_2(seq)))
    padded = _round_up(seq, block)
    if segment_ids is None and padded != seq:
        segment_ids = jnp.ones((batch, seq), jnp.int32)
    if segment_ids is not None:
        segment_ids = _pad_seq(segment_ids.astype(jnp.int32), padded, PAD_SEGMENT)
    groups = heads // key.shape[2]
    key, value = (jnp.repeat(x, groups, axis=2) if groups > 1 else x for x in (key, value))
    backward = min(GPU_BACKWARD_BLOCK, block)
    blocks = gpu_attention.BlockSizes(block_q=block, block_k=block, block_q_dkv=backward, block_kv_dkv=backward,
                                      block_q_dq=backward, block_kv_dq=backward)
    context = gpu_attention.mha(_pad_seq(query, padded), _pad_seq(key, padded), _pad_seq(value, padded),
                                segment_ids=segment_ids, sm_scale=1.0 / math.sqrt(head_dim), causal=causal,
                                block_sizes=blocks, interpret=interpret)
    return context[:, :seq]

