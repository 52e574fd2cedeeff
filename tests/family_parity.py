"""Shared checks of a decoder family against transformers (PyTorch), for the family test files: logits both ways on
a left-padded batch (unrolled layers), the scanned layout proven equal to the unrolled one (parameters, saved
tensors, logits: :func:`check_layouts_agree`, which the encoder checks use too), and greedy generation token for
token."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Callable, Mapping

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from flaxzoo import models
from flaxzoo.models.io import from_pretrained, save_pretrained

VOCAB, ATOL = 512, 1e-4
transformers.logging.set_verbosity_error()

# Small sizes every case starts from (each case changes what its family needs).
SMALL = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    return model.eval()


def left_padded(seq: int = 12, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two rows of ids; the second left-padded by 4 (id 0, mask 0)."""
    ids = np.random.RandomState(seed).randint(3, VOCAB, (2, seq)).astype(np.int64)
    mask = np.ones((2, seq), np.int64)
    ids[1, :4], mask[1, :4] = 0, 0
    return ids, mask


@nnx.jit
def forward(model, ids, mask):
    return model(ids, mask)


def hf_logits(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()


def assert_real_close(ours, theirs, mask) -> None:
    real = mask.astype(bool)
    ours, theirs = np.asarray(ours)[real], theirs[real]
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL)
    assert np.abs(theirs).max() > 0.05


def saved_case(model: torch.nn.Module, directory) -> torch.nn.Module:
    """``model`` perturbed (seeded) and saved to ``directory``; returned in eval mode."""
    model = perturbed(model)
    model.save_pretrained(directory)
    return model


_LOADED: dict[str, nnx.Module] = {}


def loaded(directory) -> nnx.Module:
    """``from_pretrained(directory)`` in the unrolled layout, loaded once per test process (the tests only read it),
    so that both directions and the layout check share one model and one compiled forward."""
    key = str(directory)
    if key not in _LOADED:
        _LOADED[key] = from_pretrained(directory, scan_layers=False)
    return _LOADED[key]


def padded_logits(model: nnx.Module, seed: int) -> np.ndarray:
    ids, mask = left_padded(seed=seed)
    return np.asarray(forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)))


def check_loads_with_same_logits(hf: torch.nn.Module, directory) -> nnx.Module:
    """transformers → flaxzoo: ``from_pretrained`` (unrolled) gives transformers' logits on a left-padded batch."""
    model = loaded(directory)
    assert model.config.model_type == hf.config.model_type
    ids, mask = left_padded()
    assert_real_close(padded_logits(model, seed=0), hf_logits(hf, ids, mask), mask)
    return model


def check_saves_with_same_logits(hf: torch.nn.Module, directory, out,
                                 keys=("sliding_window", "head_dim", "rope_parameters", "layer_types")):
    """flaxzoo → transformers: the saved directory (of the unrolled model; the scanned one writes the same:
    :func:`check_scanned_layout`) loads as ``hf``'s class with flaxzoo's logits, and the config ``keys``
    transformers reads equal the original's."""
    model = loaded(directory)
    saved = save_pretrained(model, out)
    again = transformers.AutoModelForCausalLM.from_pretrained(saved).eval()
    assert type(again) is type(hf)
    ids, mask = left_padded(seed=1)
    assert_real_close(padded_logits(model, seed=1), hf_logits(again, ids, mask), mask)
    for key in keys:
        if getattr(hf.config, key, None) is not None:
            assert getattr(again.config, key) == getattr(hf.config, key), key


def check_scanned_layout(hf: torch.nn.Module, directory, out) -> None:
    """The scanned layout (``scan_layers=True``: stacked blocks, the per-layer windows / RoPE / patterns traced) is
    the unrolled one (:func:`check_layouts_agree`: parameters, saved tensors and ``config.json``, logits), and its
    logits are transformers' on the left-padded batch."""
    ids, mask = left_padded()
    scanned = check_layouts_agree(directory, pathlib.Path(out), lambda m: {"logits": padded_logits(m, seed=0)},
                                  mask, unrolled=loaded(directory))
    assert_real_close(padded_logits(scanned, seed=0), hf_logits(hf, ids, mask), mask)


