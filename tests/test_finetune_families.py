"""The fine-tuning engine on every encoder family: a tiny random transformers model of the family, saved to a
directory, is ``init_from`` for a sequence-classification, a token-classification and (some families) a
question-answering fine-tune of a few steps on tiny data; the fine-tuner builds the family's own class for the task,
the loss is finite and falls, and the work directory loads as that class.

The families are every encoder folder's ``parity_cases.SMALL_CONFIGS`` (``tests/encoder_cases.py``). One tokenizer
(``finetune_data.write_vocab``) serves every family."""

import json

import numpy as np
import pytest
import torch
import transformers

from finetune_data import labelled_rows, write_rows, write_squad, write_vocab
from flaxzoo import models
from flaxzoo.models.families import FAMILIES, family_of
from flaxzoo.train.finetune.config import FinetuneConfig, base_config
from test_tagging import sentences, write_conll
from tests.encoder_cases import SMALL_CONFIGS, hf_config_kwargs

VOCAB = 128  # at least the shared vocabulary's words (about 100)
MAX_LEN = 32
# initializer_range 0.1 (BERT's is 0.02): a random encoder whose [CLS] state already differs between texts, so a few
# steps move a sequence classifier's loss
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, initializer_range=0.1)


def masked_lm(model_type: str) -> transformers.PreTrainedModel:
    """A tiny random ``...ForMaskedLM`` of ``model_type`` (its folder's small config at SIZES; pad id 0: the shared
    tokenizer's [PAD])."""
    config = transformers.AutoConfig.for_model(model_type, vocab_size=VOCAB, max_position_embeddings=MAX_LEN + 8,
                                               pad_token_id=0, **hf_config_kwargs(model_type, SIZES))
    return transformers.AutoModelForMaskedLM.from_config(config)


# every encoder model_type (its config.json and weights are what init_from reads)
ENCODERS = sorted(SMALL_CONFIGS)
QA_FAMILIES = ["bert", "deberta-v2", "modernbert"]  # BERT's class on relative attention; ModernBERT's own class


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The shared tokenizer and the three tasks' files."""
    root = tmp_path_factory.mktemp("family_data")
    return {"root": root, "tokenizer": str(write_vocab(root / "vocab")),
            "classify": (write_rows(root / "train.csv", labelled_rows(48, seed=1)),
                         write_rows(root / "test.csv", labelled_rows(8, seed=2))),
            "tag": (str(write_conll(root / "train.txt", sentences(32, seed=1))),
                    str(write_conll(root / "test.txt", sentences(8, seed=2)))),
            "qa": (write_squad(root / "train.json", 32, seed=1, sentences=2),
                   write_squad(root / "dev.json", 8, seed=2, sentences=2))}


def checkpoint(root, model_type: str):
    """``root/model_type``: the family's tiny random masked LM, saved by transformers (made once per family)."""
    path = root / model_type
    if not (path / "config.json").is_file():
        torch.manual_seed(0)
        masked_lm(model_type).save_pretrained(path)
    return path


TASKS = {"classify": ("sequence_classification", "flaxzoo.train.finetune.trainer", "Finetuner"),
         "tag": ("token_classification", "flaxzoo.train.finetune.tagger", "Tagger"),
         "qa": ("question_answering", "flaxzoo.train.finetune.qa", "QuestionAnswering")}


def finetune(data, model_type: str, task: str, tmp_path):
    import importlib

    head, module, name = TASKS[task]
    c = base_config()
    c.task, c.init_from, c.tokenizer = task, str(checkpoint(data["root"], model_type)), data["tokenizer"]
    c.epochs, c.batch_size, c.eval_batch_size, c.log_every, c.checkpoint_every = 4, 16, 16, 1, 0
    c.optim.lr, c.warmup_ratio, c.dropout = 5e-3, 0.0, 0.0
    c.data.source, c.data.max_len, c.data.data_dir = "files", MAX_LEN, str(tmp_path / "cache")
    c.data.train_path, c.data.test_path = data[task]
    if task == "qa":
        c.data.doc_stride, c.data.max_query_length, c.data.max_answer_length = 8, 10, 4
    runner = getattr(importlib.import_module(module), name)(FinetuneConfig.from_config_dict(c), tmp_path / "work")
    expected = family_of(model_type).class_for(head)
    assert runner.MODEL is expected  # the family's own class for the task
    summary = runner.run()
    rows = [json.loads(line) for line in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if "loss" in row]
    print(f"\n  {model_type} {task}: {runner.MODEL.__name__}, losses {[round(x, 3) for x in losses]}")
    assert len(losses) == summary.steps and np.all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.02
    loaded = models.from_pretrained(tmp_path / "work")
    assert type(loaded) is expected and loaded.config.model_type == model_type
    return summary


def test_every_registered_encoder_is_listed():
    """Every registered encoder has its folder's small config (no family is left out)."""
    assert set(ENCODERS) == {k for k, family in FAMILIES.items() if not family.causal}
    assert set(QA_FAMILIES) <= set(ENCODERS)


@pytest.mark.slow  # the quick tier's train step of every family: tests/test_family_train_step.py
@pytest.mark.parametrize("task", ["classify", "tag"])
@pytest.mark.parametrize("model_type", list(ENCODERS))
def test_the_engine_finetunes_each_encoder_family(data, model_type, task, tmp_path):
    finetune(data, model_type, task, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", QA_FAMILIES)
def test_question_answering_on_encoder_families(data, model_type, tmp_path):
    summary = finetune(data, model_type, "qa", tmp_path)
    print(f"  {model_type} qa: dev EM {summary.metrics['exact_match']:.2f}, F1 {summary.metrics['f1']:.2f}")
    assert 0 <= summary.metrics["exact_match"] <= summary.metrics["f1"] <= 100
