"""Autoregressive generation: one compiled program (prefill + ``lax.while_loop`` over cached decode steps).

Few programs for many calls: prompts are left-aligned into a width rounded up to a shape bucket (:func:`shape_bucket`:
16, 24, 32, 48, 64, 96, ...), the buffer of new tokens is a bucket too, and ``max_new_tokens`` is a traced loop bound,
so calls whose longest prompt and ``max_new_tokens`` fall in the same buckets share one compiled program. Beyond the
buckets, a program is compiled per model (its graph, in eval mode whatever mode the caller's model is in), batch size
and kind of decoding: greedy or sampling. The values of ``temperature``, ``top_k`` and ``top_p`` (one sampling program
serves plain, top-k and nucleus sampling: ``flaxzoo.models.inference.sampling`` branches with ``lax.cond``), the stop ids
(padded to 8 or the next power of two) and the key are arguments, so changing them does not recompile.
"""

from __future__ import annotations

import secrets
from functools import partial
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.embeddings import as_index_array, check_token_ids
from flaxzoo.models.layers.linear import decode_layout
from flaxzoo.models.inference.beam_search import EARLY_STOPPING, beam_search
from flaxzoo.models.inference.sampling import check_sampling_args, sample_logits

__all__ = ["MIN_BUCKET", "eval_split", "generate", "left_align", "lower_generate", "shape_bucket"]

MIN_BUCKET = 16  # the smallest prompt width and new-token buffer a program is compiled for


def shape_bucket(n: int, minimum: int = MIN_BUCKET) -> int:
    """The smallest bucket ``>= n``: ``minimum``, then powers of two and their three-quarters (``2^k`` and
    ``3·2^(k-2)``: 16, 24, 32, 48, 64, 96, 128, ...), so a bucket wastes at most half of itself and nearby lengths
    share one compiled program."""
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n={n!r}: expected a positive integer")
    if n <= minimum:
        return minimum
    power = 1 << (int(n) - 1).bit_length()  # the power of two >= n
    three_quarters = power // 4 * 3
    return three_quarters if n <= three_quarters and three_quarters >= minimum else power


def eval_split(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State]:
    """``nnx.split`` of ``model`` in eval mode (dropout off): of the model itself when nothing in it is in training
    mode, else of a copy set to eval (the same arrays; the caller's model keeps its mode). Eval-mode graphs of one
    model are equal, so compiled programs keyed by the graph are shared whatever mode the caller left it in."""
    training = any(getattr(m, "deterministic", True) is False or getattr(m, "use_running_average", True) is False
                   for _, m in nnx.iter_modules(model))
    if not training:
        return nnx.split(model)
    copy = nnx.merge(*nnx.split(model))
    copy.eval()
    return nnx.split(copy)


def _real_spans(attention_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(start, length)`` of each row's real tokens, ``[batch]`` each; ValueError for an empty or non-contiguous
    row."""
    lengths = attention_mask.sum(axis=1)
    starts = attention_mask.argmax(axis=1)
    for row in range(attention_mask.shape[0]):
        if lengths[row] == 0:
            raise ValueError(f"prompt row {row} has no real tokens (attention_mask is all zeros)")
        if not attention_mask[row, starts[row]:starts[row] + lengths[row]].all():
            raise ValueError(f"attention_mask row {row} is not contiguous: expected left or right padding")
    return starts, lengths


def left_align(input_ids: np.ndarray, attention_mask: np.ndarray, width: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """Each row's real tokens moved to the right end of ``width`` slots (default: the prompt's width), padding on the
    left, so that every row's next token goes to the same cache slot: ``(ids [batch, width] int32 (0 in padding),
    mask [batch, width] int32)``. Each row's real tokens must be contiguous (left or right padding) and fit."""
    starts, lengths = _real_spans(attention_mask)
    batch, prompt_len = input_ids.shape
    width = prompt_len if width is None else int(width)
    if width < lengths.max():
        raise ValueError(f"width={width}: expected at least the longest prompt's {int(lengths.max())} real tokens")
    slots = np.arange(width)[None, :]
    first_slot = (width - lengths)[:, None]
    source = np.clip(starts[:, None] + slots - first_slot, 0, prompt_len - 1)
    valid = slots >= first_slot
    aligned = np.where(valid, np.take_along_axis(input_ids, source, axis=1), 0)
    return aligned.astype(np.int32), valid.astype(np.int32)


