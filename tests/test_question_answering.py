"""Extractive question answering as a fine-tuning task (``task="qa"``, ``flaxzoo.train.finetune.qa``): the official
SQuAD v1.1 scores against hand-computed values, the answer's characters to word pieces and back, windows over a
long context, and a tiny BERT fine-tuned on a made-up SQuAD-style file through the CLI's config (loss falls, exact
match and F1 written to ``eval/metrics.json``, the export loads as a ``BertForQuestionAnswering``)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from finetune_data import write_squad, write_vocab
from flaxzoo import models
from flaxzoo.models import BertForQuestionAnswering, load_tokenizer
from flaxzoo.train.config import ConfigError
from flaxzoo.train.finetune.config import FinetuneConfig
from flaxzoo.train.finetune.spans import (CLS_INDEX, Question, answer_pieces, best_answers, encode_questions,
                                          exact_match, f1_score, normalize_answer, read_squad, squad_scores)
from flaxzoo.train.losses import LOSSES


# ------------------------------------------------------------------------------------------------- the metrics
def test_normalisation_is_squad_v1_1s():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"  # punctuation removed, not spaced
    assert normalize_answer("an apple, a pear and THE plum") == "apple pear and plum"
    assert normalize_answer("theatre") == "theatre"  # articles as whole words only
    assert normalize_answer("  ") == ""


def test_exact_match_and_f1_against_hand_computed_values():
    assert exact_match("The Denver Broncos", "denver broncos") == 1.0
    assert exact_match("Denver", "denver broncos") == 0.0
    # prediction {denver, broncos, won} vs truth {denver, broncos}: precision 2/3, recall 1, F1 = 0.8
    assert f1_score("the Denver Broncos won", "Denver Broncos") == pytest.approx(0.8)
    # bags: "a a b" vs "a b b": common = {a: 1, b: 1} -> precision 2/3, recall 2/3 (articles are "a": use x / y)
    assert f1_score("x x y", "x y y") == pytest.approx(2 / 3)
    assert f1_score("cat", "dog") == 0.0 and f1_score("", "") == 0.0  # v1.1: no shared token, 0
    # max over the gold answers, then the mean in percent: q1 EM 1 F1 1; q2 EM 0, F1 = 2*(1/2*1)/(1.5) = 2/3
    found = squad_scores(["Paris", "in Rome"], [["london", "paris"], ["rome", "milan"]])
    assert found["exact_match"] == pytest.approx(50.0)
    assert found["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    with pytest.raises(ValueError, match="1 predictions for 2 questions"):
        squad_scores(["x"], [["x"], ["y"]])


def test_an_unanswerable_question_scores_a_correct_abstention_full_marks():
    # SQuAD 2.0: no gold answer; "" (normalised empty) is right on both scores, any text wrong on both
    found = squad_scores(["", "The", "Paris"], [[], [], []])
    assert found["exact_match"] == pytest.approx(200 / 3) and found["f1"] == pytest.approx(200 / 3)


# ------------------------------------------------------------------------------------------------ span mapping
@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(write_vocab(tmp_path_factory.mktemp("qa_vocab")))


def test_a_character_span_maps_to_pieces_and_back(tokenizer):
    context = "today omar lives in oslo . the car of lena is green ."
    start = context.index("oslo")
    q = Question("1", "where does omar live ?", context, (("oslo", start),))
    (window,) = encode_questions(tokenizer, [q], max_len=64, doc_stride=16, max_query_length=16)
    assert window.input_ids[window.start] == tokenizer.token_to_id("oslo") and window.start == window.end
    begin, end = window.offsets[window.start][0], window.offsets[window.end][1]
    assert context[begin:end] == "oslo"
    two = "the car of lena"
    first, last = answer_pieces(window.offsets, context.index(two), context.index(two) + len(two))
    assert context[window.offsets[first][0]:window.offsets[last][1]] == two and last - first == 3
    assert window.offsets[0] is None and window.offsets[1] is None  # [CLS] and the question: outside the context
    assert window.token_type_ids[window.start] == 1 and window.token_type_ids[1] == 0


def test_windows_with_a_stride_cover_a_long_context_and_point_elsewhere_at_cls(tokenizer):
    context = " ".join(f"{w} ." for w in ["alice", "bob", "maria", "john", "wei", "olga", "omar", "lena"] * 3)
    start = context.rindex("lena")
    q = Question("2", "where does lena live ?", context, (("lena", start),))
    pieces = len(tokenizer.encode(context, add_special_tokens=False).ids)  # 48
    windows = encode_questions(tokenizer, [q], max_len=20, doc_stride=5, max_query_length=3)
    # the question cut to 3 pieces: [CLS] q q q [SEP] ... [SEP] leaves 15 context pieces a window
    room = 20 - 5
    assert all(sum(o is not None for o in w.offsets) <= room for w in windows)
    firsts = [min(o[0] for o in w.offsets if o is not None) for w in windows]
    piece_starts = [o[0] for o in tokenizer.encode(context, add_special_tokens=False).offsets]
    assert [piece_starts.index(f) for f in firsts] == list(range(0, 5 * len(windows), 5))  # a window every 5 pieces
    covered = {o for w in windows for o in w.offsets if o is not None}
    assert len(covered) == pieces and len(windows) == 1 + -(-(pieces - room) // 5)
    holding = [w for w in windows if w.start != CLS_INDEX]
    assert holding and all(context[w.offsets[w.start][0]:w.offsets[w.end][1]] == "lena" for w in holding)
    assert all(w.start == w.end == CLS_INDEX for w in windows if not any(
        o is not None and o[0] == start for o in w.offsets))


def test_the_best_span_is_chosen_across_windows_inside_the_context(tokenizer):
    context = "omar lives in oslo . lena lives in rome ."
    q = Question("3", "where does lena live ?", context, (("rome", context.index("rome")),))
    windows = encode_questions(tokenizer, [q], max_len=14, doc_stride=3, max_query_length=8)
    assert len(windows) > 1
    starts = [np.zeros(len(w.input_ids)) for w in windows]
    ends = [np.zeros(len(w.input_ids)) for w in windows]
    for w, s, e in zip(windows, starts, ends):
        s[1] = e[1] = 50.0  # a question piece: never an answer
        for i, span in enumerate(w.offsets):
            text = None if span is None else context[span[0]:span[1]]
            if text == "rome":
                s[i], e[i] = 5.0, 5.0
            elif text == "lena":
                s[i] = 8.0
            elif text == "oslo":
                e[i] = 9.0  # with lena's start 17, but it ends before it starts
    # lena .. rome (4 pieces): 13 beats rome alone (10) and [CLS] .. oslo (9); lena .. oslo is no span
    assert best_answers([q], windows, starts, ends, max_answer_length=5) == ["lena lives in rome"]
    assert best_answers([q], windows, starts, ends, max_answer_length=3) == ["rome"]


def test_a_squad_file_is_read_and_a_misplaced_answer_refused(tmp_path):
    questions = read_squad(write_squad(tmp_path / "ok.json", 3, seed=0))
    assert len(questions) == 3 and all(q.context[a:a + len(t)] == t for q in questions for t, a in q.answers)
    bad = {"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [
        {"id": "x", "question": "q", "answers": [{"text": "bc", "answer_start": 0}]}]}]}]}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="'bc' is not at answer_start=0"):
        read_squad(tmp_path / "bad.json")


def test_span_loss_is_the_mean_of_start_and_end_cross_entropies():
    from flaxzoo.models.architectures.encoder.model import SpanLogits

    class Fixed:
        config = models.get_preset("bert-tiny")  # the step reads its type_vocab_size

        def __call__(self, ids, mask, types):
            return SpanLogits(jnp.asarray([[2.0, 0.0, 1.0, 7.0]]), jnp.asarray([[0.0, 3.0, 0.0, 7.0]]))

    batch = {"input_ids": jnp.zeros((1, 4), jnp.int32), "attention_mask": jnp.asarray([[1, 1, 1, 0]]),
             "start_positions": jnp.asarray([0]), "end_positions": jnp.asarray([1]),
             "example_weights": jnp.asarray([2.0])}
    loss, count, hits = LOSSES["span"](Fixed(), batch)
    start = -np.log(np.exp(2) / (np.exp(2) + 1 + np.exp(1)))  # the padded position excluded
    end = -np.log(np.exp(3) / (np.exp(3) + 2))
    assert float(loss) == pytest.approx(2 * (start + end) / 2, rel=1e-5) and float(count) == 2 and float(hits) == 2


# ------------------------------------------------------------------------------------------------ the engine
@pytest.fixture(scope="module")
def qa_run(tmp_path_factory):
    from flaxzoo.train.tools import compile as compilelib
    from flaxzoo.train.finetune.qa import QuestionAnswering

    root = tmp_path_factory.mktemp("qa")
    vocab = write_vocab(root / "vocab")
    torch.manual_seed(0)
    hf = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=len((vocab / "vocab.txt").read_text().split()), hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, pad_token_id=0))
    hf.save_pretrained(root / "bert")
    config = compilelib.load_config("finetune_qa", [
        f"--config.init_from={root / 'bert'}", f"--config.tokenizer={vocab}", "--config.epochs=4",
        "--config.batch_size=16", "--config.eval_batch_size=16", "--config.log_every=1", "--config.optim.lr=3e-3",
        "--config.data.max_len=32", "--config.data.doc_stride=8", "--config.data.max_query_length=10",
        "--config.data.max_answer_length=4", f"--config.data.data_dir={root / 'data'}",
        f"--config.data.train_path={write_squad(root / 'train.json', 48, seed=1)}",
        f"--config.data.test_path={write_squad(root / 'dev.json', 16, seed=2)}"])
    task = QuestionAnswering(FinetuneConfig.from_config_dict(config), root / "work")
    return root / "work", task, task.run()


@pytest.mark.slow
def test_a_tiny_bert_learns_squad_style_questions_on_the_engine(qa_run):
    workdir, task, summary = qa_run
    assert task.MODEL is BertForQuestionAnswering and len(task.encoded["train"]) > 48  # long contexts: windows
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if "loss" in row]
    metrics = json.loads((workdir / "eval" / "metrics.json").read_text())
    print(f"\n  qa: {len(losses)} steps, losses {[round(x, 3) for x in losses]}; dev EM {metrics['exact_match']:.2f}, "
          f"F1 {metrics['f1']:.2f} on {metrics['test_questions']} questions ({metrics['test_windows']} windows)")
    assert len(losses) == summary.steps and np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.3
    assert 0 <= metrics["exact_match"] <= metrics["f1"] <= 100
    assert (metrics["exact_match"], metrics["f1"]) == (summary.metrics["exact_match"], summary.metrics["f1"])
    predictions = [json.loads(line) for line in (workdir / "eval" / "predictions.jsonl").read_text().splitlines()]
    truths = [p["answers"] for p in predictions]
    assert squad_scores([p["predicted"] for p in predictions], truths)["f1"] == pytest.approx(metrics["f1"])
    model = models.from_pretrained(workdir)
    assert isinstance(model, BertForQuestionAnswering)

    from flaxzoo.train.finetune.qa import QuestionAnswering

    again = QuestionAnswering(task.cfg, workdir).run()  # a finished work directory is left alone, its scores read
    assert again.metrics["f1"] == metrics["f1"] and again.train_s == 0.0


def test_qa_settings_are_checked_by_name(tmp_path):
    from flaxzoo.train.finetune.config import base_config

    c = base_config()
    c.task, c.data.source, c.data.train_path = "qa", "files", "train.json"
    with pytest.raises(ConfigError, match="data.test_path.*SQuAD-style JSON"):
        FinetuneConfig.from_config_dict(c)
    c.data.test_path, c.class_weights = "dev.json", "balanced"
    with pytest.raises(ConfigError, match="class_weights.*task='qa'"):
        FinetuneConfig.from_config_dict(c)


@pytest.mark.parametrize("key", ["doc_stride", "max_query_length", "max_answer_length"])
def test_qa_window_settings_are_refused_for_other_tasks(key):
    from flaxzoo.train.finetune.config import base_config

    c = base_config()
    setattr(c.data, key, 7)
    with pytest.raises(ConfigError, match=rf"^data.{key}: 7 applies to task='qa'.*task='classify'"):
        FinetuneConfig.from_config_dict(c)
