"""Token classification end to end (``task="tag"``, ``flaxzoo.train.finetune.tagger.Tagger``): the packaged MiniLM
fine-tuned on a small CoNLL-style file the test writes learns its tags; the entity F1 it reports is seqeval's on the
predictions it wrote; the export loads as a ``BertForTokenClassification`` that predicts those tags; the settings of
one-label-per-text fine-tuning are refused by name."""

import json
import random

import numpy as np
import pytest

from flaxzoo import models
from flaxzoo.train.config import ConfigError
from flaxzoo.train.finetune.config import FinetuneConfig, base_config
from flaxzoo.train.finetune.tagger import Tagger

PEOPLE = [["alice"], ["bob"], ["maria", "lopez"], ["john", "smith"], ["wei"], ["olga", "petrova"]]
PLACES = [["paris"], ["london"], ["new", "york"], ["tokyo"], ["cairo"], ["buenos", "aires"]]
FILLER = ["today", "the", "team", "said", "that", "went", "to", "visited", "met", "in", "from", "with"]


def sentences(n: int, seed: int) -> list[list[tuple[str, str]]]:
    """Sentences of filler words with a person and a place in them, tagged BIO (PER, LOC)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [(w, "O") for w in rng.sample(FILLER, 4)]
        for kind, names in (("PER", PEOPLE), ("LOC", PLACES)):
            name = rng.choice(names)
            at = rng.randrange(len(words) + 1)
            words[at:at] = [(w, ("B-" if i == 0 else "I-") + kind) for i, w in enumerate(name)]
        out.append(words)
    return out


def write_conll(path, rows, columns: int = 2):
    with open(path, "w") as out:
        out.write("-DOCSTART- -X- -X- O\n\n")
        for sentence in rows:
            for word, tag in sentence:
                out.write(" ".join([word] + ["X"] * (columns - 2) + [tag]) + "\n")
            out.write("\n")
    return path


def tag_config(tmp_path, minilm_dir, **changes) -> FinetuneConfig:
    c = base_config()
    c.task = "tag"
    c.epochs, c.batch_size, c.eval_batch_size, c.log_every, c.freeze_steps = 3, 16, 16, 3, 3
    c.optim.lr, c.head_lr = 1e-3, 3e-3
    c.data.source, c.data.max_len, c.data.data_dir = "files", 32, str(tmp_path / "data")
    c.data.train_path = str(write_conll(tmp_path / "train.txt", sentences(80, seed=1), columns=4))
    c.data.test_path = str(write_conll(tmp_path / "test.txt", sentences(24, seed=2)))
    c.init_from = str(minilm_dir)
    for key, value in changes.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return FinetuneConfig.from_config_dict(c)


@pytest.fixture(scope="module")
def tagged(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("tagging")
    cfg = tag_config(root, minilm_dir, **{"data.validation_path": str(write_conll(root / "dev.txt",
                                                                                 sentences(16, seed=3)))})
    tagger = Tagger(cfg, root / "work")
    summary = tagger.run()
    return root / "work", summary, tagger


@pytest.mark.slow
def test_the_tagger_learns_the_tags_and_reports_seqeval_scores_of_its_predictions(tagged):
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

    workdir, summary, _ = tagged
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["frozen_encoder"] and not rows[-1]["frozen_encoder"] and rows[-1]["loss"] < rows[0]["loss"] / 2
    assert "val_f1" in rows[-1]  # the validation file scored at the last step
    metrics = json.loads((workdir / "eval" / "metrics.json").read_text())
    assert metrics["label_names"] == ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"] and metrics["test_sentences"] == 24
    predictions = [json.loads(line) for line in (workdir / "eval" / "predictions.jsonl").read_text().splitlines()]
    assert [p["words"] for p in predictions] == [[w for w, _ in s] for s in sentences(24, seed=2)]
    assert [p["true"] for p in predictions] == [[t for _, t in s] for s in sentences(24, seed=2)]
    true, predicted = [p["true"] for p in predictions], [p["predicted"] for p in predictions]
    assert metrics["f1"] == pytest.approx(f1_score(true, predicted), abs=1e-12)
    assert metrics["precision"] == pytest.approx(precision_score(true, predicted), abs=1e-12)
    assert metrics["recall"] == pytest.approx(recall_score(true, predicted), abs=1e-12)
    assert metrics["accuracy"] == pytest.approx(accuracy_score(true, predicted), abs=1e-12)
    assert metrics["f1"] > 0.8 and summary.metrics["f1"] == metrics["f1"]


@pytest.mark.slow
def test_the_export_is_a_token_classifier_that_predicts_the_reported_tags(tagged, minilm_dir):
    workdir, _, tagger = tagged
    model = models.from_pretrained(workdir)
    assert type(model).__name__ == "BertForTokenClassification" and model.config.label_names[0] == "O"
    first = json.loads((workdir / "eval" / "predictions.jsonl").read_text().splitlines()[0])
    tokenizer = models.load_tokenizer(workdir)
    encoding = tokenizer.encode(first["words"], is_pretokenized=True)
    logits = np.asarray(model(np.asarray([encoding.ids]), np.ones((1, len(encoding.ids)), np.int32)))[0]
    firsts = [i for i, w in enumerate(encoding.word_ids) if w is not None and (i == 0 or encoding.word_ids[i - 1] != w)]
    assert [model.config.label_names[int(k)] for k in logits[firsts].argmax(-1)] == first["predicted"]


@pytest.mark.parametrize("key,value", [("class_weights", "balanced"), ("data.validation_fraction", 0.2),
                                       ("data.truncation", "head_tail"), ("vocab.frequent", True)])
def test_settings_of_one_label_per_text_are_refused_by_name(key, value, tmp_path, minilm_dir):
    with pytest.raises(ConfigError, match=rf"^{key}: {value!r} applies to task='classify'"):
        tag_config(tmp_path, minilm_dir, **{key: value})


def test_a_tagging_run_needs_a_test_file_and_classification_no_validation_file(tmp_path, minilm_dir):
    with pytest.raises(ConfigError, match=r"^data.test_path: '': task='tag' reads CoNLL files"):
        tag_config(tmp_path, minilm_dir, **{"data.test_path": ""})
    c = base_config()
    c.data.source, c.data.train_path, c.data.validation_path = "files", "a.csv", "b.csv"
    with pytest.raises(ConfigError, match=r"^data.validation_path: 'b.csv' applies to task='tag'"):
        FinetuneConfig.from_config_dict(c)
