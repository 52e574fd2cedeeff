"""``flaxzoo.models.inference.generate`` (compiled KV-cache loop) against plain full forward passes, padding, eos and samplers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxzoo import models
from flaxzoo.models import get_preset

KINDS = {
    "gpt2": dict(name="gpt2-tiny"),
    "llama": dict(name="llama-tiny"),  # grouped-query attention (4 heads, 2 KV heads), RoPE
    "alibi": dict(name="gpt2-tiny", position="alibi", seed=1),
}
NEW = 32


@functools.lru_cache(maxsize=None)
def model_for(kind: str) -> nnx.Module:
    """A random tiny decoder with its matrices scaled up (init std 0.02 → 0.2) so that greedy decoding is not a
    constant token; one per kind for the module (compiling an initialiser costs seconds)."""
    spec = dict(KINDS[kind])
    seed = spec.pop("seed", 0)
    model = models.create_model(get_preset(spec.pop("name"), **spec), seed=seed)
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(lambda x: x * 10.0 if x.ndim >= 2 else x, state))


@functools.lru_cache(maxsize=None)
def forward_for(kind: str):
    """Full forward pass without a cache, compiled once per input shape."""
    graphdef, state = nnx.split(model_for(kind))
    run = jax.jit(lambda state, ids, mask: nnx.merge(graphdef, state)(ids, mask))
    return lambda ids, mask=None: np.asarray(run(state, jnp.asarray(ids), None if mask is None else jnp.asarray(mask)))


def prompts(batch: int, length: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 1000, (batch, length)).astype(np.int32)


def greedy_by_full_passes(kind: str, prompt: np.ndarray, new: int) -> np.ndarray:
    """Greedy decoding the slow way: a full forward pass (no cache) per new token, argmax of the last real position.

    Each pass runs over one fixed-size buffer (the sequence so far, then filler) so that it compiles once; the filler
    after position t cannot reach position t's logits in a causal model (test_models.test_decoder_is_causal)."""
    forward = forward_for(kind)
    batch, length = prompt.shape
    buffer = np.zeros((batch, length + new), np.int32)
    buffer[:, :length] = prompt
    for t in range(length, length + new):
        buffer[:, t] = forward(buffer)[:, t - 1].argmax(-1)
    # And once more at the exact length, no filler at all.
    exact = forward(buffer[:, :-1])
    np.testing.assert_array_equal(exact[:, length - 1:].argmax(-1), buffer[:, length:])
    return buffer


@pytest.mark.slow_variants
@pytest.mark.parametrize("kind", list(KINDS))
def test_greedy_equals_argmax_of_full_forward_passes(kind):
    prompt = prompts(2, 5)
    got = np.asarray(models.generate(model_for(kind), prompt, NEW))
    expected = greedy_by_full_passes(kind, prompt, NEW)
    assert got.shape == (2, 5 + NEW)
    np.testing.assert_array_equal(got, expected)
    for row in got[:, 5:]:
        assert len(set(row.tolist())) >= 5, f"degenerate greedy sequence {row}: the test would prove little"


@pytest.mark.slow_variants
@pytest.mark.parametrize("kind", list(KINDS))
def test_cached_steps_equal_full_forward(kind):
    model = model_for(kind)
    graphdef, state = nnx.split(model)

    @jax.jit
    def decode(state, ids, decode_state):
        return nnx.merge(graphdef, state).decode(ids, decode_state)

    sequence = prompts(2, 10, seed=1)
    prefill, steps = 6, 4
    max_len = prefill + steps
    full = forward_for(kind)(sequence)
    decode_state = model.init_state(2, max_len)
    logits, decode_state = decode(state, sequence[:, :prefill], decode_state)
    np.testing.assert_allclose(np.asarray(logits), full[:, :prefill], atol=1e-4, rtol=0)
    for t in range(prefill, max_len):
        logits, decode_state = decode(state, sequence[:, t:t + 1], decode_state)
        np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, t], atol=1e-4, rtol=0, err_msg=f"step {t}")
    assert int(decode_state.index) == max_len and np.asarray(decode_state.lengths).tolist() == [max_len] * 2
    # Full: one more token is refused (outside jit) and poisons the output with NaNs (inside jit), never clamped.
    with pytest.raises(ValueError, match=r"the decode state holds 10 tokens per row and 10 are written: 1 more do "
                                         r"not fit \(create it with max_len >= 11\)"):
        model.decode(sequence[:, :1], decode_state)
    logits, _ = decode(state, sequence[:, :1], decode_state)
    assert np.isnan(np.asarray(logits)).all()


