"""Beam search (transformers' definition, ``GenerationMixin._beam_search``) as one compiled loop over a decoder's
cached steps, for decoders and encoder-decoders alike.

Each example keeps ``num_beams`` running hypotheses and ``num_beams`` finished ones. A step scores every running
beam's continuations by their summed log-probability, keeps the best ``2 · num_beams`` (``(1 + stop ids) ·
num_beams`` with several stop ids) so that enough of them go on when some stop, moves the best non-stopping ones on,
and offers those of the first ``num_beams`` that stop (every candidate stops at the last step) to the finished set,
scored ``sum log p / generated_length ** length_penalty``. ``early_stopping``: True ends an example once it has
``num_beams`` finished hypotheses; False (the default) ends it once no running beam's score, at its present length,
beats the worst finished one; ``"never"`` with a positive length penalty assumes the running beams reach the last
step. Returns each example's best finished hypothesis.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from flaxzoo.models.layers.decode_state import DecodeState

EARLY_STOPPING = (False, True, "never")
NEGATIVE = -1.0e9  # the score of a hypothesis that may not be chosen (transformers' constant)


def reorder_rows(state: DecodeState, rows: jax.Array) -> DecodeState:
    """``state`` with its rows taken from ``rows: [batch]`` (each beam's cache becomes its parent beam's): the
    self-attention caches, which slots are real and each row's length; the encoder's keys and values stay, as the
    beams of one example share them."""
    def take(buffer: jax.Array) -> jax.Array:  # [batch · kv_heads, max_len, head_dim]
        per_row = buffer.reshape(state.batch, -1, *buffer.shape[1:])
        return jnp.take(per_row, rows, axis=0).reshape(buffer.shape)

    return state.replace(keys=tuple(take(k) for k in state.keys), values=tuple(take(v) for v in state.values),
                         valid=jnp.take(state.valid, rows, axis=0), lengths=jnp.take(state.lengths, rows, axis=0))


def beam_search(decode_step: Callable[[jax.Array, Any], tuple[jax.Array, Any]], logits: jax.Array, state: Any, *,
                num_beams: int, max_new_tokens: jax.Array, capacity: int, stop_ids: jax.Array, num_stop_ids: int,
                fill: jax.Array, length_penalty: jax.Array, early_stopping: bool | str,
                reorder: Callable[[Any, jax.Array], Any] = reorder_rows,
                before_step: Callable[[jax.Array, jax.Array, Any], Any] | None = None) -> jax.Array:
    """The best hypothesis of each example: ``[examples, capacity]`` new tokens (``fill`` after its stop and past
    ``max_new_tokens``).

    ``logits: [examples · num_beams, vocab]``: the prefill's last position, each example's rows alike (its prompt
    repeated per beam); ``state``: their decode state, room for ``capacity`` more tokens per row;
    ``decode_step(ids [rows, 1], state) -> (logits [rows, 1, vocab], state)``; ``stop_ids: [n]`` (-1 entries match
    nothing) of which ``num_stop_ids`` are real (static: it sizes the candidates). ``before_step(tokens [rows,
    capacity], tokens so far, state) -> state`` runs before each fed step (LongRoPE's recompute)."""
    rows, vocab = logits.shape
    examples, beams = rows // num_beams, num_beams
    keep = max(2, 1 + num_stop_ids) * beams  # candidates per example and step
    first_beams = jnp.arange(keep) < beams  # only these may join the finished set
    row_base = jnp.arange(examples)[:, None] * beams

    def select(t, logits, running, running_scores, finished, finished_scores, is_finished, unsatisfied):
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(examples, beams, vocab)
        totals = (log_probs + running_scores[:, :, None]).reshape(examples, beams * vocab)
        cand_scores, flat = jax.lax.top_k(totals, keep)  # [examples, keep], best first
        parent, token = flat // vocab, (flat % vocab).astype(jnp.int32)
        cand = jnp.take_along_axis(running, parent[:, :, None], axis=1).at[:, :, t].set(token)
        stops = (token[..., None] == stop_ids).any(-1) | (t + 1 >= max_new_tokens)  # the last step stops all
        # the best non-stopping candidates run on
        _, chosen = jax.lax.top_k(cand_scores + stops * NEGATIVE, beams)
        running = jnp.take_along_axis(cand, chosen[:, :, None], axis=1)
        running_scores = jnp.take_along_axis(cand_scores + stops * NEGATIVE, chosen, axis=1)
        parents = jnp.take_along_axis(parent, chosen, axis=1)
        # stopping candidates among the first num_beams join the finished set if they beat its worst
        offered = cand_scores / ((t + 1).astype(jnp.float32) ** length_penalty)
        full = is_finished.all(-1, keepdims=True) & (early_stopping is True)
        just_finished = stops & first_beams[None, :]
        offered = offered + (full | ~unsatisfied) * NEGATIVE + (~just_finished) * NEGATIVE
        merged_scores = jnp.concatenate([finished_scores, offered], axis=1)
        _, best = jax.lax.top_k(merged_scores, beams)
        finished = jnp.take_along_axis(jnp.concatenate([finished, cand], axis=1), best[:, :, None], axis=1)
        finished_scores = jnp.take_along_axis(merged_scores, best, axis=1)
        is_finished = jnp.take_along_axis(jnp.concatenate([is_finished, just_finished], axis=1), best, axis=1)
        # can a running beam still beat the worst finished one?
        length = jnp.where((early_stopping == "never") & (length_penalty > 0), max_new_tokens, t + 1)
        best_running = running_scores[:, :1] / (length.astype(jnp.float32) ** length_penalty)
        worst = jnp.where(is_finished, finished_scores.min(-1, keepdims=True), NEGATIVE)
        unsatisfied = unsatisfied & (best_running > worst).any(-1, keepdims=True)
        go = unsatisfied.any() & ~(is_finished.all() & (early_stopping is True)) & ~stops.all()
        return (running, running_scores, finished, finished_scores, is_finished, unsatisfied, go,
                (row_base + parents).reshape(-1))

    tokens = jnp.full((examples, beams, capacity), fill, jnp.int32)
    scores = jnp.where(jnp.arange(beams) == 0, 0.0, NEGATIVE)[None, :].repeat(examples, 0)

    def body(carry):
        t, logits, state, running, running_scores, finished, finished_scores, is_finished, unsatisfied, _ = carry
        (running, running_scores, finished, finished_scores, is_finished, unsatisfied, go,
         parents) = select(t, logits, running, running_scores, finished, finished_scores, is_finished, unsatisfied)
        state = reorder(state, parents)
        if before_step is not None:
            state = before_step(running.reshape(rows, -1), t + 1, state)
        logits, state = decode_step(running[:, :, t].reshape(-1, 1), state)
        return (t + 1, logits[:, -1], state, running, running_scores, finished, finished_scores, is_finished,
                unsatisfied, go)

    carry = (jnp.int32(0), logits, state, tokens, scores, tokens, jnp.full((examples, beams), NEGATIVE),
             jnp.zeros((examples, beams), bool), jnp.ones((examples, 1), bool), jnp.bool_(True))
    carry = jax.lax.while_loop(lambda c: c[-1], body, carry)
    best = carry[5][:, 0]  # finished hypotheses are kept best first
    return best