def _longrope_original(config: TransformerConfig) -> int | None:
    """A LongRoPE model's ``original_max_position_embeddings`` (None for any other model): the length whose crossing
    makes :func:`generate` recompute the cache, as transformers' Phi-3 ``generate`` drops its cache there, so that
    every step's logits are those of the whole sequence so far under one factor set (long past the length)."""
    scaling = config.rope_scaling_dict if config.position == "rope" else None
    if not scaling or scaling.get("rope_type") != "longrope":
        return None
    return int(scaling["original_max_position_embeddings"])


class Search(NamedTuple):
    """How a compiled generation program picks tokens (static: one program per kind): ``greedy`` or sampling, one
    hypothesis per row or ``num_beams`` (beam search: ``models/inference/beam_search.py``), and the beam settings
    that size or shape the program."""

    greedy: bool = True
    num_beams: int = 1
    num_stop_ids: int = 0
    early_stopping: bool | str = False


def _continue(search: Search, decode_step, logits, decode_state, max_new_tokens, rng, knobs, capacity,
              before_step=None):
    """The decode loop after the prefill: :func:`_token_loop`, or beam search. ``knobs``: (temperature, top_k,
    top_p, stop_ids, fill, length_penalty), traced."""
    temperature, top_k, top_p, stop_ids, fill, length_penalty = knobs
    if search.num_beams > 1:
        return beam_search(decode_step, logits[:, -1], decode_state, num_beams=search.num_beams,
                           max_new_tokens=max_new_tokens, capacity=capacity, stop_ids=stop_ids,
                           num_stop_ids=search.num_stop_ids, fill=fill, length_penalty=length_penalty,
                           early_stopping=search.early_stopping, before_step=before_step)
    return _token_loop(decode_step, logits, decode_state, max_new_tokens=max_new_tokens, rng=rng,
                       temperature=temperature, top_k=top_k, top_p=top_p, stop_ids=stop_ids, fill=fill,
                       capacity=capacity, greedy=search.greedy, before_step=before_step)


def _token_loop(decode_step, logits, decode_state, *, max_new_tokens, rng, temperature, top_k, top_p, stop_ids,
                fill, capacity, greedy, before_step=None):
    """The decode loop both generators share: from the prefill's ``logits`` ``[batch, 1, vocab]`` and state, pick a
    token, feed it (``decode_step(ids [batch, 1], state) -> (logits, state)``), until ``max_new_tokens`` or every row
    has stopped. ``before_step(tokens, step, state) -> state`` runs first in each step (LongRoPE's recompute).
    Returns ``[batch, capacity]`` tokens (``fill`` after a stop and past ``max_new_tokens``)."""
    batch = logits.shape[0]

    def pick(logits, step, done):
        if greedy:
            token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
        else:
            token = sample_logits(logits[:, -1], jax.random.fold_in(rng, step), temperature, top_k, top_p)
        token = jnp.where(done, fill, token)
        return token, done | (token[:, None] == stop_ids[None, :]).any(axis=-1)

    first, done = pick(logits, 0, jnp.zeros((batch,), bool))
    tokens = jnp.full((batch, capacity), fill, jnp.int32).at[:, 0].set(first)

    def keep_going(carry):
        step, _, _, _, done = carry
        return (step < max_new_tokens) & ~done.all()

    def step_fn(carry):
        step, tokens, last, decode_state, done = carry
        if before_step is not None:
            decode_state = before_step(tokens, step, decode_state)
        logits, decode_state = decode_step(last[:, None], decode_state)
        token, done = pick(logits, step, done)
        return step + 1, tokens.at[:, step].set(token), token, decode_state, done

    return jax.lax.while_loop(keep_going, step_fn, (jnp.int32(1), tokens, first, decode_state, done))[1]