@pytest.mark.slow_variants
@pytest.mark.parametrize("kind", list(KINDS))
def test_padded_batch_generates_what_each_prompt_generates_alone(kind):
    model = model_for(kind)
    short, long = prompts(1, 3, seed=2), prompts(1, 7, seed=3)
    new = 12
    alone = [np.asarray(models.generate(model, p, new))[0, p.shape[1]:] for p in (short, long)]
    pad = 4  # a pad id that is not 0: its value must not matter
    right = np.array([list(short[0]) + [pad] * 4, list(long[0])])
    right_mask = np.array([[1] * 3 + [0] * 4, [1] * 7])
    left = np.array([[pad] * 4 + list(short[0]), list(long[0])])
    left_mask = np.array([[0] * 4 + [1] * 3, [1] * 7])
    out = np.asarray(models.generate(model, left, new, attention_mask=left_mask))
    np.testing.assert_array_equal(out[:, :7], left, err_msg="left: the prompt is returned unchanged")
    for row in range(2):
        np.testing.assert_array_equal(out[row, 7:], alone[row], err_msg=f"left padding, row {row}")
    # Right padding: each row's continuation follows its last real token, its padding moves to the end.
    out = np.asarray(models.generate(model, right, new, attention_mask=right_mask))
    np.testing.assert_array_equal(out[0], np.concatenate([short[0], alone[0], [pad] * 4]))
    np.testing.assert_array_equal(out[1], np.concatenate([long[0], alone[1]]))


def test_eos_stops_rows_and_fills_with_eos():
    model = model_for("gpt2")
    prompt = prompts(2, 5)
    greedy = np.asarray(models.generate(model, prompt, NEW))[:, 5:]
    # An eos that row 0 reaches mid-way (first occurrence), after which greedy would have gone on with other tokens.
    step = next(i for i in range(3, NEW - 3) if greedy[0, i] not in greedy[0, :i] and
                (greedy[0, i + 1:] != greedy[0, i]).any())
    eos = int(greedy[0, step])
    got = np.asarray(models.generate(model, prompt, NEW, eos_token_id=eos))[:, 5:]
    for row in range(2):
        hits = np.flatnonzero(greedy[row] == eos)
        stop = hits[0] if hits.size else NEW
        np.testing.assert_array_equal(got[row, :stop + 1], greedy[row, :stop + 1])
        assert (got[row, stop + 1:] == eos).all(), f"row {row} continued after eos: {got[row]}"
    assert (got[0, step + 1:] == eos).all() and (got[0, step + 1:] != greedy[0, step + 1:]).any()


def test_top_k_1_and_tiny_top_p_are_greedy():
    model = model_for("llama")
    prompt = prompts(2, 4, seed=5)
    greedy = np.asarray(models.generate(model, prompt, 16))
    top_k = np.asarray(models.generate(model, prompt, 16, temperature=1.0, top_k=1, rng=jax.random.key(7)))
    top_p = np.asarray(models.generate(model, prompt, 16, temperature=1.0, top_p=1e-6, rng=jax.random.key(7)))
    np.testing.assert_array_equal(top_k, greedy)
    np.testing.assert_array_equal(top_p, greedy)


def test_sampling_is_reproducible_and_depends_on_the_key():
    model = model_for("gpt2")
    prompt = prompts(2, 4, seed=6)
    sample = functools.partial(models.generate, model, prompt, 16, temperature=1.0)
    a = np.asarray(sample(rng=jax.random.key(1)))
    b = np.asarray(sample(rng=jax.random.key(1)))
    c = np.asarray(sample(rng=jax.random.key(2)))
    np.testing.assert_array_equal(a, b)
    assert (a[:, 4:] != c[:, 4:]).any()


