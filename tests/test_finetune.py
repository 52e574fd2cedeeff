"""Fine-tuning: a shortened run on a synthetic CSV (the loss falls, the files are sane, the export loads in
transformers with equal logits), each practice of the recipe shown to act, the BBC headline split, and every bad
input refused with one clear error."""

import dataclasses
import json
import pathlib
import random
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers
from flax import nnx
from PIL import Image

from flaxzoo import models
from flaxzoo.models.architectures.encoder import BertForSequenceClassification
from flaxzoo.models.families import get_preset
from flaxzoo.models.inference.text import pad_batch
from flaxzoo.train.config import ConfigError, OptimConfig
from flaxzoo.train.finetune import vocab as vocablib
from flaxzoo.train.finetune.config import FinetuneConfig, base_config
from flaxzoo.train.finetune.trainer import Finetuner, class_weights, epoch_batches
from flaxzoo.train.losses import classification_loss
from flaxzoo.train.optim import make_finetune_optimizer
from flaxzoo.train.step import make_train_step

transformers.logging.set_verbosity_error()
REPO = pathlib.Path(__file__).resolve().parent.parent

TOPICS = {"sport": ["match", "goal", "striker", "league", "coach", "penalty", "tennis", "rusedski"],
          "money": ["shares", "bank", "profit", "market", "investors", "economy", "oil", "yukos"],
          "film": ["actor", "movie", "director", "oscar", "premiere", "studio", "drama", "fockers"]}
FILLER = ["the", "a", "new", "after", "says", "over", "in", "for", "big", "week"]


def synthetic_rows(n: int, seed: int) -> list[tuple[str, str]]:
    """Headline-like texts: 2-3 topic words among filler words, the topic as the label."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = list(TOPICS)[i % len(TOPICS)]
        words = rng.sample(TOPICS[label], 2) + rng.sample(FILLER, 3)
        rng.shuffle(words)
        rows.append((" ".join(words).capitalize(), label))
    return rows


def write_csv(path: pathlib.Path, rows, header=("text", "label")) -> pathlib.Path:
    import csv

    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path



@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.getbasetemp() / "train_data")


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory) -> pathlib.Path:
    """A random tiny Hugging Face BERT encoder (no head) with MiniLM's vocabulary size."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64)
    directory = tmp_path_factory.mktemp("tiny_encoder")
    transformers.BertModel(config).eval().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def csv_files(tmp_path_factory) -> dict[str, pathlib.Path]:
    folder = tmp_path_factory.mktemp("csv")
    return {"train": write_csv(folder / "train.csv", synthetic_rows(96, seed=1)),
            "test": write_csv(folder / "test.csv", synthetic_rows(30, seed=2))}


def finetune_config(data_dir: str, tiny_encoder, minilm_dir, train_path, **changes) -> FinetuneConfig:
    c = base_config()
    c.init_from = str(tiny_encoder)
    c.tokenizer = str(minilm_dir)
    c.epochs, c.batch_size, c.log_every, c.eval_batch_size = 4, 16, 6, 32
    c.optim.lr, c.optim.layer_decay, c.optim.weight_decay = 3e-3, 0.9, 0.01
    c.data.source, c.data.train_path, c.data.data_dir, c.data.max_len = "files", str(train_path), data_dir, 32
    for key, value in changes.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return FinetuneConfig.from_config_dict(c)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir, csv_files):
    """One shortened fine-tune of the real MiniLM (the default init_from and tokenizer): 3 epochs of 6 steps, the
    head alone for 4, three words added to the vocabulary, balanced class weights, head + tail truncation."""
    workdir = tmp_path_factory.mktemp("finetune")
    cfg = finetune_config(data_dir, "", "", csv_files["train"], **{
        "data.test_path": str(csv_files["test"]), "freeze_steps": 4, "class_weights": "balanced", "epochs": 3,
        "log_every": 3, "optim.lr": 5e-4, "optim.layer_decay": 0.8, "vocab.tokens": "rusedski,yukos,fockers",
        "data.truncation": "head_tail"})
    summary = Finetuner(cfg, workdir).run()
    return workdir, summary


