"""Text-to-text fine-tuning of an encoder-decoder (T5, Flan-T5, mT5, umT5, BART) on the fine-tuning task:
``task="seq2seq"`` (``configs/seq2seq_reverse.py``).

Everything but the data and the scores is every fine-tune's (``FinetuneTask``: the one training loop's checkpoints,
resume, meshes, several processes, LoRA). What differs:

- the data: JSONL files of pairs (``data.train_path``, ``data.test_path``, optionally ``data.validation_path``; the
  fields ``data.text_field`` → ``data.target_field``), a TFDS dataset's (``data.source="tfds:NAME"``, prepared in
  ``data.data_dir``), or ``data.source="reverse_words"``: a synthetic task built
  here (a few common words in a random order → the same words reversed), the same pairs on every run;
- teacher forcing: the sources cut to ``data.max_len`` pieces by the tokenizer (its special tokens kept: T5's EOS),
  the targets to ``data.target_max_len`` pieces ending in the model's EOS; the decoder reads the target shifted right
  behind ``decoder_start_token_id``; padding is never scored (``train/losses.py``'s ``seq2seq``); with
  ``data.pack_pairs`` several training pairs share a row (segment ids on both sides, packed once in a seeded order);
- the scores: the test sources decoded (``models.generate``: greedy, or ``num_beams`` beams) until EOS or
  ``data.target_max_len`` new tokens, then exact match (after collapsing whitespace), ROUGE-1 / 2 / L F-measures
  (Google's ``rouge-score``, stemmed), BLEU and chrF (``sacrebleu``'s corpus scores), all as percentages, in
  ``eval/metrics.json``; every test pair with its prediction in ``eval/predictions.jsonl``.
"""

from __future__ import annotations

import pathlib
from typing import Any, Iterator, Sequence

import jax
import numpy as np
from flax import nnx

from flaxzoo.models.architectures.encoder_decoder.model import Seq2SeqForConditionalGeneration
from flaxzoo.models.inference.generate import generate
from flaxzoo.models.inference.text import plain_tokenizer, truncating_tokenizer
from flaxzoo.train.batches import IGNORE_INDEX
from flaxzoo.train.config import ConfigError
from flaxzoo.train.data.corpus import jsonl_objects
from flaxzoo.train.data.rows import next_fit
from flaxzoo.train.finetune.config import FinetuneConfig
from flaxzoo.train.finetune.config_tasks import SYNTHETIC_PAIRS, TFDS_PREFIX, is_tfds
from flaxzoo.train.finetune.task import FinetuneTask
from flaxzoo.train.hooks import say
from flaxzoo.train.tokenizer import KINDS as TOKENIZER_KINDS

# The synthetic task's words: common English words each tokenizer here keeps whole.
REVERSE_WORDS = ("red", "blue", "green", "black", "white", "cat", "dog", "bird", "fish", "tree", "house", "car",
                 "one", "two", "three", "four", "five", "six", "seven", "eight", "sun", "moon", "star", "sea")
REVERSE_SIZES = {"train": 4000, "validation": 200, "test": 400}