# ------------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("new", [0, -3])
def test_max_new_tokens_must_be_positive(new):
    with pytest.raises(ValueError, match=rf"max_new_tokens={new}: expected a positive integer"):
        models.generate(model_for("gpt2"), prompts(1, 4), new)


def test_prompt_plus_new_tokens_beyond_learned_positions():
    with pytest.raises(ValueError, match=r"prompt \+ max_new_tokens = 100 \+ 30 tokens need 129 positions \(the last "
                                         r"new token is not fed back\), more than max_position_embeddings=128"):
        models.generate(model_for("gpt2"), prompts(1, 100), 30)


def test_the_whole_position_table_is_usable():
    """128 learned positions: a 100-token prompt + 29 new tokens feeds 128 tokens, the last one only sampled (as
    transformers allows); the last new token equals the argmax of a full pass over the first 128 tokens."""
    model = model_for("gpt2")
    out = np.asarray(models.generate(model, prompts(1, 100), 29))
    assert out.shape == (1, 129)
    np.testing.assert_array_equal(forward_for("gpt2")(out[:, :128])[:, -1].argmax(-1), out[:, 128])


@pytest.mark.parametrize("bad", [1000, -1])
def test_token_id_out_of_range(bad):
    prompt = prompts(1, 4)
    prompt[0, 2] = bad
    with pytest.raises(ValueError, match=rf"input_ids contains {bad}: expected token ids in \[0, 1000\) "
                                         r"\(vocab_size=1000\)"):
        models.generate(model_for("gpt2"), prompt, 4)


def test_non_contiguous_mask():
    with pytest.raises(ValueError, match=r"attention_mask row 1 is not contiguous: expected left or right padding"):
        models.generate(model_for("gpt2"), prompts(2, 4), 4, attention_mask=np.array([[1, 1, 1, 1], [1, 0, 1, 1]]))


def test_mask_of_wrong_shape():
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 3\): expected \(2, 4\)"):
        models.generate(model_for("gpt2"), prompts(2, 4), 4, attention_mask=np.ones((2, 3), np.int32))


# ------------------------------------------------------------------------------------ compiled once, stop ids, keys


def test_sampler_values_do_not_recompile():
    from flaxzoo.models.inference.generate import _generate

    model = model_for("llama")
    prompt = prompts(2, 4, seed=8)
    models.generate(model, prompt, 6, temperature=0.7, top_k=5, top_p=0.9, seed=0)
    before = _generate._cache_size()
    for temperature, top_k, top_p in ((1.3, 50, 0.5), (0.2, 2, 0.99), (2.0, 900, 0.3)):
        models.generate(model, prompt, 6, temperature=temperature, top_k=top_k, top_p=top_p, seed=1)
    models.generate(model, prompt, 6, temperature=0.7, eos_token_id=[5, 6], seed=0)  # new stop ids: same program
    assert _generate._cache_size() == before


def test_several_stop_ids_and_pad_fill():
    model = model_for("gpt2")
    prompt = prompts(2, 5)
    greedy = np.asarray(models.generate(model, prompt, NEW))[:, 5:]
    stops = [int(greedy[0, 4]), int(greedy[1, 7])]
    got = np.asarray(models.generate(model, prompt, NEW, eos_token_id=stops))[:, 5:]
    for row in range(2):
        stop = min(np.flatnonzero(np.isin(greedy[row], stops)))
        np.testing.assert_array_equal(got[row, :stop + 1], greedy[row, :stop + 1])
        assert (got[row, stop + 1:] == stops[0]).all(), "no pad id in the config: filled with the first stop id"
    with_pad = nnx.merge(*nnx.split(model))
    with_pad.config = model.config.replace(pad_token_id=999)
    padded = np.asarray(models.generate(with_pad, prompt, NEW, eos_token_id=stops))[:, 5:]
    stop = min(np.flatnonzero(np.isin(greedy[0], stops)))
    assert (padded[0, stop + 1:] == 999).all() and padded[0, stop] == greedy[0, stop]