# ------------------------------------------------------------------------------------------------ a whole run
@pytest.mark.slow
def test_a_shortened_finetune_learns_and_writes_sane_files(finished):
    workdir, summary = finished
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["frozen_encoder"] and not rows[-1]["frozen_encoder"]
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"], rows
    metrics = json.loads((workdir / "eval" / "metrics.json").read_text())
    assert metrics["label_names"] == ["film", "money", "sport"]  # sorted
    assert metrics["test_examples"] == 30 and metrics["train_examples"] == 96
    assert 0.9 <= metrics["macro_f1"] <= 1.0 and 0.9 <= metrics["accuracy"] <= 1.0
    report = metrics["report"]
    assert set(report) >= {"film", "money", "sport", "macro avg", "accuracy"}
    assert report["macro avg"]["f1-score"] == pytest.approx(metrics["macro_f1"])
    assert sum(map(sum, metrics["confusion_matrix"])) == 30
    assert metrics["vocabulary"]["added"] == 3
    assert metrics["class_weights"] == {"film": 1.0, "money": 1.0, "sport": 1.0}  # balanced data: all 1
    errors = [json.loads(line) for line in (workdir / "eval" / "errors.jsonl").read_text().splitlines()]
    assert len(errors) == metrics["errors"]
    assert all({"text", "true", "predicted"} <= set(e) and e["true"] != e["predicted"] for e in errors)
    with Image.open(workdir / "eval" / "confusion_matrix.png") as image:
        image.verify()
        assert image.format == "PNG" and image.size[0] > 200


@pytest.mark.slow
def test_the_workdir_loads_as_the_classifier_and_exports_to_transformers(finished, tmp_path, csv_files):
    workdir, _ = finished
    model = models.from_pretrained(workdir)
    assert isinstance(model, BertForSequenceClassification)
    assert model.config.label_names == ("film", "money", "sport")
    tokenizer = models.load_tokenizer(workdir)
    assert len(tokenizer.encode("yukos", add_special_tokens=False).ids) == 1  # the added word is one token
    texts = ["Striker scores the winning goal", "Yukos profit beats market forecasts", "A new movie premiere"]
    labels, probabilities = models.classify(model, tokenizer, texts)
    assert labels == ["sport", "money", "film"]
    # the saved classifier, run through models.classify, makes the trainer's test predictions
    import csv

    with open(csv_files["test"]) as fh:
        test_rows = list(csv.DictReader(fh))
    predicted, _ = models.classify(model, tokenizer, [r["text"] for r in test_rows], max_length=32,
                                   truncation="head_tail")
    wrong = {r["text"] for r, p in zip(test_rows, predicted) if p != r["label"]}
    errors = [json.loads(line) for line in (workdir / "eval" / "errors.jsonl").read_text().splitlines()]
    assert {e["text"] for e in errors} == wrong
    metrics = json.loads((workdir / "eval" / "metrics.json").read_text())
    assert metrics["accuracy"] == pytest.approx(1 - len(wrong) / len(test_rows))
    models.save_pretrained(model, tmp_path / "hf")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.id2label == {0: "film", 1: "money", 2: "sport"}
    assert hf.config.label2id == {"film": 0, "money": 1, "sport": 2}
    encoded = [tokenizer.encode(t).ids for t in texts]
    for ids, probs in zip(encoded, probabilities):
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([ids])).logits[0].numpy()
        flax_logits = np.asarray(model(jnp.asarray([ids], jnp.int32)))[0]
        np.testing.assert_allclose(flax_logits, logits, atol=1e-4)
        np.testing.assert_allclose(probs, np.exp(logits) / np.exp(logits).sum(), atol=1e-5)


