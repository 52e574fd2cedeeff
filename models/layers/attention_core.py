"""Which softmax core an attention call runs, and running it: ``attend`` (``choose_backend`` picks).

On CPU the closed-form-backward kernel (``models/layers/softmax_kernel.py``: ``softmax_attention``, the decode step's
``cached_attention``, the explicit-weights ``attention_with_weights``); on GPU cuDNN's fused flash attention through
``jax.nn.dot_product_attention`` or XLA's, or Pallas' Triton flash attention for packed / padded batches; on TPU
Pallas splash attention (``models/layers/attention_kernels.py``), per device under a mesh. ``attention_backend``
says what a config's calls get, with the reason when a fused kernel does not apply.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp

from flaxzoo.models.config import ATTENTION_IMPLS
from flaxzoo.models.layers import attention_kernels
from flaxzoo.models.layers.masking import symmetric_band
from flaxzoo.models.layers.partitioning import (ACTIVATION_BATCH, ACTIVATION_HEADS, ACTIVATION_KV_HEADS,
                                                current_placement, current_platform)
from flaxzoo.models.layers.softmax_kernel import (as_4d, attention_with_weights, cached_attention, causal_blocks,
                                                  softmax_attention, window_mask)

# The kernel's entry points are named here too, beside the dispatch most callers import.
__all__ = ["KERNELS", "attend", "attention_backend", "attention_with_weights", "cached_attention", "causal_blocks",
           "choose_backend", "softmax_attention", "window_mask"]


def _cudnn_head_dim_limit() -> int:
    """cuDNN flash attention takes head dims up to 256 on Hopper and later (compute capability 9.0), 128 before. The
    device is the mesh's in force (a compile-only H100 on a CPU host), else the first device."""
    placement = current_placement()
    device = placement.mesh.devices.flat[0] if placement is not None else jax.devices()[0]
    capability = getattr(device, "compute_capability", "0")
    try:
        return 256 if float(capability) >= 9.0 else 128
    except ValueError:
        return 128


KERNELS = ("splash", "gpu_flash")  # the Pallas kernels (models/layers/attention_kernels.py): masks as segment ids


