"""The losses of the train and eval steps (``flaxzoo.train.step``): one per objective in ``LOSSES``.

Each is computed in float32 from the logits and returns ``Sums``, a sum of the per-token (or per-row) losses, the
count of what was scored and the count predicted right, so that a step can divide once over all its micro-batches.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax
from einops import rearrange
from flax import nnx

from flaxzoo.models.layers.partitioning import HEAD_VOCAB, split_ways
from flaxzoo.train.batches import IGNORE_INDEX

Batch = dict[str, jax.Array]
Sums = tuple[jax.Array, jax.Array, jax.Array]  # (sum of −log p(label), scored tokens, scored tokens predicted right)


def blocked_argmax(logits: jax.Array, blocks: int | None = None) -> jax.Array:
    """``jnp.argmax(logits, axis=-1)`` (the first maximum), found per block of the vocabulary.

    ``logits: [..., vocab]`` -> ``[...]`` int32. The vocabulary is cut into ``blocks`` equal blocks (None: as many as
    the devices it is split over, where that divides it, else one); each block's first maximum is found within the
    block, then the first block holding the overall maximum. Why: with the vocabulary sharded over devices (the
    vocab-parallel head), a plain argmax over the sharded axis makes XLA's partitioner materialise a
    ``[..., vocab / shards]`` int32 index array per device (GPT-2 on v5e-8 at fsdp=8: two of 0.19 GiB); one block
    per shard keeps each index local, where it fuses into the reduction.
    """
    vocab = logits.shape[-1]
    if blocks is None:
        shards = split_ways((HEAD_VOCAB,), (vocab,))
        blocks = shards if vocab % shards == 0 else 1
    if blocks < 1 or vocab % blocks:
        raise ValueError(f"blocks={blocks}: expected a positive divisor of the vocabulary size {vocab}")
    if blocks == 1:
        return jnp.argmax(logits, axis=-1)
    split = logits.reshape(*logits.shape[:-1], blocks, vocab // blocks)
    within = jnp.argmax(split, axis=-1)  # [..., blocks]
    best = jnp.argmax(jnp.max(split, axis=-1), axis=-1)  # the first block holding the maximum
    chosen = jnp.arange(blocks) == best[..., None]  # a select, not a gather: simpler for XLA's partitioner
    return best * (vocab // blocks) + jnp.sum(jnp.where(chosen, within, 0), axis=-1)


@jax.custom_vjp
def low_precision_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """``−log softmax(logits)[label]`` in float32 for compute-dtype (bfloat16 / float16) ``logits``.

    ``logits: [..., vocab]``, ``labels: [...]`` int in ``[0, vocab)`` -> ``[...]`` float32. The same sums as
    optax's cross-entropy of ``logits.astype(float32)`` (the log-normaliser and the label's logit in float32), and
    the same gradient, ``softmax − one_hot``, computed in float32 and rounded to the logits' dtype, as autodiff
    through that upcast gives. Written out so that no float32 copy of the logits is kept: the upcast fuses into the
    reductions and the gradient's elementwise expression, where autodiff kept a float32 ``[rows, chunk, vocab]``
    per loss chunk beside the compute-dtype logits (GPT-2 on a v5e-8: 0.19 GiB per device).
    """
    return _cross_entropy_forward(logits, labels)[0]


def _cross_entropy_forward(logits: jax.Array, labels: jax.Array):
    # The maximum and the label's logit are exact in the logits' dtype; only the sum of exponentials is float32.
    top = jnp.max(logits, axis=-1).astype(jnp.float32)
    total = jnp.sum(jnp.exp(logits.astype(jnp.float32) - top[..., None]), axis=-1)
    normaliser = top + jnp.log(total)
    label_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0].astype(jnp.float32)
    return normaliser - label_logit, (logits, labels, normaliser)


def _cross_entropy_backward(saved, cotangent):
    logits, labels, normaliser = saved
    probabilities = jnp.exp(logits.astype(jnp.float32) - normaliser[..., None])
    one_hot = labels[..., None] == jnp.arange(logits.shape[-1], dtype=labels.dtype)
    gradient = (probabilities - one_hot.astype(jnp.float32)) * cotangent[..., None]
    return gradient.astype(logits.dtype), None


low_precision_cross_entropy.defvjp(_cross_entropy_forward, _cross_entropy_backward)


def token_cross_entropy(logits: jax.Array, labels: jax.Array, valid: jax.Array,
                        with_accuracy: bool | jax.Array = True) -> Sums:
    """``(sum of −log p(label), number of valid tokens, number of valid tokens predicted right)``, all float32.

    ``logits: [batch, seq, vocab]``, ``labels: [batch, seq]`` int, ``valid: [batch, seq]`` bool. ``with_accuracy``
    (a Python or traced bool): when false the argmax over the vocabulary is skipped and the third sum is 0.
    """
    safe_labels = jnp.where(valid, labels, 0)
    if jnp.dtype(logits.dtype).itemsize < 4:  # bfloat16 / float16 logits: no float32 copy of them is kept
        losses = low_precision_cross_entropy(logits, safe_labels)
    else:
        logits = logits.astype(jnp.float32)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, safe_labels)
    validf = valid.astype(jnp.float32)

    def correct() -> jax.Array:
        hits = blocked_argmax(jax.lax.stop_gradient(logits)) == safe_labels
        return jnp.sum(hits.astype(jnp.float32) * validf)

    if isinstance(with_accuracy, bool):
        hits = correct() if with_accuracy else jnp.float32(0)
    else:
        hits = jax.lax.cond(with_accuracy, correct, lambda: jnp.float32(0))
    return jnp.sum(losses * validf), jnp.sum(validf), hits


def chunked_cross_entropy(hidden: jax.Array, project: Callable[[jax.Array], jax.Array], labels: jax.Array,
                          valid: jax.Array, *, chunk: int, with_accuracy: bool | jax.Array = True) -> Sums:
    """:func:`token_cross_entropy` of ``project(hidden)`` computed ``chunk`` positions at a time.

    ``hidden: [batch, seq, hidden]``; ``project`` maps ``[batch, n, hidden]`` to ``[batch, n, vocab]`` logits. The
    chunks run in a ``lax.scan`` whose body is rematerialised, so neither pass holds more than one chunk's
    ``[batch, chunk, vocab]`` float32 logits (GPT-2 small at 8 × 1024: 1.6 GB whole, 0.4 GB in chunks of 256).
    ``chunk`` 0 or ≥ seq: one piece, no scan. The sequence is cut along ``seq`` (never ``batch``), so a
    batch-sharded layout stays as it is; a last partial chunk is padded with unscored positions.
    """
    seq = hidden.shape[1]
    if chunk <= 0 or chunk >= seq:
        return token_cross_entropy(project(hidden), labels, valid, with_accuracy)
    pad = -seq % chunk
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        labels = jnp.pad(labels, ((0, 0), (0, pad)))
        valid = jnp.pad(valid, ((0, 0), (0, pad)))
    pieces = (rearrange(hidden, "b (n c) d -> n b c d", c=chunk), rearrange(labels, "b (n c) -> n b c", c=chunk),
              rearrange(valid, "b (n c) -> n b c", c=chunk))

    @jax.checkpoint
    def one_chunk(h, y, v):
        return token_cross_entropy(project(h), y, v, with_accuracy)

    def body(carry, piece):
        return jax.tree.map(jnp.add, carry, one_chunk(*piece)), None

    zero = jnp.float32(0)
    sums, _ = jax.lax.scan(body, (zero, zero, zero), pieces)
    return sums


def causal_lm_loss(model: nnx.Module, batch: Batch, *, loss_chunk: int = 0,
                   with_accuracy: bool | jax.Array = True) -> Sums:
    """Next-token loss of a ``GPTForCausalLM`` on ``{"input_ids", "targets", ["segment_ids"]}`` (``[batch, seq]``,
    targets already shifted, ``IGNORE_INDEX`` where nothing is scored: padding rows, document ends of a packed row).
    With ``segment_ids`` the packed documents never attend to each other and their positions restart."""
    hidden = model.hidden_states(batch["input_ids"], segment_ids=batch.get("segment_ids"))
    targets = batch["targets"]
    return chunked_cross_entropy(hidden, model.logits, targets, targets != IGNORE_INDEX, chunk=loss_chunk,
                                 with_accuracy=with_accuracy)


def seq2seq_lm_loss(model: nnx.Module, batch: Batch, *, loss_chunk: int = 0,
                    with_accuracy: bool | jax.Array = True) -> Sums:
    """Teacher-forced target loss of a ``Seq2SeqForConditionalGeneration`` on ``{"input_ids", "attention_mask"?}``
    (the sources, ``[batch, src]``), ``{"decoder_input_ids", "decoder_attention_mask"?}`` (the targets shifted
    right behind the decoder's start id, ``[batch, target]``) and ``"labels"`` (the targets, ``IGNORE_INDEX`` where
    nothing is scored: padding). Packed rows carry ``segment_ids`` and ``decoder_segment_ids`` (each target reads
    only its own source)."""
    hidden = model.hidden_states(batch["input_ids"], batch.get("attention_mask"), batch["decoder_input_ids"],
                                 batch.get("decoder_attention_mask"), segment_ids=batch.get("segment_ids"),
                                 decoder_segment_ids=batch.get("decoder_segment_ids"))
    labels = batch["labels"]
    return chunked_cross_entropy(hidden, model.logits, labels, labels != IGNORE_INDEX, chunk=loss_chunk,
                                 with_accuracy=with_accuracy)


def token_types(model: nnx.Module, batch: Batch) -> jax.Array | None:
    """The batch's ``token_type_ids`` ``[batch, seq]`` for a model with token-type embeddings; None for one without
    (DistilBERT, DeBERTa-v3, ModernBERT take no such input: a shared pipeline's all-zero types are not theirs)."""
    return batch.get("token_type_ids") if model.config.type_vocab_size else None


def masked_lm_loss(model: nnx.Module, batch: Batch, *, loss_chunk: int = 0,
                   with_accuracy: bool | jax.Array = True) -> Sums:
    """Masked-token loss of a ``BertForMaskedLM``: the encoder on ``input_ids`` (with ``attention_mask``,
    ``token_type_ids``, ``segment_ids`` where the batch has them), then the MLM head on the states gathered at
    ``masked_positions: [batch, max_predictions]`` only, scored against ``masked_labels`` (``IGNORE_INDEX`` in unused
    slots), as BERT's pre-training does: the head costs ``max_predictions``, not ``seq``, positions per row. A batch
    without ``masked_positions`` is scored on ``labels: [batch, seq]`` with the head on every position."""
    hidden = model.hidden_states(batch["input_ids"], batch.get("attention_mask"), token_types(model, batch),
                                 segment_ids=batch.get("segment_ids"))
    if "masked_positions" in batch:
        hidden = jnp.take_along_axis(hidden, batch["masked_positions"][..., None], axis=1)  # [batch, predictions, d]
        labels = batch["masked_labels"]
    else:  # a batch with per-position labels only: the head on every position
        labels = batch["labels"]
    return chunked_cross_entropy(hidden, model.logits, labels, labels != IGNORE_INDEX, chunk=loss_chunk,
                                 with_accuracy=with_accuracy)


def classification_loss(model: nnx.Module, batch: Batch, *, loss_chunk: int = 0,
                        with_accuracy: bool | jax.Array = True) -> Sums:
    """Cross-entropy of a ``BertForSequenceClassification`` on ``{"input_ids", "attention_mask", "labels"
    [batch], "example_weights" [batch]}``: sums weighted by ``example_weights`` (a class weight per row; 0 for the
    rows that pad the last batch of an epoch), so the step's mean is ``sum(w * loss) / sum(w)`` (PyTorch's
    ``CrossEntropyLoss(weight=...)``). ``loss_chunk`` does not apply (one prediction per row)."""
    del loss_chunk
    logits = model(batch["input_ids"], batch.get("attention_mask"), token_types(model, batch)).astype(jnp.float32)
    labels, weights = batch["labels"], batch["example_weights"].astype(jnp.float32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    hits = (jnp.argmax(jax.lax.stop_gradient(logits), axis=-1) == labels).astype(jnp.float32)
    return jnp.sum(losses * weights), jnp.sum(weights), jnp.sum(hits * weights)


def token_classification_loss(model: nnx.Module, batch: Batch, *, loss_chunk: int = 0,
                              with_accuracy: bool | jax.Array = True) -> Sums:
    """Per-token cross-entropy of a ``BertForTokenClassification`` on ``{"input_ids", "attention_mask", "labels"}``
    (all ``[batch, seq]``; ``labels`` is ``IGNORE_INDEX`` where nothing is scored: special tokens, the pieces of a
    word after its first, padding and the rows that complete an epoch's last batch): the sums over the scored
    positions, so the step's mean is over them (Hugging Face's token classification). ``loss_chunk`` does not apply
    (``num_labels`` logits per position)."""
    del loss_chunk
    logits = model(batch["input_ids"], batch.get("attention_mask"), token_types(model, batch))
    labels = batch["labels"]
    return token_cross_entropy(logits, labels, labels != IGNORE_INDEX, with_accuracy)


def span_loss(model: nnx.Module, batch: Batch, *, loss_chunk: int = 0,
              with_accuracy: bool | jax.Array = True) -> Sums:
    """Extractive QA loss of a ``...ForQuestionAnswering`` (``SpanLogits``) on ``{"input_ids", "attention_mask",
    "token_type_ids"?}`` ``[batch, seq]`` and ``"start_positions"``, ``"end_positions"``, ``"example_weights"``
    ``[batch]``: per row the mean of the start and end cross-entropies over the row's tokens (BERT's SQuAD loss;
    padding positions excluded), summed with the row weights (0 for the rows completing a batch). A hit: both
    argmaxes right."""
    del loss_chunk
    mask = batch["attention_mask"].astype(bool)
    spans = model(batch["input_ids"], batch["attention_mask"], token_types(model, batch))
    weights = batch["example_weights"].astype(jnp.float32)
    losses, hits = 0.0, 1.0
    for logits, target in ((spans.start_logits, batch["start_positions"]), (spans.end_logits, batch["end_positions"])):
        logits = jnp.where(mask, logits.astype(jnp.float32), -1e9)
        losses = losses + optax.softmax_cross_entropy_with_integer_labels(logits, target) / 2
        hits = hits * (jnp.argmax(jax.lax.stop_gradient(logits), axis=-1) == target).astype(jnp.float32)
    return jnp.sum(losses * weights), jnp.sum(weights), jnp.sum(hits * weights)


LOSSES: dict[str, Callable[..., Sums]] = {"causal": causal_lm_loss, "mlm": masked_lm_loss, "seq2seq": seq2seq_lm_loss,
                                          "classify": classification_loss, "token_classify": token_classification_loss,
                                          "span": span_loss}