@pytest.mark.slow  # it needs the shortened fine-tune of the real MiniLM above (about 25 s of work)
def test_a_finished_workdir_is_not_overwritten(finished, data_dir, tiny_encoder, minilm_dir, csv_files, capsys):
    workdir, summary = finished
    before = {p: p.stat().st_mtime_ns for p in workdir.rglob("*") if p.is_file()}
    cfg = finetune_config(data_dir, tiny_encoder, minilm_dir, csv_files["train"])
    again = Finetuner(cfg, workdir).run()
    assert "nothing to do" in capsys.readouterr().out
    assert again.metrics["macro_f1"] == summary.metrics["macro_f1"] and again.stopped_by is None
    assert {p: p.stat().st_mtime_ns for p in workdir.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("group_by_length", [False, True])
def test_an_epoch_uses_every_example_once_and_pads_the_last_batch_with_weight_zero(group_by_length):
    rng = np.random.default_rng(0)
    rows = [[101, *rng.integers(1000, 2000, size=n).tolist(), 102] for n in rng.integers(1, 23, size=70)]  # <= 24
    labels = np.arange(70) % 3
    weights = np.linspace(0.5, 1.5, 70).astype(np.float32)  # one weight per example, to follow them
    seen = []
    batches = list(epoch_batches(rows, labels, weights, 16, seed=1, epoch=2, group_by_length=group_by_length,
                                 max_len=24, pad_id=0))
    assert len(batches) == 5 and all(b["input_ids"].shape[0] == 16 for b in batches)
    for b in batches:
        assert b["input_ids"].shape[1] % 8 == 0 and b["input_ids"].shape[1] <= 24
        for ids, mask, label, weight in zip(b["input_ids"], b["attention_mask"], b["labels"], b["example_weights"]):
            if weight == 0:  # a padding row: nothing real in it
                assert not mask.any()
                continue
            i = int(np.flatnonzero(np.isclose(weights, weight))[0])
            assert ids[mask.astype(bool)].tolist() == rows[i] and label == labels[i]
            seen.append(i)
    assert sorted(seen) == list(range(70))  # every example exactly once; 10 padding rows in all
    assert sum(int((b["example_weights"] == 0).sum()) for b in batches) == 5 * 16 - 70
    again = list(epoch_batches(rows, labels, weights, 16, seed=1, epoch=3, group_by_length=group_by_length,
                               max_len=24, pad_id=0))
    assert any(not np.array_equal(a["labels"], b["labels"]) for a, b in zip(batches, again))  # reshuffled


def test_the_head_only_step_moves_the_head_as_the_full_step_does_and_nothing_else():
    config = get_preset("bert-tiny", num_labels=3)
    graphdef, params, rest = nnx.split(BertForSequenceClassification(config, rngs=nnx.Rngs(0)), nnx.Param, ...)
    params = nnx.to_pure_dict(params)
    rng = np.random.default_rng(0)
    batch = {"input_ids": jnp.asarray(rng.integers(5, 1000, (4, 8)), jnp.int32),
             "attention_mask": jnp.ones((4, 8), jnp.int32), "labels": jnp.asarray([0, 1, 2, 1], jnp.int32),
             "example_weights": jnp.ones(4, jnp.float32)}
    tx = optax.sgd(1.0)
    state = lambda: {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32),  # noqa
                     "rng": jax.random.key_data(jax.random.key(0))}
    head = lambda keys: "backbone" not in keys  # noqa: E731
    full, _ = jax.jit(make_train_step(graphdef, tx, optax.constant_schedule(1.0), objective="classify"))(
        state(), rest, batch)  # compiled: faster than running the step op by op
    part, _ = jax.jit(make_train_step(graphdef, tx, optax.constant_schedule(1.0), objective="classify",
                                      trainable=head))(state(), rest, batch)
    moved = 0
    for (path, before), after_full, after_part in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                                                      jax.tree.leaves(full["params"]), jax.tree.leaves(part["params"])):
        keys = [getattr(p, "key", p) for p in path]
        if head(keys):
            np.testing.assert_allclose(after_part, after_full, rtol=1e-5, atol=1e-7)
            moved += int(not np.allclose(after_part, before))
        else:
            np.testing.assert_array_equal(after_part, before)
    assert moved >= 2  # the classifier's kernel and bias at least


# ----------------------------------------------------------------------------------------------- the practices
def tiny_classifier_params(num_layers: int = 2):
    config = get_preset("bert-tiny", num_layers=num_layers, num_labels=3)
    model = BertForSequenceClassification(config, rngs=nnx.Rngs(0))
    return config, nnx.to_pure_dict(nnx.state(model, nnx.Param))


def first_updates(optim: OptimConfig, params, grads, *, freeze_steps=0, updates=1, steps=10):
    """The first ``updates`` updates of the fine-tuning optimizer; ``grads`` is one gradient tree or a list."""
    tx, _ = make_finetune_optimizer(optim, steps, params, 2, freeze_steps=freeze_steps,
                                    is_head=lambda keys: "backbone" not in keys)
    state = tx.init(params)
    out = []
    for k in range(updates):
        g = grads[k] if isinstance(grads, list) else grads
        update, state = tx.update(g, state, params, grad_norm=optax.tree.norm(g))
        out.append(update)
    return out


def test_layer_wise_lr_decay_scales_a_real_adam_update_per_layer():
    _, params = tiny_classifier_params()
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
    optim = OptimConfig(lr=1e-3, warmup_steps=0, schedule="constant", weight_decay=0.0, grad_clip=0.0,
                        layer_decay=0.5)
    (update,) = first_updates(optim, params, grads)
    # Adam's first step moves every weight by lr * g / |g| (bias-corrected); here times 0.5^(depth from the top).
    expected = {"embeddings": 1e-3 * 0.5 ** 3, "layers.0": 1e-3 * 0.5 ** 2, "layers.1": 1e-3 * 0.5,
                "pooler": 1e-3, "classifier": 1e-3}
    flat = {".".join(map(str, k)): v for k, v in
            jax.tree_util.tree_flatten_with_path(update)[0] for k in [[getattr(p, "key", p) for p in k]]}
    seen = set()
    for name, value in flat.items():
        group = next(g for g in expected if f".{g}." in f".{name}.")
        seen.add(group)
        np.testing.assert_allclose(np.asarray(value), -expected[group], rtol=1e-4, err_msg=name)
    assert seen == set(expected)