@partial(jax.jit, static_argnames=("graphdef", "capacity", "search"))
def _generate(graphdef, state, input_ids, prompt_mask, max_new_tokens, rng, knobs, *, capacity, search):
    """``[batch, capacity]`` new tokens: the first ``max_new_tokens`` (traced int32, ``1 <= max_new_tokens <=
    capacity``) generated, the rest ``fill``. ``input_ids`` / ``prompt_mask: [batch, width]``, left padded;
    ``knobs``: see :func:`_continue` (``stop_ids: [n]``, -1 entries match nothing; ``fill``: the id written after a
    stop and past ``max_new_tokens``). ``capacity`` (static, a :func:`shape_bucket`) sizes the token buffer and the
    cache. Beam search runs ``num_beams`` rows per prompt."""
    model = nnx.merge(graphdef, state)
    input_ids = jnp.repeat(input_ids, search.num_beams, axis=0)
    prompt_mask = jnp.repeat(prompt_mask, search.num_beams, axis=0)
    batch, width = input_ids.shape
    # The last new token is never fed back, so the cache needs one slot less than prompt + new tokens (beam search
    # feeds its last pick once more).
    slots = width + capacity - (1 if search.num_beams == 1 else 0)
    decode_state = model.init_state(batch, slots)
    layers = model.backbone.decoding_layers()  # stacked weights sliced here, once, not in every step of the loop
    logits, decode_state = model.decode(input_ids, decode_state, prompt_mask, last_only=True, layers=layers)
    original = _longrope_original(model.config)

    def recompute(tokens, step, decode_state):
        """The cache of every token fed so far and ``last`` (``[batch, slots]`` from a fresh state: one call, so the
        LongRoPE factors of a sequence past ``original``), then ``last``'s slot taken back for the step to feed it."""
        ids = jnp.concatenate([input_ids, tokens], axis=1)[:, :slots]
        fed = (jnp.arange(slots) < width + step).astype(jnp.int32)[None, :]
        mask = jnp.concatenate([prompt_mask, jnp.ones_like(tokens)], axis=1)[:, :slots] * fed
        _, fresh = model.decode(ids, model.init_state(batch, slots), mask, last_only=True, layers=layers)
        back = (width + step - 1).astype(jnp.int32)
        return fresh.replace(valid=fresh.valid.at[:, back].set(0), lengths=fresh.lengths - 1, index=back)

    def crossing(tokens, step, decode_state):  # the step crossing the original length recomputes the cache
        return jax.lax.cond(jnp.max(decode_state.lengths) == original, partial(recompute, tokens, step),
                            lambda state: state, decode_state)

    return _continue(search, lambda ids, s: model.decode(ids, s, layers=layers), logits, decode_state,
                     max_new_tokens, rng, knobs, capacity, None if original is None else crossing)


@partial(jax.jit, static_argnames=("graphdef", "capacity", "search"))
def _generate_from_source(graphdef, state, source_ids, source_mask, start, max_new_tokens, rng, knobs, *, capacity,
                          search):
    """An encoder-decoder's :func:`_generate`: the encoder runs once over ``source_ids`` / ``source_mask: [batch,
    src]``, every decoder layer's cross-attention keys and values are projected once into the decode state, and
    the decoder starts from ``start`` (the config's ``decoder_start_token_id``)."""
    model = nnx.merge(graphdef, state)
    memory = jnp.repeat(model.encode(source_ids, source_mask).hidden, search.num_beams, axis=0)
    source_mask = jnp.repeat(source_mask, search.num_beams, axis=0)
    layers = model.decoder.decoding_layers()
    if jax.default_backend() == "cpu":  # faster dots at a few rows (decode_layout); accelerators pick their layouts
        decode_layout(layers)
    # the start token and capacity - 1 picks are fed (beam search feeds its last pick too)
    decode_state = model.init_state(memory, source_mask, capacity + (search.num_beams > 1), layers)
    logits, decode_state = model.decode(jnp.full((memory.shape[0], 1), start, jnp.int32), decode_state,
                                        last_only=True, layers=layers)
    return _continue(search, lambda ids, s: model.decode(ids, s, layers=layers), logits, decode_state,
                     max_new_tokens, rng, knobs, capacity)


