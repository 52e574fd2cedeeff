"""Shared checks of an encoder family / head against transformers (PyTorch), for the encoder family test files: every
output of a class on a right-padded batch (with token types where the family has them), both ways (transformers →
flaxzoo ``from_pretrained``; flaxzoo ``save_pretrained`` → transformers), in the unrolled layout; the scanned layout
is proven equal to it once per family (:func:`check_encoder_layouts`: parameters, saved tensors, outputs, and the
scanned outputs against transformers').

A test builds a random transformers model (``perturbed`` so that biases and norms are not at their init) and calls
:func:`check_both_ways`; the outputs compared are the head's (``logits``, ``start_logits`` / ``end_logits``) or the base
model's ``last_hidden_state`` (and ``pooler_output`` when there is one), on real tokens only."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

from flaxzoo.models.io import from_pretrained, save_pretrained
from tests.family_parity import check_layouts_agree, perturbed

ATOL = 1e-4
transformers.logging.set_verbosity_error()


def right_padded(vocab: int, seq: int = 12, seed: int = 0, pad_id: int = 0, first_id: int = 3
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Three rows of ids in ``[first_id, vocab)``: the second right-padded by 5, the third by 2 (``pad_id``, mask
    0)."""
    ids = np.random.RandomState(seed).randint(first_id, vocab, (3, seq)).astype(np.int64)
    mask = np.ones((3, seq), np.int64)
    for row, pad in ((1, 5), (2, 2)):
        ids[row, seq - pad:], mask[row, seq - pad:] = pad_id, 0
    return ids, mask


def token_types(mask: np.ndarray) -> np.ndarray:
    """Sentence-pair token types: 0 for the first half of each row, 1 after (0 on padding)."""
    types = np.zeros_like(mask)
    types[:, mask.shape[1] // 2:] = 1
    return types * mask


def hf_outputs(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None
               ) -> dict[str, np.ndarray]:
    """The outputs transformers' ``model`` gives (the ones flaxzoo's classes return)."""
    kwargs = dict(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    if types is not None:
        kwargs["token_type_ids"] = torch.from_numpy(types)
    with torch.no_grad():
        out = model(**kwargs)
    found = {}
    for name in ("logits", "start_logits", "end_logits", "last_hidden_state", "pooler_output"):
        value = getattr(out, name, None)
        if value is not None:
            found[name] = value.float().numpy()
    return found


@nnx.jit
def _forward(model, ids, mask, types):
    return model(ids, mask, types) if types is not None else model(ids, mask)


def flax_outputs(model: nnx.Module, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None
                 ) -> dict[str, np.ndarray]:
    """flaxzoo's outputs under transformers' names: a plain array is ``logits``; a named tuple gives its fields."""
    out = _forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32),
                   None if types is None else jnp.asarray(types, jnp.int32))
    if isinstance(out, jax.Array):
        return {"logits": np.asarray(out)}
    return {name: np.asarray(value) for name, value in out._asdict().items()
            if isinstance(value, jax.Array)}


def max_difference(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray], mask: np.ndarray) -> float:
    """The largest |Δ| over the outputs both give, on real tokens (per-token outputs) or rows (pooled ones).
    Asserts that every output transformers gives is compared, finite, and not trivially small."""
    assert set(theirs) <= set(ours), (sorted(theirs), sorted(ours))
    worst = 0.0
    real = mask.astype(bool)
    for name, expected in theirs.items():
        got = ours[name]
        assert got.shape == expected.shape, (name, got.shape, expected.shape)
        if got.ndim >= 2 and got.shape[:2] == mask.shape:  # per token: real tokens only
            got, expected = got[real], expected[real]
        assert np.isfinite(got).all(), name
        assert np.abs(expected).max() > 0.01, name
        worst = max(worst, float(np.abs(got - expected).max()))
    return worst


def check_both_ways(hf: torch.nn.Module, directory, out, *, auto: type, scan: bool = False, with_types: bool = True,
                    pad_id: int = 0, seq: int = 12, first_id: int = 3) -> tuple[float, float]:
    """``hf`` perturbed and saved to ``directory``; flaxzoo's ``from_pretrained`` (stacked layers with ``scan``)
    gives its outputs, and flaxzoo's ``save_pretrained`` to ``out`` loads with ``auto`` (a transformers Auto class)
    as the same class with flaxzoo's outputs. Returns (|Δ| transformers → flaxzoo, |Δ| flaxzoo → transformers),
    each asserted ≤ 1e-4."""
    hf = perturbed(hf)
    hf.save_pretrained(directory)
    vocab = hf.config.vocab_size
    ids, mask = right_padded(vocab, seq=seq, pad_id=pad_id, first_id=first_id)
    types = token_types(mask) if with_types else None
    model = from_pretrained(directory, scan_layers=scan)
    assert model.config.model_type == hf.config.model_type
    loaded = max_difference(flax_outputs(model, ids, mask, types), hf_outputs(hf, ids, mask, types), mask)
    assert loaded <= ATOL, loaded
    again = auto.from_pretrained(save_pretrained(model, out)).eval()
    assert type(again) is type(hf), (type(again), type(hf))
    ids, mask = right_padded(vocab, seq=seq, seed=1, pad_id=pad_id, first_id=first_id)
    types = token_types(mask) if with_types else None
    saved = max_difference(flax_outputs(model, ids, mask, types), hf_outputs(again, ids, mask, types), mask)
    assert saved <= ATOL, saved
    return loaded, saved


def check_encoder_layouts(hf: torch.nn.Module, directory, out, *, with_types: bool = True, pad_id: int = 0,
                          seq: int = 12, first_id: int = 3) -> float:
    """``hf`` perturbed and saved to ``directory``: the scanned layout equals the unrolled one
    (:func:`tests.family_parity.check_layouts_agree`: stacked parameters, saved tensors and ``config.json``, every
    output on a right-padded batch), and its outputs are transformers' (|Δ| ≤ 1e-4, returned)."""
    hf = perturbed(hf)
    hf.save_pretrained(directory)
    ids, mask = right_padded(hf.config.vocab_size, seq=seq, pad_id=pad_id, first_id=first_id)
    types = token_types(mask) if with_types else None
    scanned = check_layouts_agree(directory, pathlib.Path(out), lambda m: flax_outputs(m, ids, mask, types), mask)
    worst = max_difference(flax_outputs(scanned, ids, mask, types), hf_outputs(hf, ids, mask, types), mask)
    assert worst <= ATOL, worst
    return worst