def choose_backend(impl: str, *, dtype, head_dim: int, heads: int, kv_heads: int, q_len: int, k_len: int,
                   masked: bool, biased: bool, is_causal: bool, dropout: bool, platform: str | None = None,
                   shared_segments: bool = True, windowed: bool = False, capped: bool = False) -> tuple[str, str]:
    """Which attention core a call runs: ``("splash" | "gpu_flash" | "cudnn" | "xla" | "softmax", reason)``.

    ``platform``: the platform the step is compiled for (default: the one in force, ``partitioning
    .current_platform()``: a compile-only TPU mesh is ``"tpu"`` on a CPU host). ``impl`` is the config's
    ``attention_impl``:

    - ``"auto"``: on TPU splash attention; on GPU cuDNN flash attention for plain causal or unmasked calls
      (``jax.nn.dot_product_attention(implementation="cudnn")``) and Pallas' GPU flash attention for packed
      documents and padding (a mask of segment ids); the closed-form-backward kernel on CPU.
    - ``"splash"`` / ``"gpu_flash"``: that kernel on any platform (Pallas interpret mode on CPU).
    - ``"fused"``: cuDNN where it takes the call, else XLA (``jax.nn.dot_product_attention``).
    - ``"softmax"``: the closed-form-backward kernel.

    A kernel takes full-sequence calls only (``q_len == k_len``: training, evaluation, encoding; a cached decode
    step goes to XLA), no additive bias (ALiBi, DeBERTa's relative attention, T5's position bias), and no attention
    dropout: with dropout on, every platform runs the softmax kernel, which keeps the ``[batch, heads, q, k]``
    probabilities (the accelerator presets train without attention dropout). ``shared_segments``: the queries' and
    keys' segment ids are one array (packed documents, also an MLM batch's; an encoder given only ``attention_mask``
    has them apart), which the GPU kernel needs. Outside a placement (a call that is not a train / eval step) a
    kernel needs a single device: with several, its custom call would have to be partitioned by XLA, which Mosaic
    kernels refuse, so XLA runs instead.

    ``windowed`` (a sliding window): splash (a local mask), cuDNN and XLA (``local_window_size``, or the dense mask)
    take it; Pallas' GPU kernel does not, nor does cuDNN a bidirectional one (``is_causal`` False: it takes only a
    left window). ``capped`` (attention soft-capping): splash takes it, and elsewhere only
    the closed-form-backward kernel (neither cuDNN nor ``jax.nn.dot_product_attention`` caps scores).
    """
    platform = platform or current_platform()
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention impl {impl!r}: expected one of {ATTENTION_IMPLS}")
    if impl == "softmax" or (impl == "auto" and platform == "cpu"):
        return "softmax", f"attention_impl={impl!r} on {platform}: the closed-form-backward kernel"
    if dropout:
        return "softmax", "attention dropout is on, which no fused kernel takes: the closed-form-backward kernel"
    capped_fallback = ("softmax", "attention soft-capping, which only splash and the closed-form-backward kernel "
                       "take: the closed-form-backward kernel")
    query_shape, key_shape = (1, q_len, heads, head_dim), (1, k_len, kv_heads, head_dim)
    kernel = impl if impl in KERNELS else None
    refused = ""  # why the platform's kernel did not take the call, for the reason of what runs instead
    if impl == "auto":
        kernel = "splash" if platform == "tpu" else "gpu_flash" if platform == "gpu" and masked else None
    if kernel is not None:
        interpret = platform != {"splash": "tpu", "gpu_flash": "gpu"}[kernel]
        if biased:
            ok, reason = False, (f"{kernel} does not take an additive bias (ALiBi, DeBERTa's relative attention, "
                                 "T5's position bias)")
        elif kernel == "gpu_flash" and windowed:
            ok, reason = False, "gpu_flash does not take a sliding window"
        elif kernel == "gpu_flash" and capped:
            ok, reason = False, "gpu_flash does not take attention soft-capping"
        elif q_len != k_len:
            ok, reason = False, f"{kernel} runs full-sequence calls only (query length {q_len} != key length {k_len})"
        elif not interpret and current_placement() is None and jax.device_count() > 1:
            ok, reason = False, (f"{kernel} outside a mesh placement over {jax.device_count()} devices (only the "
                                 "train / eval steps place a call)")
        elif kernel == "splash":
            ok, reason = attention_kernels.splash_supported(query_shape, key_shape, dtype, causal=is_causal,
                                                            platform=platform, interpret=interpret)
        else:
            ok, reason = attention_kernels.gpu_flash_supported(query_shape, key_shape, dtype, causal=is_causal,
                                                               shared_segments=shared_segments or not masked,
                                                               platform=platform, interpret=interpret)
        if ok:
            return kernel, reason + (" in Pallas interpret mode" if interpret else "")
        if capped:
            return capped_fallback
        if impl != "auto" or platform == "tpu":
            return "xla", f"{reason}: XLA"
        refused = f"{reason}; "
    if capped:
        return capped_fallback
    if platform != "gpu":
        return "xla", f"cuDNN needs a GPU (backend {platform!r})"
    limit = _cudnn_head_dim_limit()
    why_not = None
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        why_not = f"dtype {jnp.dtype(dtype).name} (cuDNN takes bfloat16 / float16)"
    elif head_dim % 8 or head_dim > limit:
        why_not = f"head_dim={head_dim} (cuDNN takes multiples of 8 up to {limit})"
    elif biased:
        why_not = "an additive bias (ALiBi, DeBERTa's relative attention, T5's position bias)"
    elif masked:
        why_not = "a padding / document mask"
    elif is_causal and q_len != k_len:
        why_not = f"causal with query length {q_len} != key length {k_len}"
    elif windowed and not is_causal:
        why_not = "a bidirectional sliding window (it takes a left window only)"
    if why_not is not None:
        return "xla", f"{refused}cuDNN does not take {why_not}: XLA"
    return "cudnn", "cuDNN flash attention"