def _generate_target(graphdef, state, config: TransformerConfig, source_ids: np.ndarray, source_mask: np.ndarray,
                     max_new_tokens: int, rng, knobs: tuple, capacity: int, search: Search) -> jax.Array:
    """:func:`generate` for an encoder-decoder: the source right-padded to a shape bucket, then ``[batch, 1 +
    max_new_tokens]`` (the start id and the new tokens)."""
    start = config.decoder_start_token_id
    if start is None:
        raise ValueError("this encoder-decoder's config has no decoder_start_token_id: expected the id its decoder "
                         "starts from (T5: the pad id)")
    if not source_mask.any(axis=1).all():
        raise ValueError(f"source row {int(np.argmin(source_mask.any(axis=1)))} has no real tokens (attention_mask "
                         "is all zeros)")
    width = shape_bucket(source_ids.shape[1])
    pad = ((0, 0), (0, width - source_ids.shape[1]))
    new_tokens = _generate_from_source(graphdef, state, np.pad(source_ids, pad).astype(np.int32),
                                       np.pad(source_mask, pad), np.int32(start), np.int32(max_new_tokens), rng,
                                       knobs, capacity=capacity, search=search)
    starts = np.full((source_ids.shape[0], 1), start, np.int32)
    return jax.device_put(np.concatenate([starts, np.asarray(new_tokens)[:, :max_new_tokens]], axis=1))


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


def lower_generate(model: nnx.Module, batch: int, width: int, capacity: int, *, greedy: bool = True,
                   sharding: jax.sharding.Sharding | None = None) -> jax.stages.Lowered:
    """The program :func:`generate` runs (prefill and decode loop) for ``batch`` prompts ``width`` tokens wide and
    ``capacity`` new tokens (shape buckets), lowered from abstract inputs placed by ``sharding`` (default: none):
    what a compile for another platform (``flaxzoo.train.tools.targets.compile_devices``) starts from."""
    graphdef, state = eval_split(model)

    def spec(shape: tuple[int, ...], dtype) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    ids, key = spec((batch, width), jnp.int32), spec((), jax.eval_shape(lambda: jax.random.key(0)).dtype)
    knobs = (spec((), jnp.float32), spec((), jnp.int32), spec((), jnp.float32), spec((8,), jnp.int32),
             spec((), jnp.int32), spec((), jnp.float32))
    args = (graphdef, jax.tree.map(lambda x: spec(x.shape, x.dtype), state), ids, ids, spec((), jnp.int32), key, knobs)
    return _generate.lower(*args, capacity=capacity, search=Search(greedy=greedy))