def reverse_word_pairs(count: int, seed: int, lengths: tuple[int, int] = (3, 8)) -> list[tuple[str, str]]:
    """``count`` pairs ``("w1 w2 ... wn", "wn ... w2 w1")`` of ``n`` in ``lengths`` (inclusive) words drawn from
    :data:`REVERSE_WORDS` with ``seed``."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        words = rng.choice(REVERSE_WORDS, size=int(rng.integers(lengths[0], lengths[1] + 1))).tolist()
        pairs.append((" ".join(words), " ".join(reversed(words))))
    return pairs


def read_pairs(path: str, source_field: str, target_field: str) -> list[tuple[str, str]]:
    """The ``(source, target)`` strings of a JSONL file; ValueError naming the file and line of a pair that lacks a
    field or holds something other than text."""
    pairs = []
    for lineno, record in jsonl_objects(pathlib.Path(path).read_text(encoding="utf-8"), path):
        values = []
        for field in (source_field, target_field):
            value = record.get(field)
            if not isinstance(value, str):
                raise ValueError(f"{path}:{lineno}: {field!r} is {value!r}; expected a string (data.text_field / "
                                 "data.target_field name the source and target fields)")
            values.append(value)
        pairs.append(tuple(values))
    if not pairs:
        raise ValueError(f"{path}: no pairs; expected JSON lines with {source_field!r} and {target_field!r}")
    return pairs


def tfds_pairs(data: Any) -> tuple[dict[str, list[tuple[str, str]]], str]:
    """``data.source="tfds:NAME"``'s ``(source, target)`` strings per split (``data.text_field`` →
    ``data.target_field``) and their description: the dataset prepared in ``data.data_dir`` (array_record; downloaded
    the first time), read by random access; ``train``, ``test`` (else its ``validation``) and ``validation`` (when it
    has both)."""
    from flaxzoo.train.data.builders import prepare_builder, quiet_tfds

    import tensorflow_datasets as tfds

    name = data.source[len(TFDS_PREFIX):]
    with quiet_tfds():
        builder = tfds.builder(name, data_dir=data.data_dir, file_format="array_record")
        prepare_builder(builder)
    splits = builder.info.splits
    chosen = {"train": "train", "test": "test" if "test" in splits else "validation"}
    if "test" in splits and "validation" in splits:
        chosen["validation"] = "validation"
    missing = [split for split in dict.fromkeys(chosen.values()) if split not in splits]
    if missing:
        raise ValueError(f"{data.source}: no {' / '.join(missing)} split (it has {sorted(splits)}); expected train "
                         "and test (or validation) splits")
    features = builder.info.features
    for field in (data.text_field, data.target_field):
        if field not in features:
            raise ValueError(f"{data.source}: no feature {field!r} (data.text_field / data.target_field); expected "
                             f"one of {sorted(features.keys())}")

    def text(value: Any) -> str:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)

    pairs = {}
    for split, name_in_tfds in chosen.items():
        source = builder.as_data_source(name_in_tfds)
        pairs[split] = [(text(row[data.text_field]), text(row[data.target_field])) for row in source]
    description = (f"{data.source} in {data.data_dir}: " + ", ".join(f"{split} = its {name_in_tfds}"
                                                                     for split, name_in_tfds in chosen.items()))
    return pairs, description


def normalised(text: str) -> str:
    return " ".join(text.split())


def text_scores(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Exact match, ROUGE-1 / 2 / L (mean F-measure, stemmed), corpus BLEU and chrF, each in percent."""
    import sacrebleu
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    rouge = [scorer.score(reference, prediction) for prediction, reference in zip(predictions, references)]
    scores = {"exact_match": 100.0 * float(np.mean([normalised(p) == normalised(r)
                                                      for p, r in zip(predictions, references)]))}
    for name in ("rouge1", "rouge2", "rougeL"):
        scores[name] = 100.0 * float(np.mean([score[name].fmeasure for score in rouge]))
    scores["bleu"] = float(sacrebleu.corpus_bleu(list(predictions), [list(references)]).score)
    scores["chrf"] = float(sacrebleu.corpus_chrf(list(predictions), [list(references)]).score)
    return scores


def pair_batch(pairs: Sequence[tuple[list[int], list[int]]], *, pad_id: int, start_id: int, max_len: int,
               target_max_len: int) -> dict[str, np.ndarray]:
    """Encoded pairs as one teacher-forcing batch: sources ``[rows, max_len]`` (``input_ids``, ``attention_mask``),
    targets ``[rows, target_max_len]``: ``labels`` (``IGNORE_INDEX`` in padding), ``decoder_input_ids`` (the
    labels shifted right behind ``start_id``) and ``decoder_attention_mask``."""
    rows = len(pairs)
    batch = {"input_ids": np.full((rows, max_len), pad_id, np.int32),
             "attention_mask": np.zeros((rows, max_len), np.int32),
             "labels": np.full((rows, target_max_len), IGNORE_INDEX, np.int32)}
    for row, (source, target) in enumerate(pairs):
        batch["input_ids"][row, :len(source)] = source
        batch["attention_mask"][row, :len(source)] = 1
        batch["labels"][row, :len(target)] = target
    real = batch["labels"] != IGNORE_INDEX
    shifted = np.concatenate([np.full((rows, 1), start_id, np.int32),
                              np.where(real, batch["labels"], pad_id)[:, :-1]], axis=1)
    batch["decoder_input_ids"] = shifted
    batch["decoder_attention_mask"] = np.concatenate([np.ones((rows, 1), np.int32), real[:, :-1]], axis=1)
    return batch