def attend(query: jax.Array, key: jax.Array, value: jax.Array, *, mask: jax.Array | None, bias: jax.Array | None,
           is_causal: bool, impl: str = "auto", dropout: jax.Array | None = None,
           segments: tuple[jax.Array, jax.Array] | None = None, causal_segments: bool = False,
           window: int | None = None, softcap: float | None = None) -> jax.Array:
    """Attention context ``[batch, q, heads, d]`` through the backend ``choose_backend`` picks.

    ``query: [batch, q, heads, d]``, ``key`` / ``value: [batch, k, kv_heads, d]``; ``mask`` (True = may attend) and
    ``bias`` broadcastable to ``[batch, heads, q, k]``; ``is_causal``: query ``i`` sees keys ``<= i + (k - q)``
    (bottom-right, on every backend); ``dropout``: None or the probabilities' multiplier (``[batch, heads, q, k]``).
    ``segments``: the ``(query [batch, q], key [batch, k])`` segment ids ``mask`` was built from (a query sees keys
    of its own segment, and with ``causal_segments`` only earlier ones), which the Pallas kernels take instead of
    the dense mask. ``window``: a causal call's sliding window (a query sees itself and the ``window - 1`` keys
    before it), a bidirectional call's (itself and the ``window - 1`` keys on each side); a given ``mask`` must
    already hold it (``AttentionLayout.mask``), and the kernels that take
    ``segments`` apply it themselves. ``softcap``: scores become ``softcap · tanh(score / softcap)`` before masking.
    """
    q_len, k_len = query.shape[1], key.shape[1]
    backend, _ = choose_backend(impl, dtype=query.dtype, head_dim=query.shape[-1], q_len=q_len, k_len=k_len,
                                masked=mask is not None, biased=bias is not None, is_causal=is_causal or
                                causal_segments, dropout=dropout is not None, heads=query.shape[2],
                                kv_heads=key.shape[2], shared_segments=segments is None or
                                segments[0] is segments[1], windowed=window is not None, capped=softcap is not None)
    if backend in KERNELS and mask is not None and segments is None:
        if impl in KERNELS:
            raise ValueError(f"attention_impl={impl!r} takes masks as segment ids (models/layers/masking.py); "
                             "this call has a dense mask only")
        backend = "xla"  # a mask not made of segment ids: the kernels cannot take it
    if backend in KERNELS:
        return _kernel_attention(backend, query, key, value, segments, is_causal or causal_segments, window,
                                 softcap)
    if backend == "softmax":
        return softmax_attention(query, key, value, mask, bias, is_causal, dropout,
                                 window=window if is_causal or mask is None else None, softcap=softcap)
    local = None
    if is_causal and (q_len != k_len or (window is not None and backend != "cudnn")):
        # jax.nn aligns its causal mask top-left: give it the bottom-right one (and the window) as a mask
        causal = window_mask(q_len, k_len, window)
        mask = causal if mask is None else jnp.logical_and(mask, causal)
        is_causal = False
    elif is_causal and window is not None:
        local = (window - 1, 0)
    elif window is not None and mask is None and not causal_segments:
        # bidirectional (cuDNN was refused above): XLA's (left, right) window; jax.nn aligns it top-left
        if q_len == k_len:
            return jax.nn.dot_product_attention(query, key, value, bias=as_4d(bias), local_window_size=(
                window - 1, window - 1), implementation="xla")
        mask = symmetric_band(q_len, k_len, k_len - q_len, window)
    mask, bias = as_4d(mask), as_4d(bias)
    if backend == "cudnn":
        try:
            return jax.nn.dot_product_attention(query, key, value, is_causal=is_causal, local_window_size=local,
                                                implementation="cudnn")
        except (NotImplementedError, ValueError) as exc:  # a cuDNN version / device limit found while tracing
            logging.getLogger(__name__).warning("cuDNN attention unavailable (%s); using XLA", exc)
    if local is not None:
        mask, is_causal = window_mask(q_len, k_len, window), False
    return jax.nn.dot_product_attention(query, key, value, bias=bias, mask=mask, is_causal=is_causal,
                                        implementation="xla")