def test_gradient_clipping_equals_the_update_of_rescaled_gradients():
    _, params = tiny_classifier_params()
    rng = np.random.default_rng(0)
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape) * 10, jnp.float32), params)
    norm = float(optax.tree.norm(grads))
    clipped = OptimConfig(lr=1e-3, warmup_steps=0, schedule="constant", grad_clip=1.0, weight_decay=0.0)
    unclipped = dataclasses.replace(clipped, grad_clip=0.0)
    two = lambda optim, g: first_updates(optim, params, g, updates=2)[-1]  # noqa: E731  (Adam is scale-free at 1)
    a = two(clipped, grads)
    b = two(unclipped, jax.tree.map(lambda g: g / norm, grads))
    c = two(unclipped, grads)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-9)
    assert norm > 1.0 and any(not np.allclose(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(c)))


def test_freezing_keeps_the_encoder_still_then_starts_its_adam_afresh():
    _, params = tiny_classifier_params()
    rng = np.random.default_rng(1)
    grads = [jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params) for _ in range(4)]
    optim = OptimConfig(lr=1e-3, warmup_steps=0, schedule="constant", weight_decay=0.01, grad_clip=0.0)
    frozen = first_updates(optim, params, grads, freeze_steps=3, updates=4)
    fresh = first_updates(optim, params, grads[3])[0]  # an optimizer that sees the 4th gradient first
    is_encoder = lambda path: "backbone" in [getattr(p, "key", p) for p in path]  # noqa: E731
    for k in range(3):
        for path, leaf in jax.tree_util.tree_flatten_with_path(frozen[k])[0]:
            if is_encoder(path):
                assert not np.any(np.asarray(leaf)), path  # frozen: no change, not even weight decay
    # At the switch the encoder's first update is a fresh AdamW's first update (no bias-correction jump) ...
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(frozen[3])[0], jax.tree.leaves(fresh)):
        if is_encoder(path):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-10)
    # ... while the head, trained all along, has moved on from its first step.
    head = [(a, b) for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(frozen[3])[0], jax.tree.leaves(fresh))
            if not is_encoder(path)]
    assert any(not np.allclose(a, b) for a, b in head)


def test_class_weighted_loss_equals_pytorch_cross_entropy_with_weights():
    config = get_preset("bert-tiny", num_labels=3)
    model = BertForSequenceClassification(config, rngs=nnx.Rngs(0))
    model.eval()
    ids = np.random.default_rng(0).integers(5, 1000, size=(6, 8)).astype(np.int32)
    labels = np.asarray([0, 0, 0, 0, 1, 2], np.int32)
    weights = class_weights(labels, 3, "balanced")
    np.testing.assert_allclose(weights, [6 / (3 * 4), 6 / 3, 6 / 3], rtol=1e-6)  # n / (classes * n_c)
    batch = {"input_ids": jnp.asarray(ids), "attention_mask": jnp.ones_like(ids), "labels": jnp.asarray(labels),
             "example_weights": jnp.asarray(weights[labels])}
    loss_sum, count, _ = classification_loss(model, batch)
    logits = torch.tensor(np.asarray(model(jnp.asarray(ids))))
    reference = torch.nn.CrossEntropyLoss(weight=torch.tensor(weights))(logits, torch.tensor(labels).long())
    assert float(loss_sum / count) == pytest.approx(float(reference), rel=1e-5)


def test_vocabulary_extension_adds_whole_words_with_the_mean_of_their_pieces(minilm_dir):
    tokenizer = models.load_tokenizer(minilm_dir)
    word = "morientes"
    pieces = tokenizer.encode(word, add_special_tokens=False).ids
    assert len(pieces) >= 2
    table = np.random.default_rng(0).normal(size=(tokenizer.get_vocab_size(), 8)).astype(np.float32)
    params = {"backbone": {"embeddings": {"tokens": {"embedding": table}}}}
    extended, params, size, added = vocablib.extend_vocabulary(tokenizer, params, table.shape[0], [word, "the"])
    assert added == [word] and size == table.shape[0] + 1  # "the" is one token already
    new_id = extended.token_to_id(word)
    assert extended.encode("Morientes bid", add_special_tokens=False).ids[0] == new_id
    assert tokenizer.encode("Morientes bid", add_special_tokens=False).ids[:len(pieces)] == pieces  # copy only
    rows = params["backbone"]["embeddings"]["tokens"]["embedding"]
    np.testing.assert_allclose(rows[new_id], table[pieces].mean(axis=0), rtol=1e-6)
    np.testing.assert_array_equal(rows[:table.shape[0]], table)
    # "frequent" picks words seen min_count times that cut into min_pieces or more, most frequent first
    texts = ["Morientes signs", "Morientes scores", "morientes again", "Rusedski loses", "the cat"]
    assert vocablib.frequent_split_words(tokenizer, texts, min_count=2, min_pieces=2, max_new=10) == [word]
    before = vocablib.split_stats(tokenizer, texts, 2)
    after = vocablib.split_stats(extended, texts, 2)
    assert before.split_fraction > after.split_fraction and before.words == after.words == 10