def check_greedy_generation(hf: torch.nn.Module, directory, new: int = 24) -> None:
    """``new`` greedy tokens after a left-padded batch equal transformers' ``generate``."""
    model = from_pretrained(directory)
    ids, mask = left_padded(seq=10, seed=2)
    with torch.no_grad():
        theirs = hf.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                             max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0).numpy()
    ours = np.asarray(models.generate(model, ids, new, attention_mask=mask))
    np.testing.assert_array_equal(ours[:, ids.shape[1]:], theirs[:, ids.shape[1]:])


def assert_same_beams(ours: np.ndarray, theirs: np.ndarray, stop: int, fill: int) -> None:
    """Each row's new tokens (``[batch, n]``) equal up to its first ``stop`` (included: the best hypothesis
    transformers kept); after it flaxzoo writes ``fill``, the pad id (transformers fills with the stop id when the pad
    id is 0, and crops to the longest row)."""
    for row, (mine, reference) in enumerate(zip(ours, theirs)):
        stops = np.flatnonzero(reference == stop)
        end = int(stops[0]) + 1 if stops.size else reference.shape[0]
        np.testing.assert_array_equal(mine[:end], reference[:end], err_msg=f"row {row}")
        assert (mine[end:] == fill).all() if stops.size else True, f"row {row}: {mine[end:]} after the stop"


def frequent_token(tokens: np.ndarray) -> int:
    """The token greedy decoding emits most (a stop id that makes beams finish at different steps)."""
    values, counts = np.unique(tokens, return_counts=True)
    return int(values[np.argmax(counts)])


BEAM_SETTINGS = ((4, 1.0, False), (3, 2.0, True), (4, 0.5, "never"), (2, -1.0, False))


def beam_settings(case: str, cases, every_setting: str) -> tuple:
    """Every one of :data:`BEAM_SETTINGS` for the case ``every_setting``, one setting (rotating over the sorted cases)
    for each other case: the search is the same code over any model's logits, and what a family adds (its decode
    state reordered per beam) one setting exercises. Each compiled setting costs a case 2-5 s."""
    if case == every_setting:
        return BEAM_SETTINGS
    return (BEAM_SETTINGS[sorted(cases).index(case) % len(BEAM_SETTINGS)],)


