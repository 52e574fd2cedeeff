"""Every encoder family folder's small test configs (``models/families/<name>/parity_cases.py``: ``SMALL_CONFIGS``,
plain data), gathered for the tests that run every encoder family (``tests/test_every_encoder.py``,
``tests/test_finetune_families.py``): a new encoder folder is tested with no edit here."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from flaxzoo.models import families

KEYS = {"sizes", "settings", "mechanisms"}


def folder_configs() -> dict[str, dict[str, Any]]:
    """``{model_type: {"sizes", "settings", "mechanisms"}}`` of every encoder folder, checked as gathered: a folder
    states one entry for each ``model_type`` it registers, with the known keys only."""
    found: dict[str, dict[str, Any]] = {}
    for folder in families.FOLDERS:
        records = folder.RECORDS.values()
        if any(record.causal for record in records):
            continue
        module = f"{folder.__name__}.parity_cases"
        assert importlib.util.find_spec(module) is not None, f"{module}: an encoder folder states SMALL_CONFIGS there"
        configs = importlib.import_module(module).SMALL_CONFIGS
        model_types = {record.model_type for record in records}
        assert set(configs) == model_types, f"{module}: SMALL_CONFIGS has {sorted(configs)}, the folder registers " \
                                            f"{sorted(model_types)}"
        for model_type, spec in configs.items():
            assert set(spec) <= KEYS, f"{module}: {model_type}'s keys {sorted(spec)}, expected some of {sorted(KEYS)}"
            found[model_type] = {"sizes": {}, "settings": {}, "mechanisms": ()} | spec
    return found


SMALL_CONFIGS = folder_configs()


def hf_config_kwargs(model_type: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``model_type``'s transformers config: ``sizes`` under the family's names, then its
    settings."""
    spec = SMALL_CONFIGS[model_type]
    return {spec["sizes"].get(key, key): value for key, value in sizes.items()} | spec["settings"]