def pack_pairs(pairs: Sequence[tuple[list[int], list[int]]], max_len: int,
               target_max_len: int) -> list[list[tuple[list[int], list[int]]]]:
    """Pairs in their order into rows: a pair joins the current row while its source fits ``max_len`` and its target
    ``target_max_len`` beside the row's others, else it starts the next row (next-fit)."""
    sizes = [(len(source), len(target)) for source, target in pairs]
    return [[pairs[i] for i in row] for row in next_fit(sizes, (max_len, target_max_len))]


def packed_pair_batch(rows: Sequence[Sequence[tuple[list[int], list[int]]]], *, pad_id: int, start_id: int,
                      max_len: int, target_max_len: int) -> dict[str, np.ndarray]:
    """Rows of several pairs (:func:`pack_pairs`) as one teacher-forcing batch: :func:`pair_batch`'s arrays with
    ``segment_ids [rows, max_len]`` and ``decoder_segment_ids [rows, target_max_len]`` numbering each row's pairs
    from 1 (0: padding), each target shifted right behind ``start_id`` on its own. The model reads a target token
    against its own pair's source and earlier target tokens only, positions restarting per pair."""
    count = len(rows)
    batch = {"input_ids": np.full((count, max_len), pad_id, np.int32),
             "segment_ids": np.zeros((count, max_len), np.int32),
             "labels": np.full((count, target_max_len), IGNORE_INDEX, np.int32),
             "decoder_input_ids": np.full((count, target_max_len), pad_id, np.int32),
             "decoder_segment_ids": np.zeros((count, target_max_len), np.int32)}
    for r, row in enumerate(rows):
        source_at = target_at = 0
        for number, (source, target) in enumerate(row, 1):
            source_end, target_end = source_at + len(source), target_at + len(target)
            batch["input_ids"][r, source_at:source_end] = source
            batch["segment_ids"][r, source_at:source_end] = number
            batch["labels"][r, target_at:target_end] = target
            batch["decoder_input_ids"][r, target_at:target_end] = [start_id, *target[:-1]]
            batch["decoder_segment_ids"][r, target_at:target_end] = number
            source_at, target_at = source_end, target_end
    batch["attention_mask"] = (batch["segment_ids"] != 0).astype(np.int32)
    batch["decoder_attention_mask"] = (batch["decoder_segment_ids"] != 0).astype(np.int32)
    return batch


