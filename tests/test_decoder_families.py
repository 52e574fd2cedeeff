"""The decoder families against transformers (PyTorch), from the parity cases their folders hold
(``models/families/<name>/parity_cases.py``: ``CASES``, plain data, each case turning on its family's mechanisms):
logits both ways on left-padded batches (the scanned layout proven equal to the unrolled one), and 24 greedy tokens,
past the sliding window where a case has one (``tests/family_parity.py``). A family folder with such a file is tested
here with no change to this file; the family test files (``test_family_*.py``) keep what is particular to a family
(older ``config.json`` spellings, refusals)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any

import pytest
import torch
import transformers

from family_parity import (SMALL, beam_settings, check_beam_generation, check_greedy_generation,
                           check_loads_with_same_logits, check_saves_with_same_logits, check_scanned_layout,
                           checkpoint_fixture, tiered)

from flaxzoo.models import families

CASE_KEYS = {"model", "config", "quick", "settings", "without"}


def folder_cases() -> dict[str, tuple[str, dict[str, Any]]]:
    """``{case: (family folder, case)}`` of every decoder family folder's ``parity_cases.CASES``, checked as they are
    collected: plain data of the known keys, a transformers config of a ``model_type`` the folder registers, one quick
    case at least per folder, no case name twice."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for folder in families.FOLDERS:
        module = f"{folder.__name__}.parity_cases"
        if not all(record.causal for record in folder.RECORDS.values()) or importlib.util.find_spec(module) is None:
            continue
        cases = importlib.import_module(module).CASES
        model_types = {record.model_type for record in folder.RECORDS.values()}
        for case, spec in cases.items():
            assert case not in found, f"{module}: case {case!r} is already {found[case][0]}'s"
            assert set(spec) <= CASE_KEYS and {"model", "config", "quick", "settings"} <= set(spec), (module, case)
            assert getattr(transformers, spec["config"]).model_type in model_types, (module, case)
            found[case] = folder.__name__, spec
        assert any(spec["quick"] for spec in cases.values()), f"{module}: no quick case"
    return found


CASES = folder_cases()
QUICK = [case for case, (_, spec) in CASES.items() if spec["quick"]]  # one case per family or more


def build(spec: dict[str, Any]) -> torch.nn.Module:
    """The case's transformers model: ``SMALL`` less ``without``, updated by ``settings`` (random weights)."""
    settings = {k: v for k, v in SMALL.items() if k not in spec.get("without", ())} | spec["settings"]
    return getattr(transformers, spec["model"])(getattr(transformers, spec["config"])(**settings))


checkpoint = checkpoint_fixture({case: functools.partial(build, spec) for case, (_, spec) in CASES.items()})


@pytest.mark.parametrize("case", tiered(CASES, QUICK))
def test_transformers_checkpoint_gives_same_logits(checkpoint, case):
    check_loads_with_same_logits(*checkpoint(case))


@pytest.mark.parametrize("case", tiered(CASES, QUICK))
def test_saved_model_loads_in_transformers_with_same_logits(checkpoint, case, tmp_path):
    check_saves_with_same_logits(*checkpoint(case), tmp_path / "saved")


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_scanned_layout_equals_the_unrolled_one(checkpoint, case, tmp_path):
    """Stacked parameters, saved tensors and logits of ``scan_layers=True`` equal the unrolled layout's (the one
    both directions above run), and its logits are transformers'."""
    check_scanned_layout(*checkpoint(case), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_generation_equals_transformers(checkpoint, case):
    check_greedy_generation(*checkpoint(case))


@pytest.mark.parametrize("case", tiered(CASES, ("llama3",)))
def test_beam_search_equals_transformers(checkpoint, case):
    """Beam search equals transformers' on every case: 4 settings of beams, length penalty and early stopping on
    llama3, one of them on each other case."""
    check_beam_generation(*checkpoint(case), beam_settings(case, CASES, "llama3"))
