"""The fine-tuning config's checks that belong to one task: ``task="seq2seq"`` (text pairs, and span-corruption
pre-training on plain text) and ``task="tag"`` / ``"qa"`` (CoNLL / SQuAD files). :class:`~flaxzoo.train.finetune.config.
FinetuneConfig` calls them while it validates itself; each takes that config whole and raises ``ConfigError`` naming the
key."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flaxzoo.train.config import ConfigError
from flaxzoo.train.data.span_corruption import input_and_target_lengths

if TYPE_CHECKING:  # the config imports this module
    from flaxzoo.train.finetune.config import FinetuneConfig

SYNTHETIC_PAIRS = "reverse_words"  # task="seq2seq"'s built-in data: word sequences and their reversal
SPAN_CORRUPTION = "span_corruption"  # task="seq2seq" pre-training: T5's denoising objective on plain text
SEQ2SEQ_SOURCES = ("files", SYNTHETIC_PAIRS, SPAN_CORRUPTION)
TFDS_PREFIX = "tfds:"  # task="seq2seq": pairs from a TFDS dataset, "tfds:NAME[/CONFIG][:VERSION]"


def is_tfds(source: str) -> bool:
    return source.startswith(TFDS_PREFIX) and len(source) > len(TFDS_PREFIX)


def check_seq2seq(cfg: FinetuneConfig) -> None:
    """``task="seq2seq"``: source → target pairs in, the settings of a classifier's fresh head refused."""
    data = cfg.data
    if data.source not in SEQ2SEQ_SOURCES and not is_tfds(data.source):
        raise ConfigError("data.source", f"{data.source!r}: task='seq2seq' reads source / target pairs or plain "
                                         "text; expected 'files' (JSONL pairs), 'tfds:NAME' (a TFDS dataset's "
                                         "pairs), 'reverse_words' (the built-in synthetic task) or "
                                         "'span_corruption' (pre-training on text)")
    if data.source == SPAN_CORRUPTION:
        check_span_corruption(cfg)
        if data.pack_pairs:
            raise ConfigError("data.pack_pairs", "True: span corruption's rows are full already (no padding); "
                                                 "expected False")
    else:
        for key in ("noise_density", "mean_noise_span_length"):
            value, default = getattr(data, key), type(data).__dataclass_fields__[key].default
            if value != default:
                raise ConfigError(f"data.{key}", f"{value!r} applies to data.source='span_corruption'; expected "
                                                 f"{default!r} with data.source={data.source!r}")
    if cfg.data.source == "files" and not cfg.data.test_path:
        raise ConfigError("data.test_path", "'': task='seq2seq' scores a test file; expected a JSONL file of "
                                            f"{cfg.data.text_field!r} / {cfg.data.target_field!r} pairs")
    refused = {"freeze_steps": (cfg.freeze_steps, 0), "head_lr": (cfg.head_lr, 0.0),
               "class_weights": (cfg.class_weights, "none"), "optim.layer_decay": (cfg.optim.layer_decay, 1.0),
               "vocab.frequent": (cfg.vocab.frequent, False), "vocab.tokens": (cfg.vocab.tokens, ""),
               "num_labels": (cfg.num_labels, 0)}
    for key, (value, default) in refused.items():
        if value != default:
            raise ConfigError(key, f"{value!r} applies to a classifier's fresh head and its encoder; expected "
                                   f"{default!r} with task='seq2seq' (every parameter of an encoder-decoder "
                                   "trains at optim.lr)")


def check_span_corruption(cfg: FinetuneConfig) -> None:
    """``data.source="span_corruption"``: rows of plain text; the targets' width follows from ``data.max_len``,
    nothing is decoded for a score."""
    data = cfg.data
    try:
        _, targets = input_and_target_lengths(data.max_len, data.noise_density, data.mean_noise_span_length)
    except ValueError as exc:
        raise ConfigError("data.max_len", f"{data.max_len}: {exc}") from None
    default = type(data).__dataclass_fields__["target_max_len"].default
    if data.target_max_len != default:
        raise ConfigError("data.target_max_len", f"{data.target_max_len}: span corruption's targets are "
                                                 f"{targets} pieces wide, set by data.max_len={data.max_len}, "
                                                 f"noise_density and mean_noise_span_length; expected {default} "
                                                 "(unset)")
    for key in ("test_path", "validation_path"):
        if getattr(data, key):
            raise ConfigError(f"data.{key}", f"{getattr(data, key)!r}: span corruption holds out a share of the "
                                             "text's documents (by a hash of each) for its test rows; expected "
                                             "'' (data.train_path names the text files, '' the embedded corpus)")
    if cfg.num_beams != 1:
        raise ConfigError("num_beams", f"{cfg.num_beams}: span corruption is scored by its held-out loss, not "
                                       "decoded; expected 1")


def check_tagging(cfg: FinetuneConfig) -> None:
    """``task="tag"``: CoNLL files in; ``task="qa"``: SQuAD-style JSON files in; the settings that belong to
    texts with one label refused by name."""
    data, task = cfg.data, cfg.task
    files = ("CoNLL files", "(a token and its tag per line, blank lines between sentences)") if task == "tag" else (
        "SQuAD-style JSON files", "(the training and the evaluation questions)")
    if data.source != "files" or not data.test_path:
        key = "data.source" if data.source != "files" else "data.test_path"
        raise ConfigError(key, f"{getattr(data, key.split('.')[1])!r}: task={task!r} reads {files[0]}; expected "
                               f"data.source='files' with data.train_path and data.test_path {files[1]}")
    if task == "qa" and data.validation_path:
        raise ConfigError("data.validation_path", f"{data.validation_path!r}: task='qa' scores data.test_path "
                                                  "(the dev file) at the end; expected ''")
    refused = {"class_weights": (cfg.class_weights, "none"),
               "data.validation_fraction": (data.validation_fraction, 0.0),
               "data.truncation": (data.truncation, "head"), "vocab.frequent": (cfg.vocab.frequent, False),
               "vocab.tokens": (cfg.vocab.tokens, "")}
    for key, (value, default) in refused.items():
        if value != default:
            hint = " (a validation split: data.validation_path)" if (
                key == "data.validation_fraction" and task == "tag") else ""
            raise ConfigError(key, f"{value!r} applies to task='classify' (one label per text); expected "
                                   f"{default!r} with task={task!r}{hint}")