def generate(model: nnx.Module, input_ids, max_new_tokens: int, *, attention_mask=None, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, eos_token_id: int | Sequence[int] | None = None,
             rng: jax.Array | None = None, seed: int | None = None, num_beams: int = 1, length_penalty: float = 1.0,
             early_stopping: bool | str = False) -> jax.Array:
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
      num_beams: more than 1 is beam search (``models/inference/beam_search.py``, transformers' definition): each
        row's best of ``num_beams`` hypotheses, scored ``sum log p / new_tokens ** length_penalty`` once they stop;
        ``early_stopping`` (False, True or ``"never"``) says when an example's search ends. Greedy only (no beam
        sampling).

    Returns ``[batch, prompt + max_new_tokens]`` int32: each row's prompt and, right after its last real token,
    its new tokens. A left-padded row keeps its padding in front (``input_ids`` row, then the new tokens); a
    right-padded row's padding moves behind the new tokens (``[5 6 0 0]`` → ``[5 6 n1 n2 … 0 0]``), so the
    continuation never has pad ids in the middle. The model runs in eval mode (no dropout) whatever mode it is in;
    its mode is not changed.

    An encoder-decoder (``Seq2SeqForConditionalGeneration``): ``input_ids`` is the source (padded anywhere, as
    ``attention_mask`` says); the encoder runs once, and the decoder starts from ``config.decoder_start_token_id``.
    Returns ``[batch, 1 + max_new_tokens]``: the start id, then the new tokens, as transformers' ``generate``
    returns for these models.
    """
    if not hasattr(model, "decode") or not hasattr(model, "init_state"):
        raise ValueError(f"generate needs a causal LM with a KV cache (GPTForCausalLM) or an encoder-decoder "
                         f"(Seq2SeqForConditionalGeneration); got {type(model).__name__}")
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
    if rng is not None and seed is not None:
        raise ValueError("pass at most one of rng (a jax.random key) and seed (an int)")
    if seed is not None and (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool)):
        raise ValueError(f"seed={seed!r}: expected an integer")
    if rng is not None and not (isinstance(rng, jax.Array) and (jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) or (
            rng.dtype == jnp.uint32 and rng.shape == (2,)))):
        raise ValueError(f"rng={rng!r}: expected a jax.random key (jax.random.key(seed)); pass seed=... for an int")
    greedy = temperature == 0.0
    if not isinstance(num_beams, (int, np.integer)) or isinstance(num_beams, bool) or num_beams < 1:
        raise ValueError(f"num_beams={num_beams!r}: expected a positive integer (1: no beam search)")
    if not isinstance(length_penalty, (int, float)) or isinstance(length_penalty, bool) or \
            not np.isfinite(length_penalty):
        raise ValueError(f"length_penalty={length_penalty!r}: expected a finite number")
    if early_stopping not in EARLY_STOPPING or isinstance(early_stopping, (int, float)) and \
            not isinstance(early_stopping, bool):
        raise ValueError(f"early_stopping={early_stopping!r}: expected one of {EARLY_STOPPING}")
    if num_beams > 1 and not greedy:
        raise ValueError(f"num_beams={num_beams} with temperature={temperature}: beam search here is deterministic "
                         "(no beam sampling); expected temperature=0")
    # the beam settings shape only a beam search's program: other calls share theirs whatever the stop ids
    search = (Search(greedy=greedy) if num_beams == 1 else
              Search(greedy=greedy, num_beams=int(num_beams), num_stop_ids=len(stop_ids),
                     early_stopping=early_stopping))
    if rng is None:
        rng = jax.random.key(0 if greedy else (secrets.randbits(63) if seed is None else int(seed)))
    fill = config.pad_token_id if config.pad_token_id is not None else (stop_ids[0] if stop_ids else 0)
    mask = mask.astype(np.int32)
    capacity = shape_bucket(int(max_new_tokens))
    graphdef, state = eval_split(model)
    knobs = (np.float32(temperature), np.int32(top_k), np.float32(top_p), _padded_stop_ids(stop_ids), np.int32(fill),
             np.float32(length_penalty))
    if config.is_encoder_decoder:
        return _generate_target(graphdef, state, config, input_ids, mask, int(max_new_tokens), rng, knobs, capacity,
                                search)
    longest = int(mask.sum(axis=1).max())
    needed = longest + max_new_tokens - 1 + config.position_offset  # the last new token is never fed back
    if config.position in ("learned", "sinusoidal") and needed > config.max_position_embeddings:
        raise ValueError(f"prompt + max_new_tokens = {longest} + {max_new_tokens} tokens need {needed} positions "
                         f"(the last new token is not fed back), more than max_position_embeddings="
                         f"{config.max_position_embeddings} of this model's {config.position} positions (the "
                         "longest prompt's real tokens are counted)")
    starts, lengths = _real_spans(mask)
    aligned_ids, aligned_mask = left_align(input_ids, mask, shape_bucket(longest))
    # numpy arguments and device_put, not jnp.asarray: that compiles a small program for every new shape.
    new_tokens = _generate(graphdef, state, aligned_ids, aligned_mask, np.int32(max_new_tokens), rng, knobs,
                           capacity=capacity, search=search)
    new_tokens = np.asarray(new_tokens)[:, :max_new_tokens]
    # Each row: its tokens up to the end of its real ones, the new tokens, then its right padding (if any).
    out = np.empty((input_ids.shape[0], input_ids.shape[1] + int(max_new_tokens)), np.int32)
    for row, end in enumerate((starts + lengths).tolist()):
        out[row] = np.concatenate([input_ids[row, :end], new_tokens[row], input_ids[row, end:]])
    return jax.device_put(out)