def test_bfloat16_compute_is_set_and_float16_refused(data_dir, tiny_encoder, minilm_dir, csv_files):
    cfg = finetune_config(data_dir, tiny_encoder, minilm_dir, csv_files["train"], **{
        "precision.compute_dtype": "bfloat16"})
    assert cfg.resolved_dtype() == "bfloat16"
    with pytest.raises(ConfigError, match="^precision.compute_dtype: 'float16' is refused for training: float16 needs "
                                          "dynamic loss scaling"):
        finetune_config(data_dir, tiny_encoder, minilm_dir, csv_files["train"],
                        **{"precision.compute_dtype": "float16"})


def test_precision_keys_are_pretrainings_and_the_old_top_level_keys_name_where_they_moved(
        data_dir, tiny_encoder, minilm_dir, csv_files):
    """``precision.remat`` / ``precision.scan_layers`` / ``precision.compute_dtype``, as in pre-training; the top-level
    keys of earlier versions are refused, each with the key it moved to; ``precision.loss_chunk`` has nothing to
    chunk in a fine-tune."""
    cfg = finetune_config(data_dir, tiny_encoder, minilm_dir, csv_files["train"], **{
        "precision.remat": "full", "precision.scan_layers": True})
    assert cfg.execution(6, "cpu") == cfg.execution(6, "gpu") == ("full", True)
    auto = finetune_config(data_dir, tiny_encoder, minilm_dir, csv_files["train"])
    assert auto.execution(6, "cpu") == ("none", False) and auto.execution(6, "gpu") == ("none", True)
    assert (auto.resolved_dtype("cpu"), auto.resolved_dtype("tpu")) == ("float32", "bfloat16")
    for key, value in (("compute_dtype", "bfloat16"), ("remat", "full"), ("scan_layers", True)):
        with pytest.raises(ConfigError) as info:
            finetune_config(data_dir, tiny_encoder, minilm_dir, csv_files["train"], **{key: value})
        assert info.value.key == key and str(info.value).startswith(f"{key}: moved to precision.{key} ")
        assert f"--config.precision.{key}={value}" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="^precision.loss_chunk: 64: .*expected 0 or 'auto'$"):
        finetune_config(data_dir, tiny_encoder, minilm_dir, csv_files["train"], **{"precision.loss_chunk": 64})


# -------------------------------------------------------------------------------------------------- BBC data
def test_bbc_headlines_split_is_stratified_and_deduplicated(data_dir):
    from flaxzoo.train.finetune.config import ClassifyDataConfig
    from flaxzoo.train.finetune.data import load_labelled

    split = load_labelled(ClassifyDataConfig.from_values({"data_dir": data_dir}))
    assert split.label_names == ("business", "entertainment", "politics", "sports", "tech")
    train, test = split.texts["train"], split.texts["test"]
    assert len(train) + len(test) == 2096 and len(test) == 420
    assert not set(train) & set(test) and len(set(train)) == len(train)
    total = np.asarray(split.class_counts("train")) + np.asarray(split.class_counts("test"))
    np.testing.assert_allclose(np.asarray(split.class_counts("test")) / total, 0.2, atol=0.01)
    other = load_labelled(ClassifyDataConfig.from_values({"data_dir": data_dir, "split_seed": 1}))
    assert set(other.texts["test"]) != set(test) and len(other.texts["test"]) == 420