def test_sampling_without_a_key_draws_a_fresh_seed_and_a_seed_reproduces():
    model = model_for("gpt2")
    prompt = prompts(2, 4, seed=6)
    draws = [np.asarray(models.generate(model, prompt, 16, temperature=1.0)) for _ in range(2)]
    assert (draws[0] != draws[1]).any(), "two unseeded sampling calls gave the same sample"
    a, b = (np.asarray(models.generate(model, prompt, 16, temperature=1.0, seed=11)) for _ in range(2))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, np.asarray(models.generate(model, prompt, 16, temperature=1.0,
                                                                rng=jax.random.key(11))))
    with pytest.raises(ValueError, match="pass at most one of rng"):
        models.generate(model, prompt, 4, temperature=1.0, seed=1, rng=jax.random.key(1))


def test_left_padding_does_not_count_against_learned_positions():
    model = model_for("gpt2")  # 128 learned positions
    real = prompts(1, 20, seed=9)
    padded = np.zeros((1, 100), np.int32)
    padded[0, -20:] = real
    mask = (np.arange(100) >= 80).astype(np.int32)[None]
    out = np.asarray(models.generate(model, padded, 100, attention_mask=mask))  # 20 real + 100 new <= 128
    np.testing.assert_array_equal(out[:, 100:], np.asarray(models.generate(model, real, 100))[:, 20:])


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1.0), r"temperature=-1.0"),
    (dict(temperature=1.0, top_k=1001), r"top_k=1001"),
    (dict(temperature=1.0, top_p=0.0), r"top_p=0.0"),
    (dict(eos_token_id=1000), r"eos_token_id=1000: expected a token id in \[0, 1000\) or a list of them"),
    (dict(eos_token_id=[]), r"eos_token_id=\[\]"),
    (dict(seed=1.5, temperature=1.0), r"seed=1.5: expected an integer"),
    (dict(rng=3, temperature=1.0), r"rng=3: expected a jax.random key \(jax.random.key\(seed\)\); pass seed="),
    (dict(num_beams=0), r"num_beams=0: expected a positive integer"),
    (dict(num_beams=2.0), r"num_beams=2.0: expected a positive integer"),
    (dict(num_beams=2, temperature=0.7), r"num_beams=2 with temperature=0.7: .*no beam sampling"),
    (dict(num_beams=2, early_stopping="always"), r"early_stopping='always': expected one of"),
    (dict(num_beams=2, early_stopping=2), r"early_stopping=2: expected one of"),
    (dict(num_beams=2, length_penalty=float("nan")), r"length_penalty=nan: expected a finite number"),
])
def test_bad_generation_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        models.generate(model_for("gpt2"), prompts(1, 4), 4, **kwargs)


def test_prompt_as_list_and_one_dimensional_prompt():
    model = model_for("gpt2")
    np.testing.assert_array_equal(np.asarray(models.generate(model, [[5, 6, 7]], 3)),
                                  np.asarray(models.generate(model, np.array([[5, 6, 7]]), 3)))
    with pytest.raises(ValueError, match=r"input_ids has shape \(3,\): expected \[batch, prompt\] \(for one sequence "
                                         r"pass \[ids\]\)"):
        models.generate(model, [5, 6, 7], 3)
    for empty in ([[]], np.zeros((0, 4), np.int32)):
        with pytest.raises(ValueError, match=r"input_ids has shape \(\d, \d\): expected \[batch, prompt\] with batch >= 1 "
                                             r"and prompt >= 1"):
            models.generate(model, empty, 3)


def test_right_padded_prompt_is_continued_right_after_its_real_tokens():
    """``[5 6 0 0]`` (mask ``[1 1 0 0]``) continues as ``[5 6 n1 n2 … 0 0]``: no pad ids between the prompt and its
    continuation, which equals the unpadded prompt's."""
    model = model_for("llama")
    alone = np.asarray(models.generate(model, [[5, 6]], 6))
    out = np.asarray(models.generate(model, [[5, 6, 0, 0], [7, 8, 9, 10]], 6,
                                     attention_mask=[[1, 1, 0, 0], [1, 1, 1, 1]]))
    assert out.shape == (2, 10)
    np.testing.assert_array_equal(out[0], np.concatenate([alone[0], [0, 0]]))
    np.testing.assert_array_equal(out[1], np.asarray(models.generate(model, [[7, 8, 9, 10]], 6))[0])


