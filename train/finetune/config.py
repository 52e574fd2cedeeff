"""The fine-tuning config: ``configs/finetune_cls.py`` (an ``ml_collections.ConfigDict`` with ``task="classify"``)
turned, once and before any work, into a frozen, typed, validated :class:`FinetuneConfig`.

Keys (``--config.KEY=VALUE``):

- ``init_from``: where the encoder comes from: "" (the packaged all-MiniLM-L6-v2), a Hugging Face BERT / RoBERTa
  directory, a Hub id, a flaxzoo MLM work directory, or ``"scratch"`` (random initialisation from ``model.*``)
- ``tokenizer``: a tokenizer path ("" = ``init_from``'s; required for ``"scratch"``), or for ``"scratch"`` a kind,
  ``"wordpiece"`` or ``"bpe"``: one trained on the training texts, ``model.vocab_size`` pieces at most
- ``epochs``, ``batch_size``, ``eval_batch_size``, ``seed``, ``log_every``, ``num_labels`` (0 = the data's classes;
  another value must agree with them), ``dropout`` (−1 = the checkpoint's)
- ``freeze_steps``: train the head alone (pooler + classifier) for this many steps, then everything (0 = off);
  ``head_lr``: the head's peak learning rate (0 = ``optim.lr``; the backbone's is ``optim.lr``)
- ``class_weights``: ``"none"`` or ``"balanced"`` (weight of class c = n / (classes · n_c), scikit-learn's)
- ``warmup_ratio``: the warmup's share of the steps (``optim.warmup_steps`` is used only when this is 0)
- ``optim.*``: as for pre-training (``flaxzoo.train.config.OptimConfig``), ``optim.layer_decay`` < 1 gives layer-wise LR
  decay (embeddings lowest, the head highest)
- ``precision.*``: pre-training's section (``flaxzoo.train.config.PrecisionConfig``), the same keys with the same
  meaning: ``precision.compute_dtype`` ``auto`` (bfloat16 on GPU / TPU, float32 on CPU), ``float32``, ``bfloat16``
  (bfloat16 keeps float32's exponent range, so its gradients need no loss scaling; ``float16`` is refused, by the
  rules of ``flaxzoo.train.precision``); ``precision.param_dtype`` ``float32`` (the master weights);
  ``precision.remat`` / ``precision.scan_layers`` (``auto`` decides from the backend and the depth:
  :meth:`FinetuneConfig.execution`). ``precision.loss_chunk`` must stay 0 or auto: it chunks a language model's
  vocabulary logits, and a fine-tune's head has none. The top-level ``compute_dtype`` / ``remat`` / ``scan_layers``
  of earlier versions are refused with the key they moved to.
- ``task``: ``"classify"`` (a label per text), ``"tag"`` (a tag per word: CoNLL files), ``"qa"`` (extractive
  question answering: SQuAD-style JSON in ``data.train_path`` / ``data.test_path``, windows of ``data.max_len``
  pieces every ``data.doc_stride`` context pieces, questions cut to ``data.max_query_length`` pieces, answers of at
  most ``data.max_answer_length`` pieces: ``flaxzoo.train.finetune.qa``), ``"seq2seq"`` (an encoder-decoder
  trained on source → target pairs: ``flaxzoo.train.finetune.seq2seq``; ``data.text_field`` / ``data.target_field``
  of JSONL files, targets cut to ``data.target_max_len`` pieces, the test set decoded with ``num_beams`` beams and
  scored by exact match, ROUGE, BLEU and chrF)
- ``data.*``: :class:`ClassifyDataConfig`; ``vocab.*``: :class:`VocabConfig`; ``model.*``: for ``"scratch"`` only,
  as in pre-training (``flaxzoo.train.config.model_fields``)
- ``lora.*``: LoRA, as in pre-training (``flaxzoo.train.config.LoraSettings``: ``rank`` 0 = off, ``alpha``, ``targets``,
  ``base_dtype``, ``train_fully``): the encoder stays frozen (no gradients, no optimizer state) and low-rank
  adapters train on ``targets`` (default ``attention,mlp``). The fresh pooler and classifier always need training:
  ``train_fully`` "" means ``head`` here (``flaxzoo.models.adapters.lora``'s name for the modules outside the encoder's embeddings
  and layers: the pooler and the classifier), and a setting that leaves the classifier frozen is refused.
  ``optim.layer_decay`` scales the
  adapters by their layer as it scales the weights; ``freeze_steps`` trains the head alone first, then the adapters
  (both work with LoRA). Refused with LoRA: ``init_from="scratch"`` (a random encoder has nothing to adapt). The
  checkpoint holds the merged classifier (``flaxzoo.models.adapters.lora.merge_lora``): a plain model, loaded as any other.
- ``eval_every`` (steps; 0 = only at the end): macro-F1 / accuracy on the validation hold-out
  (``data.validation_fraction``), logged with the training rows; ``profile_steps``: "a:b" traces steps a..b into
  ``WORKDIR/profile``, as in pre-training
- ``checkpoint_every`` (steps; 0 = only at the end or a stop), ``keep_checkpoints``: the training state (parameters,
  optimizer state, step, data position) in ``WORKDIR/train_checkpoints/`` (orbax, async), from which a rerun of the
  same command resumes bit for bit; SIGTERM / SIGINT stop after a step with a checkpoint (exit code 75)
- ``mesh.data``, ``mesh.fsdp``, ``mesh.tensor``: the device mesh, as in pre-training (−1 fills the devices; the
  default is every device on ``data``); ``batch_size`` and ``eval_batch_size`` must divide by ``data`` x ``fsdp``
- ``compilation_cache``, ``compilation_cache_dir``
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax
from ml_collections import ConfigDict, FieldReference

from flaxzoo.models import TransformerConfig
from flaxzoo.models.inference.text import TRUNCATION_STRATEGIES
from flaxzoo.train.config import (BOOL, TEXT, ConfigError, LoraSettings, MeshConfig, OptimConfig, PrecisionConfig,
                                  RunConfig, Section, checked, choice, execution_defaults, integer, model_fields,
                                  model_from_values, names_list, number, section_dict)
from flaxzoo.train.data.config import default_data_dir
from flaxzoo.train.data.span_corruption import input_and_target_lengths
from flaxzoo.train.finetune.config_tasks import SPAN_CORRUPTION, SYNTHETIC_PAIRS, check_seq2seq, check_tagging, is_tfds
from flaxzoo.train.finetune.data import SOURCES
from flaxzoo.train.tokenizer import KINDS as TOKENIZER_KINDS

TASK = "classify"
# a label per text (sequence classification); a tag per word (token classification, NER); an answer span per
# question (extractive question answering, SQuAD); a target text per source text (an encoder-decoder)
TASKS = (TASK, "tag", "qa", "seq2seq")
SCRATCH = "scratch"
DATA_SOURCES = (*SOURCES, SYNTHETIC_PAIRS, SPAN_CORRUPTION)
CLASS_WEIGHTS = ("none", "balanced")
# What LoRA fine-tuning trains in full when lora.train_fully is "": flaxzoo.models.adapters.lora's "head", the modules outside the
# encoder's embeddings and layers (for a BertForSequenceClassification: bert.pooler and classifier).
DEFAULT_TRAIN_FULLY = ("head",)
# Top-level keys of earlier versions, now in precision.* (pre-training's names): base_config() keeps each as an unset
# placeholder, so that a config file or --config.KEY=VALUE that still sets one is told where it went.
MOVED_TO_PRECISION = ("compute_dtype", "remat", "scan_layers")


@dataclasses.dataclass(frozen=True)
class ClassifyDataConfig(Section):
    """``data.*``: the labelled texts (``train/finetune/data.py``) and how they become token ids."""

    SECTION: ClassVar[str] = "data"
    source: str = checked("bbc_headlines", TEXT)  # one of DATA_SOURCES, or "tfds:NAME" (task="seq2seq")
    train_path: str = checked("", TEXT)
    test_path: str = checked("", TEXT)
    validation_path: str = checked("", TEXT)  # task="tag": a CoNLL file scored at eval_every and the end
    text_field: str = checked("text", TEXT)
    label_field: str = checked("label", TEXT)
    target_field: str = checked("target", TEXT)  # task="seq2seq": the target text of each source
    target_max_len: int = checked(64, integer(2))  # task="seq2seq": target pieces kept (EOS included)
    # source="span_corruption": the share of each row's tokens hidden and the mean length of a hidden span (T5's)
    # task="seq2seq" on pairs: several training pairs per row while sources fit max_len and targets target_max_len
    pack_pairs: bool = checked(False, BOOL)
    noise_density: float = checked(0.15, number(0.0, 1.0, low_open=True, high_open=True))
    mean_noise_span_length: float = checked(3.0, number(1.0, 1e6))
    label_names: str = checked("", TEXT)  # comma-separated: the classes and their order ("" = the data's, sorted)
    test_fraction: float = checked(0.2, number(0.0, 1.0, low_open=True, high_open=True))
    # a stratified share of the training split held out and scored at the end (for choosing settings: the test
    # split never chooses anything); 0 = none
    validation_fraction: float = checked(0.0, number(0.0, 1.0, high_open=True))
    group_by_length: bool = checked(True, BOOL)
    split_seed: int = checked(0, integer(0))
    data_dir: str = checked("", TEXT)
    max_len: int = checked(128, integer(3))
    truncation: str = checked("head", choice(*TRUNCATION_STRATEGIES))
    head_tokens: int = checked(0, integer(0, note="(0 = a quarter of max_len - 2)"))
    # task="qa" (BERT's run_squad.py settings): context pieces between the starts of a long context's windows, the
    # question's pieces kept, the longest answer predicted (pieces)
    doc_stride: int = checked(128, integer(1))
    max_query_length: int = checked(64, integer(1))
    max_answer_length: int = checked(30, integer(1))

    def _validate(self) -> None:
        if self.source not in DATA_SOURCES and not is_tfds(self.source):
            raise ConfigError("data.source", f"{self.source!r}: expected one of {list(DATA_SOURCES)} or "
                                             "'tfds:NAME' (task='seq2seq')")
        if self.source == "files" and not self.train_path:
            raise ConfigError("data.train_path", "'': source='files' needs a CSV / TSV / JSONL file of labelled texts")
        if self.source not in ("files", SPAN_CORRUPTION) and (self.train_path or self.test_path):
            key = "data.train_path" if self.train_path else "data.test_path"
            raise ConfigError(key, f"{self.train_path or self.test_path!r} is given but data.source="
                                   f"{self.source!r} reads no files; expected data.source='files'")
        if self.head_tokens > self.max_len - 2:
            raise ConfigError("data.head_tokens", f"{self.head_tokens}: expected at most max_len - 2 = "
                                                  f"{self.max_len - 2} (the [CLS] and [SEP] tokens stay)")
        if self.head_tokens and self.truncation != "head_tail":
            raise ConfigError("data.head_tokens", f"{self.head_tokens} is set but data.truncation="
                                                  f"{self.truncation!r} keeps no tail; expected 'head_tail' (or 0)")
        names = names_list(self.label_names)
        if len(set(names)) != len(names):
            raise ConfigError("data.label_names", f"{self.label_names!r} names a class twice")
        if not self.data_dir:
            object.__setattr__(self, "data_dir", default_data_dir())

    @property
    def target_width(self) -> int:
        """The decoder's width in ``task="seq2seq"`` batches: ``target_max_len``, or for span corruption the targets'
        width set by ``max_len``, ``noise_density`` and ``mean_noise_span_length``."""
        if self.source == SPAN_CORRUPTION:
            return input_and_target_lengths(self.max_len, self.noise_density, self.mean_noise_span_length)[1]
        return self.target_max_len

    @property
    def class_names(self) -> tuple[str, ...]:
        return names_list(self.label_names)


@dataclasses.dataclass(frozen=True)
class VocabConfig(Section):
    """``vocab.*``: words added to the tokenizer as whole tokens, their embedding rows the mean of their pieces'.

    ``tokens``: given words (comma-separated); ``frequent``: also every word of the training split seen at least
    ``min_count`` times that the tokenizer cuts into ``min_pieces`` or more pieces (at most ``max_new``, the most
    frequent first)."""

    SECTION: ClassVar[str] = "vocab"
    tokens: str = checked("", TEXT)
    frequent: bool = checked(False, BOOL)
    min_count: int = checked(3, integer(1))
    min_pieces: int = checked(3, integer(2))
    max_new: int = checked(2000, integer(1))

    @property
    def given(self) -> tuple[str, ...]:
        return names_list(self.tokens)

    @property
    def enabled(self) -> bool:
        return self.frequent or bool(self.given)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FinetuneConfig(RunConfig):
    """The whole, checked fine-tuning config: the keys every task has (:class:`~flaxzoo.train.config.RunConfig`)
    and fine-tuning's own."""

    data: ClassifyDataConfig
    vocab: VocabConfig
    model: TransformerConfig | None  # "scratch" only
    mesh: MeshConfig = dataclasses.field(default_factory=lambda: MeshConfig(data=1))
    precision: PrecisionConfig = dataclasses.field(default_factory=PrecisionConfig)
    task: str = checked(TASK, choice(*TASKS))
    tokenizer: str = checked("", TEXT)
    epochs: int = checked(8, integer(1))
    batch_size: int = checked(32, integer(1))
    eval_batch_size: int = checked(128, integer(1))
    num_labels: int = checked(0, integer(0, note="(0 = the number of classes in the data)"))
    dropout: float = checked(-1.0, number(0.0, 1.0, high_open=True, also=(-1.0, -1),
                                          note="(-1 = the checkpoint's)"))
    freeze_steps: int = checked(0, integer(0, note="(0 = train everything from the start)"))
    head_lr: float = checked(0.0, number(0.0, note="(the head's peak LR; 0 = optim.lr)"))
    class_weights: str = checked("none", choice(*CLASS_WEIGHTS))
    warmup_ratio: float = checked(0.1, number(0.0, 1.0))
    eval_every: int = checked(0, integer(0, note="(steps between validation scores; 0 = only at the end)"))
    checkpoint_every: int = checked(50, integer(0, note="(steps between checkpoints; 0 = only at the end or a stop)"))
    keep_checkpoints: int = checked(2, integer(1))
    num_beams: int = checked(1, integer(1, note="(task='seq2seq': beams when decoding the test set; 1 = greedy)"))

    SECTIONS: ClassVar[tuple[str, ...]] = (*RunConfig.SECTIONS, "data", "vocab", "model")

    def _validate(self) -> None:
        if self.precision.loss_chunk not in (0, "auto"):
            raise ConfigError("precision.loss_chunk", f"{self.precision.loss_chunk}: it chunks a language model's "
                                                      "vocabulary logits, and a fine-tune's head has a few per row "
                                                      "or token; expected 0 or 'auto'")
        if self.init_from == SCRATCH and not self.tokenizer:
            raise ConfigError("tokenizer", "'': init_from='scratch' needs a tokenizer path (a folder with "
                                           "tokenizer.json / vocab.txt) or a kind to train on the data "
                                           f"{TOKENIZER_KINDS}")
        if self.tokenizer in TOKENIZER_KINDS and self.init_from != SCRATCH:
            raise ConfigError("tokenizer", f"{self.tokenizer!r} trains a tokenizer for a model from scratch, but "
                                           f"init_from={self.init_from!r} has its own; expected '' (the checkpoint's) "
                                           "or a tokenizer path")
        if self.init_from == SCRATCH and self.model is None:
            raise ConfigError("model", "init_from='scratch' needs model.* (a preset or every field)")
        for key in ("batch_size", "eval_batch_size"):
            self.check_rows(key, getattr(self, key))
        if self.optim.accum_steps != 1:
            raise ConfigError("optim.accum_steps", f"{self.optim.accum_steps}: fine-tuning takes one batch per step; "
                                                   "expected 1 (lower batch_size instead)")
        if self.warmup_ratio and self.optim.warmup_steps:
            raise ConfigError("optim.warmup_steps", f"{self.optim.warmup_steps} and warmup_ratio="
                                                    f"{self.warmup_ratio} are both set; expected one of them (the "
                                                    "other 0)")
        if self.task != "qa":
            for key in ("doc_stride", "max_query_length", "max_answer_length"):
                value, default = getattr(self.data, key), ClassifyDataConfig.__dataclass_fields__[key].default
                if value != default:
                    raise ConfigError(f"data.{key}", f"{value!r} applies to task='qa' (question windows); expected "
                                                     f"{default!r} with task={self.task!r}")
        if self.task == "seq2seq":
            check_seq2seq(self)
        elif self.data.source in (SYNTHETIC_PAIRS, SPAN_CORRUPTION) or is_tfds(self.data.source):
            raise ConfigError("data.source", f"{self.data.source!r} is task='seq2seq''s data; expected "
                                             f"'bbc_headlines' or 'files' with task={self.task!r}")
        elif self.data.pack_pairs:
            raise ConfigError("data.pack_pairs", f"True packs task='seq2seq' pairs; expected False with "
                                                 f"task={self.task!r}")
        elif self.num_beams != 1:
            raise ConfigError("num_beams", f"{self.num_beams}: beams decode task='seq2seq' test sets; expected 1 with "
                                           f"task={self.task!r}")
        if self.task in ("tag", "qa"):
            check_tagging(self)
        elif self.data.validation_path and self.task != "seq2seq":
            raise ConfigError("data.validation_path", f"{self.data.validation_path!r} applies to task='tag'; expected "
                                                      "'' (task='classify' holds out data.validation_fraction)")
        if self.lora.enabled and self.init_from == SCRATCH:
            raise ConfigError("lora.rank", f"{self.lora.rank}: LoRA adapts a pretrained encoder, but init_from="
                                           f"'scratch' starts from random weights; expected lora.rank=0 (train every "
                                           "parameter) or a pretrained init_from")

    @property
    def fully_trained(self) -> tuple[str, ...]:
        """With LoRA, what trains in full beside the adapters: ``lora.train_fully``'s names / module-path regular
        expressions, "" meaning :data:`DEFAULT_TRAIN_FULLY` (the pooler and classifier; nothing for
        ``task="seq2seq"``, whose weights are all pretrained); () without LoRA."""
        if not self.lora.enabled:
            return ()
        if self.task == "seq2seq":  # no fresh head: "" trains the adapters alone
            return self.lora.fully_trained
        return self.lora.fully_trained or DEFAULT_TRAIN_FULLY

    def resolved_dtype(self, backend: str | None = None) -> str:
        """``precision.compute_dtype`` with "auto" decided for ``backend`` (default: JAX's): float32 on CPU,
        bfloat16 on accelerators."""
        if self.precision.compute_dtype != "auto":
            return self.precision.compute_dtype
        return "float32" if (backend or jax.default_backend()) == "cpu" else "bfloat16"

    def execution(self, num_layers: int, backend: str | None = None) -> tuple[str, bool]:
        """``(precision.remat, precision.scan_layers)`` with "auto" decided for ``backend`` (default: JAX's): on CPU
        unrolled layers without remat (MiniLM, batch 32 x 16 tokens, 2-core AMD EPYC: 310-325 ms a step against
        342-381 with dots + scan); on accelerators as for pre-training (``flaxzoo.train.config.execution_defaults``)."""
        backend = backend or jax.default_backend()
        remat, scan = ("none", False) if backend == "cpu" else execution_defaults(backend, num_layers)
        return self._set_or(remat, scan)

    def execution_without_depth(self) -> tuple[str, bool]:
        """``(precision.remat, precision.scan_layers)`` for a checkpoint whose depth is not known before loading (a
        Hub id): the set values, "auto" meaning no remat and unrolled layers."""
        return self._set_or("none", False)

    def _set_or(self, remat: str, scan: bool) -> tuple[str, bool]:
        precision = self.precision
        return (remat if precision.remat == "auto" else precision.remat,
                scan if precision.scan_layers == "auto" else precision.scan_layers)

    def to_json_dict(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, TransformerConfig):
                value = value.to_dict()
            elif dataclasses.is_dataclass(value):
                value = dataclasses.asdict(value)
            out[f.name] = value
        return out

    @classmethod
    def from_config_dict(cls, config: ConfigDict | Mapping[str, Any], device_count: int | None = None
                         ) -> "FinetuneConfig":
        """Check every value; raises :class:`ConfigError` naming the dotted key. ``device_count`` (default: every
        device) fills a −1 mesh axis."""
        values = config.to_dict() if isinstance(config, ConfigDict) else dict(config)
        for key in MOVED_TO_PRECISION:
            if values.get(key) is not None:
                raise ConfigError(key, f"moved to precision.{key} (pre-training's key, the same meaning): set "
                                       f"--config.precision.{key}={values[key]} (config files: "
                                       f"c.precision.{key} = {values[key]!r})")
            values.pop(key, None)
        top = cls.top_level(values)
        optim = OptimConfig.from_values(values.get("optim", {}))
        data = ClassifyDataConfig.from_values(values.get("data", {}))
        vocab = VocabConfig.from_values(values.get("vocab", {}))
        lora = LoraSettings.from_values(values.get("lora", {}))
        mesh = MeshConfig.resolve(values.get("mesh", {"data": -1}),
                                  jax.device_count() if device_count is None else device_count)
        precision = PrecisionConfig.from_values(values.get("precision", {}))
        model = None
        model_values = values.get("model", {})
        if top.get("init_from") == SCRATCH:
            model, _ = model_from_values(model_values)
        else:
            given = sorted(k for k, v in model_values.items() if v not in (None, ""))
            if given:
                raise ConfigError(f"model.{given[0]}", f"{model_values[given[0]]!r} is set but init_from="
                                                       f"{top.get('init_from', '')!r} loads its architecture from the "
                                                       "checkpoint; model.* applies to init_from='scratch' only")
        return cls(optim=optim, data=data, vocab=vocab, model=model, lora=lora, mesh=mesh, precision=precision, **top)


def base_config() -> ConfigDict:
    """Every fine-tuning key with its default; ``configs/finetune_cls.py`` starts from this."""
    c = ConfigDict()
    for name, value in FinetuneConfig.defaults().items():
        c[name] = value
    c.optim = section_dict(OptimConfig)
    c.optim.warmup_steps = 0  # warmup_ratio instead: the number of steps is known once the data is
    c.data = section_dict(ClassifyDataConfig)
    c.vocab = section_dict(VocabConfig)
    c.model = model_fields("")
    c.lora = section_dict(LoraSettings)
    c.mesh = section_dict(MeshConfig)
    c.precision = section_dict(PrecisionConfig)
    for key in MOVED_TO_PRECISION:  # unset: FinetuneConfig.from_config_dict names precision.KEY when one is set
        c[key] = FieldReference(None, field_type=object)
    return c