# ------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("case, match", [
    ("no_text_column", "no column 'text' \\(data.text_field\\); the file has columns \\['headline', 'label'\\]"),
    ("no_label_column", "no column 'label' \\(data.label_field\\); the file has columns \\['text', 'topic'\\]"),
    ("unseen_test_label", "the test split has label 'weather', but the training split never shows it"),
    ("class_without_examples", "class 'weather' of data.label_names has no training example"),
    ("all_empty", "all 6 texts are empty"),
    ("num_labels", "num_labels=4 disagrees with the data: 3 classes \\['film', 'money', 'sport'\\]"),
])
def test_bad_data_is_refused_with_one_clear_error(case, match, tmp_path, data_dir, tiny_encoder, minilm_dir,
                                                 csv_files):
    rows = synthetic_rows(12, seed=3)
    changes = {}
    train = csv_files["train"]
    if case == "no_text_column":
        train = write_csv(tmp_path / "t.csv", rows, header=("headline", "label"))
    elif case == "no_label_column":
        train = write_csv(tmp_path / "t.csv", rows, header=("text", "topic"))
    elif case == "unseen_test_label":
        changes["data.test_path"] = str(write_csv(tmp_path / "test.csv", rows + [("Rain tomorrow", "weather")]))
    elif case == "class_without_examples":
        changes["data.label_names"] = "film,money,sport,weather"
    elif case == "all_empty":
        train = write_csv(tmp_path / "t.csv", [("  ", label) for _, label in rows[:6]])
    elif case == "num_labels":
        changes["num_labels"] = 4
    cfg = finetune_config(data_dir, tiny_encoder, minilm_dir, train, **changes)
    with pytest.raises(ValueError, match=match):
        Finetuner(cfg, tmp_path / "work")


def test_empty_texts_are_dropped_and_counted(tmp_path, data_dir):
    from flaxzoo.train.finetune.config import ClassifyDataConfig
    from flaxzoo.train.finetune.data import load_labelled

    rows = synthetic_rows(30, seed=4) + [("", "film"), ("   ", "sport")]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    split = load_labelled(ClassifyDataConfig.from_values({"source": "files", "train_path": str(path),
                                                          "data_dir": data_dir, "test_fraction": 0.3}))
    assert split.dropped_empty == {"train": 2, "test": 0}
    assert len(split.texts["train"]) + len(split.texts["test"]) == 30


def test_unknown_source_and_a_decoder_checkpoint_are_refused(tmp_path, data_dir, tiny_encoder, minilm_dir,
                                                             csv_files):
    with pytest.raises(ConfigError, match="data.source: 'news': expected one of "
                                          "\\['bbc_headlines', 'files', 'reverse_words', 'span_corruption'\\] or "
                                          "'tfds:NAME'"):
        finetune_config(data_dir, tiny_encoder, minilm_dir, csv_files["train"], **{"data.source": "news"})
    with pytest.raises(ConfigError, match="model.position: 'alibi' is set but init_from=.* loads its architecture"):
        finetune_config(data_dir, tiny_encoder, minilm_dir, csv_files["train"], **{"model.position": "alibi"})
    too_long = finetune_config(data_dir, tiny_encoder, minilm_dir, csv_files["train"], **{"data.max_len": 100})
    with pytest.raises(ValueError, match="data.max_len=100 exceeds the model's 64 positions"):
        Finetuner(too_long, tmp_path / "work")
    small = tmp_path / "small_vocab"
    transformers.BertModel(transformers.BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=64,
                                                   max_position_embeddings=64)).save_pretrained(small)
    with pytest.raises(ValueError, match="has 30522 tokens but the model's vocab_size is 1000"):
        Finetuner(finetune_config(data_dir, small, minilm_dir, csv_files["train"]), tmp_path / "work")
    gpt = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=30522, n_embd=32, n_layer=1, n_head=2,
                                                         n_positions=64)).save_pretrained(gpt)
    cfg = finetune_config(data_dir, gpt, minilm_dir, csv_files["train"])
    with pytest.raises(ValueError, match="cannot start a text classifier: .*expected an encoder checkpoint"):
        Finetuner(cfg, tmp_path / "work")