def test_nearby_prompt_lengths_and_new_token_counts_share_one_program():
    """Prompts of 6, 7 and 5 tokens with 10, 10 and 12 new tokens: one compiled program (each prompt length and
    ``max_new_tokens`` compiled its own before), and each call equal to greedy decoding by full passes. Every
    lowering to XLA is counted (``jax.monitoring``), so host-side helpers compiled per shape would count too."""
    from flaxzoo.models.inference.generate import _generate

    model = nnx.merge(*nnx.split(model_for("gpt2")))
    model.config = model.config.replace(remat="full")  # a graph of its own (remat: full passes only, not decoding)
    models.generate(model, prompts(2, 40, seed=20), 40)  # other buckets: warms up eager helpers (the key)
    lowered = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            lowered.append(kwargs.get("fun_name"))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        before = _generate._cache_size()
        outputs = [(length, new, np.asarray(models.generate(model, prompts(2, length, seed=length), new)))
                   for length, new in ((6, 10), (7, 10), (5, 12))]
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert _generate._cache_size() - before == 1 and len(lowered) == 1, lowered
    for length, new, out in outputs:
        assert out.shape == (2, length + new)
        np.testing.assert_array_equal(out, greedy_by_full_passes("gpt2", prompts(2, length, seed=length), new))


def test_a_model_in_training_mode_generates_in_eval_mode():
    """Dropout 0.3, the model as ``create_model`` leaves it (training mode): generate equals the eval-mode result,
    shares its compiled program, and leaves the caller's model in training mode."""
    from flaxzoo.models.inference.generate import _generate

    config = get_preset("llama-tiny", dropout=0.3, attention_dropout=0.3)
    train_mode = models.create_model(config, seed=0)
    assert any(getattr(m, "deterministic", True) is False for _, m in nnx.iter_modules(train_mode))
    eval_mode = nnx.merge(*nnx.split(train_mode))
    eval_mode.eval()
    expected = np.asarray(models.generate(eval_mode, prompts(2, 5, seed=4), 8))
    before = _generate._cache_size()
    np.testing.assert_array_equal(np.asarray(models.generate(train_mode, prompts(2, 5, seed=4), 8)), expected)
    assert _generate._cache_size() == before, "the training-mode model compiled a program of its own"
    assert any(getattr(m, "deterministic", True) is False for _, m in nnx.iter_modules(train_mode))


@pytest.mark.parametrize("n, bucket", [(1, 16), (16, 16), (17, 24), (24, 24), (25, 32), (33, 48), (49, 64),
                                       (100, 128), (129, 192), (1000, 1024)])
def test_shape_buckets(n, bucket):
    from flaxzoo.models.inference.generate import shape_bucket

    assert shape_bucket(n) == bucket


def test_one_beam_is_greedy_and_more_beams_score_at_least_as_well():
    """num_beams=1 is greedy decoding; with no stop and length_penalty=0 a beam's score is its summed
    log-probability, and the best of 4 beams scores at least what greedy's sequence scores (each checked by a full
    forward pass, numpy log-softmax)."""
    model = model_for("llama")
    prompt = prompts(2, 5, seed=3)
    greedy = np.asarray(models.generate(model, prompt, 8))
    np.testing.assert_array_equal(np.asarray(models.generate(model, prompt, 8, num_beams=1)), greedy)
    beams = np.asarray(models.generate(model, prompt, 8, num_beams=4, length_penalty=0.0))

    def summed_log_prob(sequence):
        logits = np.asarray(model(jnp.asarray(sequence)), np.float64)[:, 4:-1]
        logits = logits - logits.max(-1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        return np.take_along_axis(log_probs, sequence[:, 5:, None], -1)[..., 0].sum(-1)

    assert (summed_log_prob(beams) >= summed_log_prob(greedy) - 1e-5).all()