class Seq2SeqTrainer(FinetuneTask):
    """One text-to-text fine-tune; :meth:`run` trains (or resumes), decodes and scores the test set, and exports."""

    MODEL = Seq2SeqForConditionalGeneration
    OBJECTIVE = "seq2seq"
    make_predict = None  # the scores decode with models.generate
    HEADLINE = "exact_match"
    FRESH_HEAD = False

    def __init__(self, cfg: FinetuneConfig, workdir: str | pathlib.Path):
        super().__init__(cfg, workdir)
        if self.finished:
            return
        for name in ("decoder_start_token_id", "eos_token_id", "pad_token_id"):
            if getattr(self.config, name) is None:
                raise ConfigError(f"model.{name}", f"None: task='seq2seq' needs the model's {name}")
        if not self.config.is_encoder_decoder:
            raise ConfigError("init_from", f"{cfg.init_from or cfg.model.model_type!r} is no encoder-decoder; "
                                           "task='seq2seq' trains T5, mT5, umT5 or BART models")
        if cfg.tokenizer in TOKENIZER_KINDS:  # trained here: its special tokens are the only ids the model may name
            specials = {token.content: i for i, token in self.tokenizer.get_added_tokens_decoder().items()
                        if token.special}
            for name in ("eos_token_id", "pad_token_id", "decoder_start_token_id"):
                if getattr(self.config, name) not in specials.values():
                    raise ConfigError(f"model.{name}", f"{getattr(self.config, name)}: the {cfg.tokenizer} tokenizer "
                                                       f"trained on the data has the special tokens {specials}; "
                                                       "expected one of their ids")

    # ------------------------------------------------------------------------------------------------ data
    def _load_data(self) -> None:
        data = self.cfg.data
        if data.source == SYNTHETIC_PAIRS:
            self.pairs = {split: reverse_word_pairs(size, seed=data.split_seed * 3 + i)
                          for i, (split, size) in enumerate(REVERSE_SIZES.items())}
            self.split_description = (f"{SYNTHETIC_PAIRS}: {REVERSE_SIZES} pairs, seed {data.split_seed}, words "
                                      f"{len(REVERSE_WORDS)}")
        elif is_tfds(data.source):
            self.pairs, self.split_description = tfds_pairs(data)
        else:
            paths = {"train": data.train_path, "test": data.test_path, "validation": data.validation_path}
            self.pairs = {split: read_pairs(path, data.text_field, data.target_field)
                          for split, path in paths.items() if path}
            self.split_description = "; ".join(f"{split}: {path}" for split, path in paths.items() if path)
        if data.validation_fraction and "validation" not in self.pairs:
            train = self.pairs["train"]
            order = np.random.default_rng(data.split_seed).permutation(len(train))
            held = max(1, round(data.validation_fraction * len(train)))
            self.pairs["validation"] = [train[i] for i in sorted(order[:held])]
            self.pairs["train"] = [train[i] for i in sorted(order[held:])]
        self.train_texts = [text for pair in self.pairs["train"] for text in pair]
        say(f"data: {self.split_description}; " + " / ".join(f"{len(p)} {split}" for split, p in self.pairs.items())
            + " pairs")
        return None

    def _encode(self) -> dict[str, list[tuple[list[int], list[int]]]]:
        data, eos = self.cfg.data, self.config.eos_token_ids[0]
        sources = truncating_tokenizer(self.tokenizer, data.max_len)
        targets = plain_tokenizer(self.tokenizer)
        encoded = {}
        for split, pairs in self.pairs.items():
            source_ids = [e.ids for e in sources.encode_batch([s for s, _ in pairs])]
            target_ids = [e.ids[:data.target_max_len - 1] + [eos] for e in targets.encode_batch([t for _, t in pairs])]
            cut = sum(len(e.ids) >= data.target_max_len for e in targets.encode_batch([t for _, t in pairs]))
            if cut:
                say(f"{split}: {cut} target(s) cut to data.target_max_len={data.target_max_len} pieces (EOS included)")
            encoded[split] = list(zip(source_ids, target_ids))
        if data.pack_pairs:  # once, in a seeded order; each epoch shuffles the rows
            train = encoded["train"]
            order = np.random.default_rng((self.cfg.seed, data.split_seed)).permutation(len(train))
            encoded["train"] = pack_pairs([train[i] for i in order], self.max_len, data.target_max_len)
            say(f"packed: {len(train)} training pairs in {len(encoded['train'])} rows "
                f"({len(train) / len(encoded['train']):.2f} a row)")
        return encoded

    def _batch(self, pairs, packed: bool = False) -> dict[str, np.ndarray]:
        """A batch of pairs, or of rows of pairs (``packed``)."""
        config = self.config
        return (packed_pair_batch if packed else pair_batch)(
            pairs, pad_id=config.pad_token_id, start_id=config.decoder_start_token_id, max_len=self.max_len,
            target_max_len=self.cfg.data.target_max_len)

    def epoch_batches(self, epoch: int, skip: int) -> Iterator[dict[str, np.ndarray]]:
        """The epoch's batches in a shuffled order (seeded by ``seed`` and ``epoch``) of pairs, or of packed rows
        (``data.pack_pairs``); the last one is completed with copies of the first whose targets are not scored."""
        train, size = self.encoded["train"], self.cfg.batch_size
        order = np.random.default_rng((self.cfg.seed, epoch)).permutation(len(train))
        for start in range(skip * size, len(order), size):
            chosen = [train[i] for i in order[start:start + size]]
            filler = size - len(chosen)
            batch = self._batch(chosen + [train[order[0]]] * filler, packed=self.cfg.data.pack_pairs)
            if filler:
                batch["labels"][-filler:] = IGNORE_INDEX
            yield {k: v[self.placement.rows] for k, v in batch.items()}

    # ------------------------------------------------------------------------------------------------ scores
    def _local_model(self, params: Any, rest: Any) -> nnx.Module:
        """The trained model on this process's first device, from a replicated gather of ``params`` / ``rest``
        (every process decodes the same split and scores it the same)."""
        gather = jax.jit(lambda p, r: (p, r), out_shardings=(self.replicated, self.replicated))
        params, rest = jax.tree.map(lambda x: x.addressable_data(0), gather(params, rest))  # this device's copy
        model = nnx.merge(self.graphdef, params, rest)
        model.eval()
        return model

    def predictions(self, split: str, params: Any = None, rest: Any = None) -> list[str]:
        """Each source of ``split`` decoded (``num_beams``; stopping at EOS or ``data.target_max_len`` tokens)."""
        if params is None:
            params, rest = self.state["params"], self.rest
        model, config = self._local_model(params, rest), self.config
        eos, size = config.eos_token_ids, self.cfg.eval_batch_size
        texts = []
        for start in range(0, len(self.encoded[split]), size):
            batch = self._batch(self.encoded[split][start:start + size])
            tokens = np.asarray(generate(model, batch["input_ids"], self.cfg.data.target_max_len,
                                         attention_mask=batch["attention_mask"], eos_token_id=list(eos),
                                         num_beams=self.cfg.num_beams))[:, 1:]
            for row in tokens.tolist():
                ends = [i for i, token in enumerate(row) if token in eos]
                texts.append(self.tokenizer.decode(row[:ends[0]] if ends else row, skip_special_tokens=True))
        return texts

    def scores(self, split: str, params: Any = None, rest: Any = None) -> tuple[dict[str, float], list[str]]:
        predicted = self.predictions(split, params, rest)
        return text_scores(predicted, [target for _, target in self.pairs[split]]), predicted

    def evaluate_at(self, step: int, state, rest, writer) -> dict[str, Any] | None:
        """The validation pairs' scores (exact match, ROUGE-L, BLEU), when there are validation pairs."""
        if "validation" not in self.encoded:
            return None
        found, _ = self.scores("validation", state["params"], rest)
        say(f"validation at step {step}: exact match {found['exact_match']:.1f}%, ROUGE-L {found['rougeL']:.1f}, "
            f"BLEU {found['bleu']:.1f}")
        return {f"val_{name}": value for name, value in found.items()}

    def _finish(self, steps: int, train_s: float, validation: dict[str, Any] | None) -> dict[str, Any]:
        """Decode and score the test pairs, write ``eval/`` (process 0), export the model (every process joins)."""
        found, predicted = self.scores("test")
        metrics = {**found, "split": self.split_description, "test_pairs": len(self.encoded["test"]),
                   "num_beams": self.cfg.num_beams, **self.run_figures(steps, train_s)}
        if validation is not None:
            metrics["validation"] = {k.removeprefix("val_"): v for k, v in validation.items()}
        self.export_with_predictions(steps, metrics, lambda: (
            {"source": source, "target": target, "predicted": guess}
            for (source, target), guess in zip(self.pairs["test"], predicted)))
        say(f"test: exact match {found['exact_match']:.1f}%, ROUGE-1/2/L {found['rouge1']:.1f} / "
            f"{found['rouge2']:.1f} / {found['rougeL']:.1f}, BLEU {found['bleu']:.1f}, chrF {found['chrf']:.1f} on "
            f"{metrics['test_pairs']} pairs; {self.workdir / 'eval'}")
        return metrics

    def line(self, step: int, row: dict[str, Any]) -> str:
        return (f"step {step}/{self.settings.steps} (epoch {row['epoch']})  loss {row['loss']:.4f}  target token "
                f"accuracy {100 * row['accuracy']:.1f}%")


__all__ = ["REVERSE_WORDS", "Seq2SeqTrainer", "pack_pairs", "packed_pair_batch", "pair_batch", "read_pairs",
           "reverse_word_pairs", "text_scores"]