def _kernel_attention(kernel: str, query: jax.Array, key: jax.Array, value: jax.Array,
                      segments: tuple[jax.Array, jax.Array] | None, causal: bool, window: int | None = None,
                      softcap: float | None = None) -> jax.Array:
    """A Pallas kernel over the call, per device of the mesh in force: a custom call cannot be split by XLA's
    partitioner (it would gather the whole batch onto every device), so under a placement the kernel runs in a
    ``shard_map`` over the batch (``data`` x ``fsdp``) and, where both query and key/value heads divide it, the
    ``tensor`` axis."""
    placement = current_placement()
    shared = segments is not None and segments[0] is segments[1]
    interpret = current_platform() != ("tpu" if kernel == "splash" else "gpu")

    def run(q, k, v, q_seg, kv_seg):
        if kernel == "splash":
            if shared:
                kv_seg = q_seg
            return attention_kernels.splash_attention(q, k, v, q_segments=q_seg, kv_segments=kv_seg, causal=causal,
                                                      interpret=interpret, window=window, softcap=softcap)
        return attention_kernels.gpu_flash_attention(q, k, v, segment_ids=q_seg, causal=causal, interpret=interpret)

    q_seg, kv_seg = segments if segments is not None else (None, None)
    if placement is None:
        return run(query, key, value, q_seg, kv_seg)
    q_spec = placement.spec((ACTIVATION_BATCH, None, ACTIVATION_HEADS, None), query.shape)
    kv_spec = placement.spec((ACTIVATION_BATCH, None, ACTIVATION_KV_HEADS, None), key.shape)
    if q_spec[2] != kv_spec[2]:  # heads split but key/value heads not (or the other way): keep both whole
        q_spec = jax.sharding.PartitionSpec(q_spec[0], None, None, None)
        kv_spec = jax.sharding.PartitionSpec(kv_spec[0], None, None, None)
    rows = jax.sharding.PartitionSpec(q_spec[0], None)
    if q_seg is None:
        def local(q, k, v):
            return run(q, k, v, None, None)
        return jax.shard_map(local, mesh=placement.mesh, in_specs=(q_spec, kv_spec, kv_spec), out_specs=q_spec,
                             check_vma=False)(query, key, value)
    return jax.shard_map(run, mesh=placement.mesh, in_specs=(q_spec, kv_spec, kv_spec, rows, rows),
                         out_specs=q_spec, check_vma=False)(query, key, value, q_seg, kv_seg)


def attention_backend(config, *, q_len: int, k_len: int | None = None, masked: bool = False,
                      training: bool = False, platform: str | None = None,
                      shared_segments: bool | None = None) -> tuple[str, str]:
    """The attention core ``config``'s layers run for a call of ``q_len`` queries over ``k_len`` keys (default
    ``q_len``): ``("splash" | "gpu_flash" | "cudnn" | "xla" | "softmax", reason)``. ``masked``: padding or packed
    documents (a mask beyond plain causality); ``training``: attention dropout applies (``config.attention_dropout``
    > 0); ``platform``: the target's (default: the one in force); ``shared_segments``: one segment array for
    queries and keys (the default: every pre-training batch packs documents with ``segment_ids``, causal or masked
    LM; an encoder given only ``attention_mask``, as fine-tuning's, has them apart). A config whose layers are of
    both kinds (sliding window and full) reports its sliding-window layers' core, and both in the reason when the
    kinds differ."""
    def choose(windowed: bool) -> tuple[str, str]:
        return choose_backend(config.attention_impl, dtype=config.dtype, head_dim=config.head_dim, q_len=q_len,
                              k_len=q_len if k_len is None else k_len, masked=masked,
                              biased=(config.position == "alibi" or config.relative_attention
                                      or config.position_bias_buckets is not None),
                              is_causal=config.causal, dropout=training and config.attention_dropout > 0,
                              platform=platform, heads=config.num_heads, kv_heads=config.num_kv_heads,
                              shared_segments=True if shared_segments is None else shared_segments,
                              windowed=windowed, capped=config.attention_softcap is not None)

    kinds = set(config.sliding_layers) if config.sliding_window is not None else {False}
    chosen = {kind: choose(kind) for kind in kinds}
    if len(chosen) == 1 or chosen[True] == chosen[False]:
        return next(iter(chosen.values()))
    (local, local_why), (full, full_why) = chosen[True], chosen[False]
    return local, f"sliding-window layers: {local} ({local_why}); full layers: {full} ({full_why})"
