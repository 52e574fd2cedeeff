"""T5's span-corruption pre-training of an encoder-decoder on plain text: ``task="seq2seq"`` with
``data.source="span_corruption"`` (``configs/span_corruption.py``).

Everything but the data and the scores is the text-to-text fine-tuner's (:class:`Seq2SeqTrainer`: the one training
loop's checkpoints, exact resume, meshes, several processes, LoRA, the export). What differs:

- the text: the embedded corpus (Python's documentation topics and standard-library docstrings), or
  ``data.train_path`` (text or JSONL files, ``data.text_field``); documents are held out for the test rows by a hash
  of their text (5 %, as the pre-training corpus splits);
- the rows: each document's pieces and the model's EOS, concatenated and cut into rows of the raw length that
  corrupts into exactly ``data.max_len`` encoder tokens (:func:`input_and_target_lengths`: 568 raw tokens for T5's
  512), the remainder dropped;
- the corruption (``train/data/span_corruption.py``): ``data.noise_density`` of each row's tokens in spans of mean
  ``data.mean_noise_span_length``, each span a sentinel in the encoder input and sentinel + span in the target, drawn
  afresh every epoch from ``(seed, epoch, position in the epoch's order)``, so a resumed run sees the batches the
  uninterrupted one saw. The sentinels are the tokenizer's ``<extra_id_k>`` where it has them (T5's tokenizers),
  else ids past its vocabulary counting down from ``vocab + spans - 1`` (T5's convention), which the model's table
  must hold;
- the scores: the test rows corrupted once (epoch 0), teacher-forced: the mean loss, perplexity and accuracy of every
  target token, and of the hidden spans' tokens alone (``span_*``: a target's sentinels and EOS are easy), each
  beside a unigram model of the training targets' tokens (add-one smoothed) on the same tokens, the baseline of a
  model that learned nothing beyond token frequencies; the first rows greedily decoded in
  ``eval/predictions.jsonl``, sentinels written ``<extra_id_k>``.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

import numpy as np
from flax import nnx

from flaxzoo.models.inference.generate import generate
from flaxzoo.models.inference.text import plain_tokenizer
from flaxzoo.train.batches import IGNORE_INDEX
from flaxzoo.train.config import ConfigError
from flaxzoo.train.data.corpus import embedded_documents, read_text_files, split_documents
from flaxzoo.train.data.span_corruption import (corrupt_spans, input_and_target_lengths, span_counts,
                                                t5_sentinel_ids, tokenizer_sentinel_ids)
from flaxzoo.train.finetune.seq2seq import Seq2SeqTrainer
from flaxzoo.train.hooks import say
from flaxzoo.train.losses import seq2seq_lm_loss

HELD_OUT = 0.05  # the share of documents held out for the test rows (by a hash of each document's text)
SHOWN_ROWS = 8  # test rows decoded into eval/predictions.jsonl


def text_rows(documents: Sequence[list[int]], eos_id: int, length: int) -> np.ndarray:
    """``int32 [rows, length]``: the documents' ids, each followed by ``eos_id``, concatenated and cut into rows of
    ``length`` (the remainder dropped)."""
    flat = np.fromiter((token for ids in documents for token in (*ids, eos_id)), np.int32)
    rows = len(flat) // length
    return flat[:rows * length].reshape(rows, length)


def corrupted_batch(inputs: np.ndarray, targets: np.ndarray, start_id: int) -> dict[str, np.ndarray]:
    """A teacher-forced batch from :func:`corrupt_spans`' ``inputs [rows, src]`` and ``targets [rows, target]`` (no
    padding: every row of a width corrupts to the same widths)."""
    rows = len(inputs)
    return {"input_ids": inputs, "attention_mask": np.ones_like(inputs),
            "labels": targets.copy(),
            "decoder_input_ids": np.concatenate([np.full((rows, 1), start_id, targets.dtype), targets[:, :-1]], 1),
            "decoder_attention_mask": np.ones_like(targets)}


def unigram_loss(train_targets: np.ndarray, test_targets: np.ndarray, vocab_size: int) -> float:
    """Mean ``-log p(token)`` of ``test_targets`` under the add-one smoothed token frequencies of
    ``train_targets``."""
    counts = np.bincount(train_targets.reshape(-1), minlength=vocab_size).astype(np.float64) + 1.0
    log_p = np.log(counts / counts.sum())
    return float(-log_p[test_targets.reshape(-1)].mean())


class SpanCorruptionTrainer(Seq2SeqTrainer):
    """Span-corruption pre-training; :meth:`run` trains (or resumes), scores the held-out rows, and exports."""

    HEADLINE = "loss"

    # ------------------------------------------------------------------------------------------------ data
    def _load_data(self) -> None:
        data = self.cfg.data
        if data.train_path:
            found = read_text_files([data.train_path], text_field=data.text_field, val_fraction=HELD_OUT)
            self.documents = {"train": found.train, "test": found.validation}
            where = f"{data.train_path} ({len(found.files)} files)"
        else:
            train, test = split_documents(embedded_documents(), HELD_OUT)
            self.documents = {"train": train, "test": test}
            where = "the embedded corpus"
        if not self.documents["test"]:
            raise ValueError(f"{where}: no document fell into the held-out {HELD_OUT:.0%}; expected more documents")
        self.raw_len, self.target_len = input_and_target_lengths(data.max_len, data.noise_density,
                                                                 data.mean_noise_span_length)
        self.num_spans = span_counts(self.raw_len, data.noise_density, data.mean_noise_span_length)[1]
        self.split_description = (f"{where}, {HELD_OUT:.0%} of the documents held out by hash; rows of "
                                  f"{self.raw_len} tokens -> {data.max_len} encoder / {self.target_len} target "
                                  f"tokens (noise density {data.noise_density}, mean span "
                                  f"{data.mean_noise_span_length})")
        self.train_texts = self.documents["train"]
        say(f"data: {self.split_description}; " + " / ".join(f"{len(d)} {split}" for split, d in
                                                              self.documents.items()) + " documents")
        return None

    def _tokenizer(self, source: str, vocab_size: int):
        # a tokenizer trained here (tokenizer="wordpiece" / "bpe") leaves the table's last rows to a row's sentinels
        return super()._tokenizer(source, vocab_size - self.num_spans)

    def _sentinels(self) -> list[int]:
        try:
            return tokenizer_sentinel_ids(self.tokenizer, self.num_spans)
        except ValueError:  # a tokenizer without <extra_id_k>: ids past its vocabulary, T5's way
            needed = self.tokenizer.get_vocab_size() + self.num_spans
            if needed > self.config.vocab_size:
                raise ConfigError("model.vocab_size", f"{self.config.vocab_size}: the tokenizer has no <extra_id_k> "
                                                      f"tokens, so the {self.num_spans} sentinels of a row take "
                                                      f"ids past its {self.tokenizer.get_vocab_size()}; expected at "
                                                      f"least {needed}") from None
            return t5_sentinel_ids(needed, self.num_spans)

    def _encode(self) -> dict[str, np.ndarray]:
        self.sentinels = self._sentinels()
        pieces, eos = plain_tokenizer(self.tokenizer), self.config.eos_token_ids[0]
        encoded = {split: text_rows([e.ids for e in pieces.encode_batch(docs)], eos, self.raw_len)
                   for split, docs in self.documents.items()}
        for split, rows in encoded.items():
            if not len(rows):
                raise ValueError(f"the {split} documents hold fewer than {self.raw_len} pieces: no row of "
                                 f"data.max_len={self.cfg.data.max_len} encoder tokens; expected more text or a "
                                 "smaller data.max_len")
        say("rows: " + " / ".join(f"{len(rows)} {split}" for split, rows in encoded.items()))
        return encoded

    def _corrupt(self, rows: np.ndarray, epoch: int, row_offset: int) -> dict[str, np.ndarray]:
        data = self.cfg.data
        inputs, targets = corrupt_spans(rows, sentinel_ids=self.sentinels, eos_id=self.config.eos_token_ids[0],
                                        noise_density=data.noise_density,
                                        mean_noise_span_length=data.mean_noise_span_length, seed=self.cfg.seed,
                                        epoch=epoch, row_offset=row_offset)
        return corrupted_batch(inputs, targets, self.config.decoder_start_token_id)

    def epoch_batches(self, epoch: int, skip: int) -> Iterator[dict[str, np.ndarray]]:
        """The epoch's rows in a shuffled order (seeded by ``seed`` and ``epoch``), each corrupted from ``(seed,
        epoch, its position in that order)``; the last batch is completed with copies of the first row, not
        scored."""
        train, size = self.encoded["train"], self.cfg.batch_size
        order = np.random.default_rng((self.cfg.seed, epoch)).permutation(len(train))
        for start in range(skip * size, len(order), size):
            chosen = order[start:start + size]
            filler = size - len(chosen)
            batch = self._corrupt(train[np.concatenate([chosen, np.full(filler, order[0])])], epoch, start)
            if filler:
                batch["labels"][-filler:] = IGNORE_INDEX
            yield {k: v[self.placement.rows] for k, v in batch.items()}

    # ------------------------------------------------------------------------------------------------ scores
    def scores(self, split: str, params: Any = None, rest: Any = None) -> tuple[dict[str, float], list[dict]]:
        """The held-out rows corrupted once (epoch 0), teacher-forced: target loss, perplexity and accuracy over every
        target token and over the hidden spans' tokens alone (a target's sentinels and EOS sit where the source says),
        each beside the unigram baseline; the first :data:`SHOWN_ROWS` rows decoded greedily."""
        if params is None:
            params, rest = self.state["params"], self.rest
        model, size = self._local_model(params, rest), self.cfg.eval_batch_size
        rows, loss = self.encoded[split], nnx.jit(seq2seq_lm_loss)
        sums = {"": np.zeros(3), "span_": np.zeros(3)}
        targets = []
        for start in range(0, len(rows), size):
            batch = self._corrupt(rows[start:start + size], epoch=0, row_offset=start)
            sums[""] += [float(x) for x in loss(model, batch)]
            sums["span_"] += [float(x) for x in loss(model, {**batch, "labels": self.span_labels(batch["labels"])})]
            targets.append(batch["labels"])
        train_targets = self._corrupt(self.encoded["train"], epoch=0, row_offset=0)["labels"]
        test_targets = np.concatenate(targets)
        found = {}
        for prefix, (total, count, correct) in sums.items():
            found |= {f"{prefix}loss": total / count, f"{prefix}perplexity": math.exp(total / count),
                      f"{prefix}accuracy": 100 * correct / count, f"{prefix}tokens": int(count)}
        vocab = self.config.vocab_size
        found["unigram_loss"] = unigram_loss(train_targets, test_targets, vocab)
        spans = self.span_labels(test_targets)
        found["unigram_span_loss"] = unigram_loss(train_targets[self.span_labels(train_targets) != IGNORE_INDEX],
                                                  spans[spans != IGNORE_INDEX], vocab)
        return found, self.shown(model, rows[:SHOWN_ROWS])

    def span_labels(self, labels: np.ndarray) -> np.ndarray:
        """``labels`` with the sentinels and EOS unscored: the hidden spans' tokens alone."""
        return np.where(np.isin(labels, [*self.sentinels, *self.config.eos_token_ids]), IGNORE_INDEX, labels)

    def shown(self, model: nnx.Module, rows: np.ndarray) -> list[dict[str, str]]:
        """Rows as text: the corrupted source, the target spans and the model's greedy guess of them."""
        batch = self._corrupt(rows, epoch=0, row_offset=0)
        eos = self.config.eos_token_ids
        guesses = np.asarray(generate(model, batch["input_ids"], self.target_len, eos_token_id=list(eos)))[:, 1:]
        return [{"source": self.render(s), "target": self.render(t), "predicted": self.render(g)}
                for s, t, g in zip(batch["input_ids"].tolist(), batch["labels"].tolist(), guesses.tolist())]

    def render(self, ids: Sequence[int]) -> str:
        """Ids as text up to the last EOS before the end or padding (a generated row's first), each sentinel written
        ``<extra_id_k>``, a document boundary (EOS inside a row) as the EOS token."""
        eos, sentinel_of = self.config.eos_token_ids, {token: k for k, token in enumerate(self.sentinels)}
        ids = list(ids)
        while ids and (ids[-1] in eos or ids[-1] == self.config.pad_token_id):
            ids.pop()
        out, pieces = [], []
        for token in ids:
            marker = (f"<extra_id_{sentinel_of[token]}>" if token in sentinel_of
                      else self.tokenizer.id_to_token(token) if token in eos else None)
            if marker is None:
                pieces.append(token)
            else:
                out.extend([self.tokenizer.decode(pieces), marker])
                pieces = []
        out.append(self.tokenizer.decode(pieces))
        return " ".join(part for part in out if part)

    def evaluate_at(self, step: int, state, rest, writer) -> None:
        return None  # the held-out rows are scored at the end

    def _finish(self, steps: int, train_s: float, validation: dict[str, Any] | None) -> dict[str, Any]:
        """Score the held-out rows, write ``eval/`` (process 0), export the model (every process joins)."""
        found, shown = self.scores("test")
        metrics = {**found, "split": self.split_description, "test_rows": len(self.encoded["test"]),
                   **self.run_figures(steps, train_s)}
        self.export_with_predictions(steps, metrics, lambda: shown)
        say(f"test: target loss {found['loss']:.4f} (unigram baseline {found['unigram_loss']:.4f}), accuracy "
            f"{found['accuracy']:.1f}%; the spans' tokens alone: loss {found['span_loss']:.4f} (unigram "
            f"{found['unigram_span_loss']:.4f}), accuracy {found['span_accuracy']:.1f}%; {metrics['test_rows']} rows; "
            f"{self.workdir / 'eval'}")
        return metrics


__all__ = ["SpanCorruptionTrainer", "corrupted_batch", "text_rows", "unigram_loss"]
