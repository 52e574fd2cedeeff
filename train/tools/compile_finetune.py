"""The fine-tuner's train step (``task="classify"``, ``task="tag"`` and ``task="qa"``) compiled for compile-only
devices: ``python -m flaxzoo.train.compile``.

The step is the one the fine-tuning task runs (``flaxzoo.train.finetune.trainer.Finetuner`` /
``flaxzoo.train.finetune.tagger.Tagger``): ``flaxzoo.train.step.make_train_step`` with the task's objective
(``classify`` / ``token_classify``) over its model (``BertForSequenceClassification`` /
``BertForTokenClassification``) built from ``init_from``'s config (only its config is read), with the fine-tuning
optimizer (layer decay, the head's own schedule), its parameters replicated and its batch split over every device,
as the fine-tuner places them: ``input_ids``, ``attention_mask`` ``[batch_size, data.max_len]`` and, for
``classify``, ``labels``, ``example_weights`` ``[batch_size]``; for ``tag``, ``labels`` ``[batch_size,
data.max_len]`` (a tag per position); for ``qa``, ``token_type_ids`` ``[batch_size, data.max_len]`` (a model
with segment embeddings) and ``start_positions``, ``end_positions``, ``example_weights`` ``[batch_size]``
(``flaxzoo.train.finetune.qa.QuestionAnswering``, ``objective="span"``). The model class is the family's own for
the task (``flaxzoo.train.finetune.classifier.task_class``), as the fine-tuner's.
No data is read: what depends on it is taken at its bound or a stated default: ``num_labels`` (0: the data's
classes) as ``len(data.label_names)`` or 2 for ``classify``, as :data:`DEFAULT_TAGS` (CoNLL-2003's BIO tags) for
``tag``; ``vocab.frequent`` adds its ``vocab.max_new`` rows; data files the config names are not opened, and a
config that names none (``configs/finetune_ner.py``) compiles all the same.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx
from ml_collections import ConfigDict

from flaxzoo.models.io.sources import open_source
from flaxzoo.models.layers.attention_core import attention_backend
from flaxzoo.models.adapters.lora import apply_lora, frozen_and_trainable
from flaxzoo.train import flops as flopslib
from flaxzoo.train import sharding as shardlib
from flaxzoo.train.finetune.config import SCRATCH, FinetuneConfig
from flaxzoo.train.finetune.classifier import bert_class, packaged_minilm, read_num_layers, task_class
from flaxzoo.train.finetune.qa import QuestionAnswering
from flaxzoo.train.finetune.tagger import Tagger
from flaxzoo.train.finetune.task import FinetuneTask, is_head
from flaxzoo.train.finetune.trainer import Finetuner
from flaxzoo.train.optim import make_finetune_optimizer
from flaxzoo.train.step import make_train_step, new_train_state
from flaxzoo.train.tools.targets import Target

STEPS = 1000  # the schedule's length does not change the compiled step
TASK_CLASSES: dict[str, type[FinetuneTask]] = {"classify": Finetuner, "tag": Tagger, "qa": QuestionAnswering}
MODEL_TASKS = {"classify": "sequence_classification", "tag": "token_classification", "qa": "question_answering"}
DEFAULT_LABELS = 2  # task="classify" with num_labels=0 and no data.label_names
DEFAULT_TAGS = 9  # task="tag" with num_labels=0: CoNLL-2003's BIO tags (O and B- / I- of PER, LOC, ORG, MISC)
NOT_READ = "(not read: compile only)"  # the data path a file-reading config names none of


def without_data(config: ConfigDict) -> dict[str, Any]:
    """``config``'s values with a placeholder for each data file a ``data.source="files"`` task needs but the config
    does not name (``configs/finetune_ner.py`` names none: the files are the user's): the compile opens no file."""
    values = config.to_dict()
    data = values.get("data", {})
    if data.get("source") == "files":
        needed = ("train_path", "test_path") if values.get("task") in ("tag", "qa") else ("train_path",)
        values["data"] = {**data, **{key: data.get(key) or NOT_READ for key in needed}}
    return values


def abstract_batch_shapes(task: str, batch: int, seq: int,
                          token_types: bool = False) -> dict[str, tuple[tuple[int, ...], Any]]:
    """``{key: (shape, dtype)}`` of one training batch of ``task`` as its fine-tuner builds it (``token_types``:
    ``qa``'s batches for a model with segment embeddings carry ``token_type_ids``)."""
    tokens = {"input_ids": ((batch, seq), jnp.int32), "attention_mask": ((batch, seq), jnp.int32)}
    if task == "qa":  # flaxzoo.train.finetune.spans.span_batch
        types = {"token_type_ids": ((batch, seq), jnp.int32)} if token_types else {}
        return {**tokens, **types, "start_positions": ((batch,), jnp.int32), "end_positions": ((batch,), jnp.int32),
                "example_weights": ((batch,), jnp.float32)}
    if task == "tag":  # a tag per position (IGNORE_INDEX where none is scored): flaxzoo.train.finetune.tokens
        return {**tokens, "labels": ((batch, seq), jnp.int32)}
    return {**tokens, "labels": ((batch,), jnp.int32), "example_weights": ((batch,), jnp.float32)}


def compile_finetune(config: ConfigDict, target: Target, devices: list[jax.Device], *,
                     report: Callable[..., Any]) -> tuple[Any, jax.stages.Compiled]:
    """Compile ``config``'s fine-tuning step for ``devices``: ``(report, compiled)``; ``report`` is the function that
    builds ``flaxzoo.train.tools.compile.Report`` (passed in: ``flaxzoo.train.tools.compile`` imports this module)."""
    cfg = FinetuneConfig.from_config_dict(without_data(config))
    task = TASK_CLASSES[cfg.task]
    platform = shardlib.platform_of(devices[0])
    notes = []
    source = cfg.init_from or packaged_minilm()
    if cfg.init_from == SCRATCH:
        model_config = cfg.model
    else:
        model_config, _ = open_source(source).describe()
    model_class = bert_class(MODEL_TASKS[cfg.task]) if cfg.init_from == SCRATCH else task_class(
        model_config, MODEL_TASKS[cfg.task])
    default = DEFAULT_TAGS if cfg.task == "tag" else (len(cfg.data.class_names) or DEFAULT_LABELS)
    labels = 2 if cfg.task == "qa" else cfg.num_labels or default  # qa: the span head's start and end
    if not cfg.num_labels and cfg.task != "qa":
        notes.append(f"num_labels follows the data: compiled with {labels}"
                     + (" (CoNLL-2003's BIO tags; --config.num_labels=N for yours)" if cfg.task == "tag" else ""))
    added = len(cfg.vocab.given) + (cfg.vocab.max_new if cfg.vocab.frequent else 0)
    if added:
        notes.append(f"vocabulary compiled with {added} added rows (vocab.*'s most)")
    # The fine-tuner's rule (FinetuneConfig.execution) for the target's platform: a depth it cannot read before
    # loading (a Hub id) means no remat and unrolled layers.
    depth = model_config.num_layers if cfg.init_from == SCRATCH else read_num_layers(source)
    remat, scan = cfg.execution(depth, platform) if depth else cfg.execution_without_depth()
    dtype = cfg.resolved_dtype(platform)
    model_config = model_config.replace(num_labels=labels, label_names=None, vocab_size=model_config.vocab_size + added,
                                        dtype=dtype, param_dtype="float32", remat=remat, scan_layers=scan,
                                        **({} if cfg.dropout < 0 else {"dropout": cfg.dropout}))
    lora = cfg.lora.spec()
    trainable = frozen_and_trainable(cfg.fully_trained) if lora else nnx.Param

    def build() -> nnx.Module:
        model = model_class(model_config, rngs=nnx.Rngs(cfg.seed))
        return apply_lora(model, lora, seed=cfg.seed) if lora else model

    graphdef, params, rest = nnx.split(nnx.eval_shape(build), trainable, ...)
    params = nnx.to_pure_dict(params)
    tx, schedule = make_finetune_optimizer(cfg.optim, STEPS, params, model_config.num_layers,
                                           freeze_steps=cfg.freeze_steps, is_head=is_head,
                                           head_lr=cfg.head_lr or None)
    rows_axis = len(devices) if cfg.batch_size % len(devices) == 0 else 1
    mesh = shardlib.make_mesh((rows_axis, 1, 1), devices[:rows_axis])
    replicated, rows = shardlib.replicated(mesh), shardlib.batch_sharding(mesh)
    if rows_axis == 1:
        notes.append(f"batch_size={cfg.batch_size} does not divide {len(devices)} devices: one device trains "
                     "(the fine-tuner's rule)")

    def abstract(tree, sharding):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)

    state = abstract(jax.eval_shape(lambda p: new_train_state(p, tx, cfg.seed), params), replicated)
    batch, seq = cfg.batch_size, cfg.data.max_len
    abstract_batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=rows)
                      for k, (shape, dtype) in abstract_batch_shapes(cfg.task, batch, seq,
                                                                     model_config.type_vocab_size > 1).items()}
    step = jax.jit(make_train_step(graphdef, tx, schedule, objective=task.OBJECTIVE,
                                   placement=shardlib.activation_placement(mesh)), donate_argnums=(0,))
    start = time.perf_counter()
    compiled = step.lower(state, abstract(rest, replicated), abstract_batch).compile()
    compile_s = time.perf_counter() - start
    trained = sum(x.size for x in jax.tree.leaves(params)) if lora else None
    per_token = flopslib.flops_per_token(model_config, seq, model_class, trained=trained)
    attention = attention_backend(model_config, q_len=seq, masked=True, training=True, platform=platform,
                                  shared_segments=False)  # attention_mask only: query and key segments differ
    name = "train (fine-tune)" if cfg.task == "classify" else f"train (fine-tune, task={cfg.task})"
    return report(target, name, devices[:rows_axis], mesh, compiled,
                  flops_total=per_token * batch * seq,
                  flops_source="analytic model FLOPs, flaxzoo.train.flops (6N + 12LTd)",
                  tokens=batch * seq, attention=attention, remat=remat, scan_layers=scan, compile_s=compile_s,
                  notes=notes), compiled
