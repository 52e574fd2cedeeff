"""The fine-tuner's train step (``task="classify"``, ``task="tag"`` and ``task="qa"``) compiled for compile-only
devices: ``python -m flaxzoo.train.compile``.

The step is the one the fine-tuning task runs: the same step program
(``flaxzoo.train.finetune.task.finetune_program``, a ``flaxzoo.train.program.StepProgram``) with the task's objective
(``classify`` / ``token_classify`` / ``span``) over its model (the family's own class for the task,
``flaxzoo.train.finetune.classifier.task_class``) built from ``init_from``'s config (only its config is read), with
the fine-tuning optimizer (layer decay, the head's own schedule), its parameters replicated and its batch split over
every device, as the fine-tuner places them (``flaxzoo.train.finetune.task.batch_shapes``: ``input_ids``,
``attention_mask`` ``[batch_size, data.max_len]`` and, for ``classify``, ``labels``, ``example_weights``
``[batch_size]``; for ``tag``, ``labels`` ``[batch_size, data.max_len]``; for ``qa``, ``token_type_ids`` (a model
with segment embeddings) and ``start_positions``, ``end_positions``, ``example_weights`` ``[batch_size]``).
No data is read: what depends on it is taken at its bound or a stated default: ``num_labels`` (0: the data's
classes) as ``len(data.label_names)`` or 2 for ``classify``, as :data:`DEFAULT_TAGS` (CoNLL-2003's BIO tags) for
``tag``; ``vocab.frequent`` adds its ``vocab.max_new`` rows; data files the config names are not opened, and a
config that names none (``configs/finetune_ner.py``) compiles all the same.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
from ml_collections import ConfigDict

from flaxzoo.models.io.sources import open_source
from flaxzoo.models.layers.attention_core import attention_backend
from flaxzoo.train import flops as flopslib
from flaxzoo.train import sharding as shardlib
from flaxzoo.train.finetune.config import SCRATCH, FinetuneConfig
from flaxzoo.train.finetune.classifier import bert_class, packaged_minilm, read_num_layers, task_class
from flaxzoo.models.families import family_of
from flaxzoo.train.finetune.qa import QuestionAnswering
from flaxzoo.train.finetune.seq2seq import Seq2SeqTrainer
from flaxzoo.train.finetune.tagger import Tagger
from flaxzoo.train.finetune.task import FinetuneTask, finetune_program
from flaxzoo.train.finetune.trainer import Finetuner
from flaxzoo.train.tools.targets import Target

STEPS = 1000  # the schedule's length does not change the compiled step
TASK_CLASSES: dict[str, type[FinetuneTask]] = {"classify": Finetuner, "tag": Tagger, "qa": QuestionAnswering,
                                                "seq2seq": Seq2SeqTrainer}
MODEL_TASKS = {"classify": "sequence_classification", "tag": "token_classification", "qa": "question_answering",
               "seq2seq": "seq2seq_lm"}
DEFAULT_LABELS = 2  # task="classify" with num_labels=0 and no data.label_names
DEFAULT_TAGS = 9  # task="tag" with num_labels=0: CoNLL-2003's BIO tags (O and B- / I- of PER, LOC, ORG, MISC)
NOT_READ = "(not read: compile only)"  # the data path a file-reading config names none of


def without_data(config: ConfigDict) -> dict[str, Any]:
    """``config``'s values with a placeholder for each data file a ``data.source="files"`` task needs but the config
    does not name (``configs/finetune_ner.py`` names none: the files are the user's): the compile opens no file."""
    values = config.to_dict()
    data = values.get("data", {})
    if data.get("source") == "files":
        needed = ("train_path", "test_path") if values.get("task") in ("tag", "qa", "seq2seq") else ("train_path",)
        values["data"] = {**data, **{key: data.get(key) or NOT_READ for key in needed}}
    return values


def seq2seq_attention(config, source_len: int, target_len: int, platform: str) -> tuple[str, str]:
    """The cores an encoder-decoder's step runs: the encoder's self-attention (padded sources), the decoder's
    (causal, padded targets) and the cross-attention (targets over sources), as one report entry."""
    encoder = attention_backend(config.encoder_config(), q_len=source_len, masked=True, training=True,
                                platform=platform, shared_segments=False)
    decoder = attention_backend(config.decoder_config(), q_len=target_len, masked=True, training=True,
                                platform=platform)
    unbiased = config.encoder_config().replace(position_bias_buckets=None, position_bias_per_layer=False)
    cross = attention_backend(unbiased, q_len=target_len, k_len=source_len, masked=True,
                              training=True, platform=platform, shared_segments=False)
    kinds = dict.fromkeys(kind for kind, _ in (encoder, decoder, cross))
    return "/".join(kinds), (f"encoder self-attention: {encoder[0]} ({encoder[1]}); decoder self-attention: "
                             f"{decoder[0]} ({decoder[1]}); cross-attention: {cross[0]} ({cross[1]})")


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
    if cfg.task == "seq2seq":  # the encoder-decoder family's own class, from scratch or not
        model_class = family_of(model_config.model_type).class_for(MODEL_TASKS[cfg.task])
        if model_class is None:
            raise ValueError(f"{model_config.model_type!r} has no encoder-decoder class: task='seq2seq' trains T5, "
                             "mT5, umT5 or BART models")
    else:
        model_class = bert_class(MODEL_TASKS[cfg.task]) if cfg.init_from == SCRATCH else task_class(
            model_config, MODEL_TASKS[cfg.task])
    default = DEFAULT_TAGS if cfg.task == "tag" else (len(cfg.data.class_names) or DEFAULT_LABELS)
    # qa: the span head's start and end; seq2seq: no labels (the config's value stays)
    labels = {"qa": 2, "seq2seq": model_config.num_labels}.get(cfg.task, cfg.num_labels or default)
    if not cfg.num_labels and cfg.task not in ("qa", "seq2seq"):
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
    rows_axis = len(devices) if cfg.batch_size % len(devices) == 0 else 1
    mesh = shardlib.make_mesh((rows_axis, 1, 1), devices[:rows_axis])
    if rows_axis == 1:
        notes.append(f"batch_size={cfg.batch_size} does not divide {len(devices)} devices: one device trains "
                     "(the fine-tuner's rule)")
    program = finetune_program(cfg, model_config, model_class, mesh, STEPS, objective=task.OBJECTIVE)
    batch, seq = cfg.batch_size, cfg.data.max_len
    start = time.perf_counter()
    compiled = program.lower_train_step().compile()
    compile_s = time.perf_counter() - start
    trained = program.trainable_count if program.lora is not None else None
    if cfg.task == "seq2seq":
        target_len = cfg.data.target_width
        flops = batch * flopslib.encoder_decoder_flops(model_config, seq, target_len, model_class)
        attention = seq2seq_attention(model_config, seq, target_len, platform)
        counted = "analytic model FLOPs per stack, flaxzoo.train.flops.encoder_decoder_flops (6N per token + 12 h d "
        counted += "per query-key pair); tokens: the sources'"
    else:
        flops = batch * seq * flopslib.flops_per_token(model_config, seq, model_class, trained=trained)
        counted = "analytic model FLOPs, flaxzoo.train.flops (6N + 12LTd)"
        attention = attention_backend(model_config, q_len=seq, masked=True, training=True, platform=platform,
                                      shared_segments=False)  # attention_mask only: query and key segments differ
    name = "train (fine-tune)" if cfg.task == "classify" else f"train (fine-tune, task={cfg.task})"
    return report(target, name, devices[:rows_axis], mesh, compiled,
                  flops_total=flops,
                  flops_source=counted,
                  tokens=batch * seq, attention=attention, remat=remat, scan_layers=scan, compile_s=compile_s,
                  notes=notes), compiled
