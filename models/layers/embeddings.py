"""Input embeddings (token + position + token type), the tied output projection, and the padded vocabulary
(``config.pad_vocab_to``: padding rows start at zero, their logits are masked out: ``mask_padded_logits``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.linear import Dense, logical_param, take_rows
from flaxzoo.models.layers.norms import make_norm
from flaxzoo.models.layers.partitioning import (ACTIVATION_BATCH, ACTIVATION_EMBED, ACTIVATION_LENGTH, ACTIVATION_VOCAB,
                                                HEAD_BATCH, HEAD_VOCAB, HIDDEN, constrain, split_ways)
from flaxzoo.models.layers.positions import LearnedPositions, sinusoidal_table
from flaxzoo.models.layers.table_lookup import sharded_lookup


def is_concrete(x) -> bool:
    """True for values known now (numpy, concrete jax arrays); False for tracers inside jit."""
    return not isinstance(x, jax.core.Tracer)


def check_index_range(ids, upper: int, name: str, what: str = "values", note: str = "") -> None:
    """Raise ``ValueError`` if concrete ``ids`` fall outside ``[0, upper)``.

    Ids are checked at the model boundary. Inside ``jit`` the values are unknown and the check is skipped; there an
    out-of-range id looks up a row of NaNs (``take_rows``), so it shows in the output instead of silently reading
    another row: validate data before it reaches a compiled step (``models.check_token_ids``).
    """
    if ids is None or not is_concrete(ids):
        return
    ids = np.asarray(ids)
    if ids.size == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= upper:
        bad = low if low < 0 else high
        raise ValueError(f"{name} contains {bad}: expected {what} in [0, {upper}){note}")


def check_token_ids(ids, config: TransformerConfig, name: str = "input_ids") -> None:
    """Raise ``ValueError`` naming the first offending id when concrete ``ids`` fall outside ``[0, vocab_size)``.

    Call it on data before it reaches your own ``jax.jit``-compiled code: inside ``jit`` an out-of-range id gives
    NaN hidden states and logits for its row (never a silently different token)."""
    check_index_range(ids, config.vocab_size, name, "token ids", f" (vocab_size={config.vocab_size})")


def as_index_array(values, name: str, *, expected: str = "[batch, seq]", ndim: int = 2, allow_bool: bool = False):
    """``values`` (an array, nested lists of ints, or an array-like such as a torch tensor) as an integer array of
    rank ``ndim``, else ``ValueError``. Booleans only with ``allow_bool`` (masks)."""
    if values is None:
        return None
    if not isinstance(values, (list, tuple, np.ndarray, jax.Array)) and hasattr(values, "__array__"):
        values = np.asarray(values)  # torch / tensorflow tensors, array-likes
    if isinstance(values, (list, tuple)):
        try:
            values = np.asarray(values)
        except ValueError as exc:  # ragged lists
            raise ValueError(f"{name} is a ragged list: expected {expected} integers (pad the rows to one "
                             "length and pass attention_mask)") from exc
        if values.size == 0:
            values = values.astype(np.int32)
    if not hasattr(values, "ndim") or not hasattr(values, "dtype"):
        raise ValueError(f"{name} is a {type(values).__name__}: expected an integer array {expected}")
    if values.ndim != ndim:
        hint = " (for one sequence pass [ids])" if values.ndim == ndim - 1 else ""
        raise ValueError(f"{name} has shape {tuple(values.shape)}: expected {expected}{hint}")
    if not (jnp.issubdtype(values.dtype, jnp.integer) or (allow_bool and jnp.issubdtype(values.dtype, jnp.bool_))):
        raise ValueError(f"{name} has dtype {values.dtype}: expected integers {expected}")
    return values


PADDED_LOGIT = -1e30  # the logit of a padding id: exp() is exactly 0 in float32, and it stays finite


def zero_rows_from(init: jax.nn.initializers.Initializer, start: int, axis: int = 0
                   ) -> jax.nn.initializers.Initializer:
    """``init`` with the entries from index ``start`` on along ``axis`` set to zero (a padded vocabulary's rows)."""
    def initialise(key, shape, dtype=jnp.float32):
        values = init(key, shape, dtype)
        if start >= shape[axis]:
            return values
        keep = (jnp.arange(shape[axis]) < start).reshape([-1 if a == axis else 1 for a in range(len(shape))])
        return jnp.where(keep, values, jnp.zeros((), dtype))
    return initialise


def mask_padded_logits(logits: jax.Array, vocab_size: int) -> jax.Array:
    """Logits ``[..., padded_vocab]`` with the padding ids ``>= vocab_size`` set to ``PADDED_LOGIT``, same shape.

    The shape stays the padded one (``config.padded_vocab_size``), so logits split over the vocabulary by the mesh
    need no reshard; an elementwise select against an iota costs nothing next to the projection. Softmax gives the
    padding ids probability exactly 0 (the real ids' log-softmax is the unpadded model's), so argmax, sampling and
    cross-entropy never pick them. Slice ``logits[..., :vocab_size]`` to compare with an unpadded model.
    A no-op when there is no padding (``logits.shape[-1] == vocab_size``).
    """
    padded = logits.shape[-1]
    if padded == vocab_size:
        return logits
    real = jnp.arange(padded) < vocab_size
    return jnp.where(real, logits, jnp.asarray(PADDED_LOGIT, logits.dtype))


class TokenEmbedding(nnx.Module):
    """A ``[rows, hidden]`` table; ``attend`` reuses it as the tied output projection.

    ``rows`` (default ``vocab_size``) may exceed ``vocab_size`` (a padded vocabulary, ``config.pad_vocab_to``): the
    padding rows start at zero and a lookup of an id ``>= vocab_size`` gives NaNs, as any id outside the table does.
    """

    def __init__(self, vocab_size: int, hidden_size: int, *, rngs: nnx.Rngs, init_std: float = 0.02,
                 dtype=jnp.float32, param_dtype=jnp.float32, rows: int | None = None):
        self.dtype = dtype
        self.vocab_size = vocab_size
        rows = vocab_size if rows is None else rows
        if rows < vocab_size:
            raise ValueError(f"rows={rows}: expected at least vocab_size={vocab_size}")
        self.embedding = logical_param(rngs, zero_rows_from(jax.nn.initializers.normal(init_std), vocab_size),
                                       (rows, hidden_size), ("vocab", "embed"), param_dtype)

    def __call__(self, ids: jax.Array) -> jax.Array:
        """``[batch, seq]`` int → ``[batch, seq, hidden]``.

        On a mesh the batch stays split. Under FSDP the table is never whole on a device: its row blocks go round the
        devices that split the rows (``models/layers/table_lookup.py``, the gradient too); otherwise it is cast to
        the compute dtype and looked up (split over ``tensor`` along ``vocab``, each device looks up its rows and one
        all-reduce of its own batch rows adds them). Left to itself, XLA gathered a row-split table by collecting
        every device's ids and built the embeddings of the whole global batch on each device before
        reduce-scattering them (``f32[32, 2048, 2048]`` for Llama-3.2-1B at batch 32 on a v5p-8)."""
        return sharded_lookup(self.embedding[...], ids, self.dtype, self.vocab_size)

    def attend(self, hidden: jax.Array) -> jax.Array:
        """Tied output logits ``hidden · tableᵀ``: ``[batch, seq, hidden]`` → ``[batch, seq, rows]`` float32, the
        product of compute-dtype operands accumulated in float32 (padding ids unmasked: ``LMHead`` masks them)."""
        return jnp.einsum("bsd,vd->bsv", hidden.astype(self.dtype), self.embedding[...].astype(self.dtype),
                          preferred_element_type=jnp.float32)


def token_table(config: TransformerConfig, rngs: nnx.Rngs) -> TokenEmbedding:
    """The config's token table: ``[padded_vocab_size, embedding_width]``."""
    return TokenEmbedding(config.vocab_size, config.embedding_width, rngs=rngs, init_std=config.initializer_range,
                          dtype=jnp.dtype(config.dtype), param_dtype=jnp.dtype(config.param_dtype),
                          rows=config.padded_vocab_size)


class InputEmbeddings(nnx.Module):
    """Token embedding + absolute positions (learned or sinusoidal) + token types, then an optional norm (BERT).

    Factorised (``config.embedding_size`` E set: ALBERT, ELECTRA): the tables and the norm are E wide and
    ``project`` (E → hidden, with bias) follows the dropout. ``own_tokens=False``: the token table is another
    module's (an encoder-decoder's one table for both stacks), passed to each call."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, own_tokens: bool = True):
        self.config = config
        dtype, param_dtype = jnp.dtype(config.dtype), jnp.dtype(config.param_dtype)
        std = config.initializer_range
        width = config.embedding_width
        self.tokens = (token_table(config, rngs) if own_tokens else None)
        self.positions = (LearnedPositions(config.max_position_embeddings, width, rngs=rngs,
                                           init_std=std, param_dtype=param_dtype)
                          if config.position == "learned" else None)
        self.sinusoids = (nnx.Variable(jnp.asarray(sinusoidal_table(config.max_position_embeddings, width)))
                          if config.position == "sinusoidal" else None)
        self.token_types = (logical_param(rngs, jax.nn.initializers.normal(std),
                                          (config.type_vocab_size, width), (None, "embed"), param_dtype)
                            if config.type_vocab_size else None)
        self.norm = make_norm(config, rngs, width) if config.embedding_norm else None
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
        self.project = (Dense((width,), (config.hidden_size,), axes=(None, "embed"), use_bias=True, rngs=rngs,
                              init_std=std, dtype=dtype, param_dtype=param_dtype)
                        if config.embedding_size is not None else None)

    def __call__(self, input_ids: jax.Array | None, positions: jax.Array, token_type_ids: jax.Array | None = None,
                 *, inputs_embeds: jax.Array | None = None, tokens: TokenEmbedding | None = None) -> jax.Array:
        """``[batch, seq]`` ids and positions → ``[batch, seq, hidden]``. ``inputs_embeds: [batch, seq, E]`` (E:
        ``config.embedding_width``), when given, is used in place of the token lookup (``input_ids`` is then
        ignored). ``tokens``: the shared token table, for embeddings built without their own."""
        tokens = self.tokens if tokens is None else tokens
        if tokens is None:
            raise ValueError("these embeddings have no token table of their own: pass the shared one (tokens=)")
        x = tokens(input_ids) if inputs_embeds is None else inputs_embeds.astype(tokens.dtype)
        if self.config.embedding_multiplier != 1.0:  # Gemma: √hidden, rounded to the activations' dtype first
            x = x * jnp.asarray(self.config.embedding_multiplier, x.dtype)
        if self.positions is not None:
            x = x + self.positions(positions).astype(x.dtype)
        if self.sinusoids is not None:
            x = x + take_rows(self.sinusoids[...], positions).astype(x.dtype)
        if self.token_types is not None:
            types = jnp.zeros(positions.shape, jnp.int32) if token_type_ids is None else token_type_ids
            x = x + take_rows(self.token_types[...], types).astype(x.dtype)
        if self.norm is not None:
            x = self.norm(x)
        x = self.dropout(x)
        if self.project is not None:
            x = self.project(x)
        return constrain(x, HIDDEN)


class LMHead(nnx.Module):
    """Hidden states → vocabulary logits, tied to the token table or with its own kernel, optional bias.

    ``[batch, seq, hidden]`` → ``[batch, seq, padded_vocab]`` in the compute dtype (``config.dtype``: float32 logits
    for a float32 model, bfloat16 for a bfloat16 one, as MaxText's and Hugging Face's heads give; the product is
    accumulated, biased and soft-capped in float32 and rounded once), ``padded_vocab = config.padded_vocab_size``
    (= ``vocab_size`` unless ``config.pad_vocab_to`` pads it). The logits of the padding ids ``[vocab_size,
    padded_vocab)`` are ``PADDED_LOGIT`` (``mask_padded_logits``): softmax, argmax, sampling and cross-entropy never
    pick them, and ``logits[..., :vocab_size]`` are the unpadded model's. The untied kernel is
    ``[hidden, padded_vocab]`` and the bias ``[padded_vocab]``, their padding entries starting at zero. ``features``
    (default ``hidden_size``) is the input width: an MLM head over factorised embeddings takes ``embedding_size``.
    """

    def __init__(self, config: TransformerConfig, *, use_bias: bool, rngs: nnx.Rngs, features: int | None = None):
        vocab, rows = config.vocab_size, config.padded_vocab_size
        features = config.hidden_size if features is None else features
        self.vocab_size, self.rows = vocab, rows
        self.kernel = (None if config.tie_word_embeddings else
                       logical_param(rngs, zero_rows_from(jax.nn.initializers.normal(config.initializer_range),
                                                          vocab, axis=1),
                                     (features, rows), ("embed", "vocab"),
                                     jnp.dtype(config.param_dtype)))
        self.bias = (logical_param(rngs, jax.nn.initializers.zeros, (rows,), ("vocab",),
                                   jnp.dtype(config.param_dtype)) if use_bias else None)
        self.dtype = jnp.dtype(config.dtype)
        self.softcap = config.final_logit_softcap

    def __call__(self, hidden: jax.Array, tokens: TokenEmbedding) -> jax.Array:
        # On a mesh whose FSDP axis splits the vocabulary rows of the table (or of the kernel), each device computes
        # the logits of its own rows for the rows of the batch its FSDP group holds (the hidden states gathered
        # over FSDP), as Megatron's vocabulary-parallel cross-entropy does: the weights are never gathered for the
        # head, and their gradient is computed on the device that keeps those rows. Splitting by batch instead,
        # every device gathered the whole table and built a whole float32 gradient for it, reduced over the
        # devices for every loss chunk (1 GiB each for Llama 3's 128,256 x 2048 table). Chosen when the gathered
        # states are the smaller of the two: fewer tokens in the group's call than vocabulary rows (a loss chunk
        # of a large vocabulary; ``loss_chunk="auto"`` cuts those).
        shape = (*hidden.shape[:-1], self.rows)
        by_vocab = (HEAD_BATCH, ACTIVATION_LENGTH, HEAD_VOCAB)
        by_batch = (ACTIVATION_BATCH, ACTIVATION_LENGTH, ACTIVATION_VOCAB)
        vocab_parallel = False
        if hidden.ndim == 3 and split_ways(by_vocab, shape) >= split_ways(by_batch, shape) > 1:
            group_rows = hidden.shape[0] // split_ways((HEAD_BATCH,), hidden.shape[:1])
            vocab_parallel = group_rows * hidden.shape[1] < self.rows
        if vocab_parallel:
            hidden = constrain(hidden, (HEAD_BATCH, ACTIVATION_LENGTH, ACTIVATION_EMBED))
        if self.kernel is None:
            logits = tokens.attend(hidden)
        else:
            logits = jnp.einsum("bsd,dv->bsv", hidden.astype(self.dtype), self.kernel[...].astype(self.dtype),
                                preferred_element_type=jnp.float32)
        logits = constrain(logits, by_vocab if vocab_parallel else by_batch)
        if self.bias is not None:
            logits = logits + self.bias[...].astype(jnp.float32)
        if self.softcap is not None:  # Gemma 2: c · tanh(logits / c)
            logits = self.softcap * jnp.tanh(logits / self.softcap)
        return mask_padded_logits(logits, self.vocab_size).astype(self.dtype)