def test_the_command_line_exits_2_on_bad_input(tmp_path):
    result = subprocess.run([sys.executable, "-m", "flaxzoo.train", "--config", "finetune_cls", "--workdir",
                             str(tmp_path / "w"), "--config.data.source=files"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "config error: data.train_path: '': source='files' needs a CSV / TSV / JSONL file" in result.stderr
    moved = subprocess.run([sys.executable, "-m", "flaxzoo.train", "--config", "finetune_cls", "--workdir",
                            str(tmp_path / "w"), "--config.compute_dtype=bfloat16"], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    assert moved.returncode == 2, moved.stderr
    errors = [line for line in moved.stderr.splitlines() if "error" in line]
    assert errors == ["config error: compute_dtype: moved to precision.compute_dtype (pre-training's key, the same "
                      "meaning): set --config.precision.compute_dtype=bfloat16 (config files: "
                      "c.precision.compute_dtype = 'bfloat16')"], moved.stderr


@pytest.mark.slow
def test_a_flaxzoo_mlm_workdir_starts_a_classifier(tmp_path, data_dir, csv_files):
    """``init_from`` = a ``python -m flaxzoo.train`` masked-LM work directory (its tokenizer with it): the encoder's weights
    come from the checkpoint, the pooler and classifier are new, and the run trains."""
    from flaxzoo.train.pretrain import Trainer
    from train_helper import make_config

    mlm = tmp_path / "mlm"
    Trainer(make_config("bert", data_dir, steps=4, checkpoint_every=4, eval_every=0,
                        **{"sample.max_new_tokens": 0}), mlm).run()
    cfg = finetune_config(data_dir, mlm, "", csv_files["train"], epochs=1, **{"data.test_path": str(csv_files["test"])})
    finetuner = Finetuner(cfg, tmp_path / "work")
    stored = models.from_pretrained(mlm)
    np.testing.assert_array_equal(
        np.asarray(finetuner.params["backbone"]["embeddings"]["tokens"]["embedding"]),
        np.asarray(stored.backbone.embeddings.tokens.embedding.get_value()))
    summary = finetuner.run()
    assert summary.steps == 6 and 0.0 <= summary.metrics["macro_f1"] <= 1.0
    assert len(models.load_tokenizer(tmp_path / "work").get_vocab()) == len(models.load_tokenizer(mlm).get_vocab())


# ------------------------------------------------------------------------------------------------------ LoRA
@pytest.mark.slow
def test_a_lora_finetune_trains_only_the_adapters_and_the_head(tmp_path, data_dir, tiny_encoder, minilm_dir,
                                                               csv_files):
    """``lora.rank`` > 0: the trained state is the adapters on attention + MLP and the fresh pooler + classifier
    (with ``freeze_steps`` and layer-wise LR decay on); the saved checkpoint is the merged classifier, whose encoder is
    the pretrained one (read back through transformers) plus ``A·B·alpha/rank`` on the adapted kernels only."""
    from flaxzoo.models.adapters.lora import LORA_A, LORA_B, has_lora

    cfg = finetune_config(data_dir, tiny_encoder, minilm_dir, csv_files["train"], epochs=1, freeze_steps=2,
                          **{"lora.rank": 4, "lora.alpha": 8.0, "data.test_path": str(csv_files["test"])})
    assert cfg.fully_trained and cfg.optim.layer_decay == 0.9
    finetuner = Finetuner(cfg, tmp_path / "work")
    initial_head = np.asarray(finetuner.params["classifier"]["kernel"])  # (the run donates the arrays it trains)
    summary = finetuner.run()
    trained = {".".join(map(str, k)): v for k, v in flat_leaves(finetuner.state["params"]).items()}
    adapted = {k.rsplit(".", 1)[0] for k in trained if k.endswith((LORA_A, LORA_B))}
    assert adapted == {f"backbone.layers.{i}.{m}" for i in range(2) for m in
                       ("attention.query", "attention.key", "attention.value", "attention.out", "mlp.up", "mlp.down")}
    head = {k for k in trained if not k.endswith((LORA_A, LORA_B))}
    assert head == {"pooler.kernel", "pooler.bias", "classifier.kernel", "classifier.bias"}
    # No optimizer state for the base: Adam's moments are the trained tensors' shapes, nothing else.
    moments = sorted(x.shape for x in jax.tree.leaves(finetuner.state["opt_state"]) if x.ndim)
    assert moments == sorted([v.shape for v in trained.values()] * 2)
    assert all(np.any(trained[f"{m}.{LORA_B}"]) for m in adapted)  # B starts at zero: every adapter trained
    assert not np.allclose(trained["classifier.kernel"], initial_head)
    assert summary.steps == 6  # (a random tiny encoder learns little in 6 steps: the real MiniLM's run is measured)
    # The checkpoint: a plain classifier (no adapters) equal to the pretrained encoder + the adapters' update.
    merged = models.from_pretrained(tmp_path / "work")
    assert isinstance(merged, BertForSequenceClassification) and not has_lora(merged)
    hf = transformers.BertModel.from_pretrained(tiny_encoder).state_dict()
    encoder = merged.backbone
    np.testing.assert_array_equal(encoder.embeddings.tokens.embedding.get_value(),
                                  hf["embeddings.word_embeddings.weight"].numpy())  # frozen, bit for bit
    np.testing.assert_array_equal(np.asarray(encoder.layers[1].mlp_norm.scale.get_value()),
                                  hf["encoder.layer.1.output.LayerNorm.weight"].numpy())
    np.testing.assert_array_equal(np.asarray(encoder.layers[0].attention.query.bias.get_value()).ravel(),
                                  hf["encoder.layer.0.attention.self.query.bias"].numpy())
    scale = 8.0 / 4
    for name, hf_name in [("attention.query", "attention.self.query"), ("mlp.down", "output.dense")]:
        kernel = np.asarray(getattr(getattr(encoder.layers[0], name.split(".")[0]), name.split(".")[1])
                            .kernel.get_value())
        a, b = trained[f"backbone.layers.0.{name}.{LORA_A}"], trained[f"backbone.layers.0.{name}.{LORA_B}"]
        base = hf[f"encoder.layer.0.{hf_name}.weight"].numpy().T  # torch keeps [out, in]
        np.testing.assert_allclose(kernel.reshape(base.shape), base + (a @ b) * scale, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(merged.classifier.kernel.get_value(), trained["classifier.kernel"])
    # The merged checkpoint predicts what the adapted model predicts.
    ids, mask = pad_batch(finetuner.encoded["test"], 0, limit=32)
    np.testing.assert_allclose(np.asarray(jax.nn.softmax(merged(jnp.asarray(ids), jnp.asarray(mask)), axis=-1)),
                               finetuner.probabilities("test"), atol=2e-5)


def flat_leaves(tree) -> dict[tuple, np.ndarray]:
    return {tuple(getattr(k, "key", k) for k in path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.parametrize("changes, match", [
    ({"lora.rank": -1}, "lora.rank: -1: expected an integer >= 0"),
    ({"lora.rank": 8, "lora.targets": "attention,gate"},
     "lora.targets: LoRA target 'gate' matches no projection of this BertForSequenceClassification"),
    ({"lora.rank": 8, "lora.train_fully": "decoder"},
     "lora.train_fully: 'decoder' matches no module with parameters; the module paths"),
    ({"lora.rank": 8, "lora.train_fully": "pooler"},
     "lora.train_fully: 'pooler' leaves the new classifier frozen at its random initialisation"),
    ({"lora.rank": 0, "lora.targets": "attention"}, "lora.rank: 0 turns LoRA off, but lora.targets is set"),
])
def test_bad_lora_settings_are_refused_with_one_clear_error(changes, match, tmp_path, data_dir, tiny_encoder,
                                                            minilm_dir, csv_files):
    with pytest.raises(ConfigError, match=match):
        Finetuner(finetune_config(data_dir, tiny_encoder, minilm_dir, csv_files["train"], **changes), tmp_path / "w")


def test_lora_on_a_random_encoder_is_refused(data_dir, minilm_dir, csv_files):
    with pytest.raises(ConfigError, match="lora.rank: 8: LoRA adapts a pretrained encoder, but init_from='scratch'"):
        finetune_config(data_dir, "scratch", minilm_dir, csv_files["train"], **{"lora.rank": 8,
                                                                              "model.preset": "bert-tiny"})


def test_layer_decay_and_freezing_act_on_the_adapters_as_on_the_weights():
    """With LoRA the optimizer sees the adapters and the head: an adapter of layer i learns at lr · decay^(L+1-i),
    and stays still while the head trains alone (``freeze_steps``)."""
    from flaxzoo.models.adapters.lora import LoraConfig, apply_lora, frozen_and_trainable

    config = get_preset("bert-tiny", num_labels=3)
    model = nnx.eval_shape(lambda: apply_lora(BertForSequenceClassification(config, rngs=nnx.Rngs(0)),
                                              LoraConfig(rank=2, alpha=4.0)))
    params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),  # (the values do not enter: no weight decay)
                          nnx.to_pure_dict(nnx.state(model, frozen_and_trainable(("head",)))))
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
    optim = OptimConfig(lr=1e-3, warmup_steps=0, schedule="constant", weight_decay=0.0, grad_clip=0.0,
                        layer_decay=0.5)
    (update,) = first_updates(optim, params, grads)
    frozen = first_updates(optim, params, grads, freeze_steps=1, updates=1)
    expected = {"layers.0": 1e-3 * 0.5 ** 2, "layers.1": 1e-3 * 0.5, "pooler": 1e-3, "classifier": 1e-3}
    seen = set()
    for (path, value), still in zip(jax.tree_util.tree_flatten_with_path(update)[0], jax.tree.leaves(frozen[0])):
        name = ".".join(str(getattr(p, "key", p)) for p in path)
        group = next(g for g in expected if f".{g}." in f".{name}.")
        seen.add(group)
        np.testing.assert_allclose(np.asarray(value), -expected[group], rtol=1e-4, err_msg=name)
        assert np.any(still) == (group in ("pooler", "classifier")), name  # the head alone in the frozen step
    assert seen == set(expected) and any("kernel_lora_a" in str(p) for p, _ in
                                         jax.tree_util.tree_flatten_with_path(update)[0])