def check_beam_generation(hf: torch.nn.Module, directory, settings=BEAM_SETTINGS, new: int = 20) -> None:
    """Beam search after a left-padded batch equals transformers' ``generate`` for ``settings`` (beam counts, length
    penalties, ``early_stopping`` values), with a stop id the model emits."""
    model = from_pretrained(directory)
    ids, mask = left_padded(seq=10, seed=3)
    prompt = dict(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    with torch.no_grad():
        greedy = hf.generate(**prompt, max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    stop = frequent_token(greedy.numpy()[:, ids.shape[1]:])
    for beams, penalty, early in settings:
        with torch.no_grad():
            theirs = hf.generate(**prompt, max_new_tokens=new, do_sample=False, num_beams=beams,
                                 length_penalty=penalty, early_stopping=early, eos_token_id=stop,
                                 pad_token_id=0).numpy()
        ours = np.asarray(models.generate(model, ids, new, attention_mask=mask, num_beams=beams,
                                          length_penalty=penalty, early_stopping=early, eos_token_id=stop))
        assert_same_beams(ours[:, ids.shape[1]:], theirs[:, ids.shape[1]:], stop,
                          model.config.pad_token_id if model.config.pad_token_id is not None else stop)


def checkpoint_fixture(cases: Mapping[str, Callable[[], torch.nn.Module]]):
    """The module fixture ``checkpoint`` of a family test file: ``checkpoint(case)`` → (transformers model, its saved
    directory), each of ``cases`` built (seeded) and saved once."""
    @pytest.fixture(scope="module", name="checkpoint")
    def checkpoint(tmp_path_factory):
        cache = {}

        def get(case):
            if case not in cache:
                torch.manual_seed(0)
                directory = tmp_path_factory.mktemp(case)
                cache[case] = saved_case(cases[case](), directory), directory
            return cache[case]

        return get

    return checkpoint


# ------------------------------------------------------------------------------------------------ layer layouts
# The layout (``scan_layers``: per-layer blocks, or one stacked block run by a scan) changes the backbone's stack only:
# the parity tests run each head in the unrolled layout, and :func:`check_layouts_agree` proves once per family case
# that the scanned layout holds, writes and computes the same.

LAYER = re.compile(r"^(.*\.layers)\.(\d+)\.(.*)$")


def flat_params(model: nnx.Module) -> dict[str, np.ndarray]:
    """``{dotted path: array}`` of the model's parameters."""
    return {".".join(map(str, path)): np.asarray(variable.get_value())
            for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def stacked(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-layer parameters (``….layers.<i>.rest``) stacked on a leading layer axis under ``….layers.rest``, the
    scanned layout's names; the others as they are."""
    layers: dict[str, dict[int, np.ndarray]] = {}
    out = {}
    for name, value in params.items():
        found = LAYER.match(name)
        if found is None:
            out[name] = value
        else:
            layers.setdefault(f"{found[1]}.{found[3]}", {})[int(found[2])] = value
    for name, by_index in layers.items():
        assert sorted(by_index) == list(range(len(by_index))), name
        out[name] = np.stack([by_index[i] for i in range(len(by_index))])
    return out


def saved_tensors(model: nnx.Module, out: pathlib.Path) -> tuple[dict[str, np.ndarray], dict]:
    """The tensors and ``config.json`` that ``save_pretrained(model, out)`` writes."""
    import safetensors.numpy

    directory = save_pretrained(model, out)
    tensors = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(safetensors.numpy.load_file(file))
    return tensors, json.loads((directory / "config.json").read_text())


def check_layouts_agree(directory, out: pathlib.Path, outputs: Callable[[nnx.Module], dict[str, np.ndarray]],
                        mask: np.ndarray, unrolled: nnx.Module | None = None) -> nnx.Module:
    """The scanned layout of ``directory``'s model is the unrolled one: (a) ``from_pretrained(scan_layers=True)``
    holds the unrolled load's parameters, stacked, bit for bit; (b) ``save_pretrained`` of both writes the same
    tensors and ``config.json``; (c) both give the same ``outputs`` (per-token arrays compared on ``mask``'s real
    tokens) within 1e-5. Returns the scanned model (its outputs may then be compared with transformers')."""
    unrolled = unrolled if unrolled is not None else from_pretrained(directory, scan_layers=False)
    scanned = from_pretrained(directory, scan_layers=True)
    assert scanned.config.scan_layers and not unrolled.config.scan_layers
    assert type(scanned) is type(unrolled)
    want, got = stacked(flat_params(unrolled)), flat_params(scanned)
    assert sorted(got) == sorted(want)
    layers = unrolled.config.num_layers
    if not unrolled.config.shared_layers:
        assert any(LAYER.match(name) for name in flat_params(unrolled)), "no per-layer parameter found"
        assert any(".layers." in name and value.shape[0] == layers for name, value in got.items())
    for name, value in got.items():
        np.testing.assert_array_equal(value, want[name], err_msg=name)

    (ours, our_config), (theirs, their_config) = saved_tensors(scanned, out / "scanned"), \
        saved_tensors(unrolled, out / "unrolled")
    assert sorted(ours) == sorted(theirs) and our_config == their_config
    for name, value in ours.items():
        np.testing.assert_array_equal(value, theirs[name], err_msg=name)

    want_out, got_out = outputs(unrolled), outputs(scanned)
    assert sorted(got_out) == sorted(want_out)
    real = mask.astype(bool)
    for name, value in got_out.items():
        expected = want_out[name]
        if value.ndim >= 2 and value.shape[:2] == mask.shape:
            value, expected = value[real], expected[real]
        assert np.isfinite(value).all() and np.abs(expected).max() > 0.01, name
        np.testing.assert_allclose(value, expected, rtol=0, atol=1e-5, err_msg=name)
    return scanned


def tiered(cases, quick) -> list:
    """``sorted(cases)`` as pytest params, those not in ``quick`` marked ``slow`` (the quick tier keeps one case per
    family). A case may be a tuple (several parameters; its id joins them)."""
    assert set(quick) <= set(cases), sorted(set(quick) - set(cases))
    return [pytest.param(*case, id="-".join(map(str, case)), marks=() if case in quick else pytest.mark.slow)
            if isinstance(case, tuple) else pytest.param(case, marks=() if case in quick else pytest.mark.slow)
            for case in sorted(cases)]
