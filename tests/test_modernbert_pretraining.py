"""Masked-LM pre-training of the ModernBERT-shaped preset (``configs/modernbert_tiny.py``) on the embedded corpus:
40 steps of a tiny model (hidden 32, 2 layers: a global one and a bidirectional-window one narrower than the rows)
lower the masked-token loss. The batches are packed rows of documents with ``segment_ids``."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys

import jax
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from train_helper import overrides, run_steps  # noqa: E402

CONFIG = pathlib.Path(__file__).resolve().parent.parent / "configs" / "modernbert_tiny.py"


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from flaxzoo.train.pretrain import Trainer

    spec = importlib.util.spec_from_file_location("modernbert_tiny", CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    base = tmp_path_factory.mktemp("modernbert")
    values = overrides("bert", str(base / "data"), **{"model.sliding_window": 5, "optim.lr": 3e-3,
                                                                  "seq_len": 64})
    for key, value in values.items():
        node = config
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return Trainer(config, str(base / "work"), devices=jax.devices()[:1])


@pytest.mark.slow
def test_masked_lm_loss_falls(trainer):
    assert trainer.model_cls.__name__ == "ModernBertForMaskedLM"
    config = trainer.model_config
    assert (config.model_type, config.sliding_window, config.sliding_layers) == ("modernbert", 5, (False, True))
    iterator = trainer.train_iterator()
    segments = np.concatenate([next(iterator)["segment_ids"] for _ in range(4)])
    print(f"packed rows: {len(segments)}, most segments in a row {segments.max()}, real-token share "
          f"{(segments > 0).mean():.2f}")
    assert segments.max() >= 2  # packed rows: several documents / sentence groups share a row
    _, losses = run_steps(trainer, 40)
    first, last = float(np.mean(losses[:5])), float(np.mean(losses[-5:]))
    print(f"modernbert-tiny masked-LM loss: first 5 steps {first:.3f}, last 5 {last:.3f} (ln V = "
          f"{math.log(512):.3f})")
    assert all(math.isfinite(x) for x in losses)
    assert last < first - 0.3
