"""The text-to-text fine-tuner (``task="seq2seq"``, ``flaxzoo.train.finetune.seq2seq``): its batches, its scores
against the scoring libraries, packed pairs against pairs alone, the settings it refuses, and (slow) the command
line: the reversal task learned (exact match >= 90 %), a SIGKILL mid-run resumed to the uninterrupted run's losses
and scores bit for bit, the export loaded by transformers with equal logits."""

from __future__ import annotations

import json
import pathlib
import re
import signal
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from flaxzoo import models
from flaxzoo.models.architectures.encoder_decoder.model import Seq2SeqForConditionalGeneration
from flaxzoo.models.families import get_preset
from flaxzoo.train.batches import IGNORE_INDEX
from flaxzoo.train.config import ConfigError
from flaxzoo.train.finetune.config import FinetuneConfig, base_config
from flaxzoo.train.finetune.seq2seq import (REVERSE_WORDS, pack_pairs, packed_pair_batch, pair_batch,
                                           reverse_word_pairs, text_scores)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from test_finetune_engine import run, run_until  # noqa: E402


def test_pair_batch_shifts_the_targets_behind_the_start_id():
    batch = pair_batch([([5, 6, 7], [8, 9, 2]), ([4], [3, 2])], pad_id=0, start_id=1, max_len=4, target_max_len=4)
    np.testing.assert_array_equal(batch["input_ids"], [[5, 6, 7, 0], [4, 0, 0, 0]])
    np.testing.assert_array_equal(batch["attention_mask"], [[1, 1, 1, 0], [1, 0, 0, 0]])
    np.testing.assert_array_equal(batch["labels"], [[8, 9, 2, IGNORE_INDEX], [3, 2, IGNORE_INDEX, IGNORE_INDEX]])
    np.testing.assert_array_equal(batch["decoder_input_ids"], [[1, 8, 9, 2], [1, 3, 2, 0]])
    np.testing.assert_array_equal(batch["decoder_attention_mask"], [[1, 1, 1, 1], [1, 1, 1, 0]])


def test_reverse_word_pairs_are_reversals_and_reproducible():
    pairs = reverse_word_pairs(300, seed=4)
    assert pairs == reverse_word_pairs(300, seed=4) and pairs != reverse_word_pairs(300, seed=5)
    for source, target in pairs:
        assert target.split() == source.split()[::-1] and 3 <= len(source.split()) <= 8
        assert set(source.split()) <= set(REVERSE_WORDS)


def test_text_scores_are_the_libraries_scores():
    """Exact match after collapsing whitespace; ROUGE-1 of "the cat sat" against "the cat sat down" is
    2 · 3/3 · 3/4 / (3/3 + 3/4) = 85.71 %; identical texts give BLEU and chrF 100."""
    scores = text_scores(["the cat sat", "a  dog ran "], ["the cat sat down", "a dog ran"])
    assert scores["exact_match"] == 50.0
    assert scores["rouge1"] == pytest.approx(100 * (6 / 7 + 1.0) / 2)
    same = text_scores(["one two three four five"], ["one two three four five"])
    assert same["bleu"] == pytest.approx(100.0) and same["chrf"] == pytest.approx(100.0)
    assert same["rouge2"] == pytest.approx(100.0) and same["rougeL"] == pytest.approx(100.0)


@pytest.mark.slow  # the quick tier's packing test is the loss's below
def test_packed_pairs_give_the_logits_of_each_pair_alone():
    """Two pairs in one row (segment ids on both sides: a target reads only its own source) equal the two pairs
    in rows of their own, position by position."""
    config = get_preset("t5-tiny", scan_layers=False)
    model = Seq2SeqForConditionalGeneration(config, rngs=nnx.Rngs(3))
    rng = np.random.default_rng(0)
    sources = [rng.integers(2, 1000, 7), rng.integers(2, 1000, 5)]
    targets = [rng.integers(2, 1000, 4), rng.integers(2, 1000, 6)]
    alone = [np.asarray(model(s[None], None, t[None]))[0] for s, t in zip(sources, targets)]
    source = np.concatenate([*sources, [0, 0]])[None]  # padding at the end of the packed row
    target = np.concatenate([*targets, [0]])[None]
    source_segments = np.array([[1] * 7 + [2] * 5 + [0, 0]])
    target_segments = np.array([[1] * 4 + [2] * 6 + [0]])
    packed = np.asarray(model(source, None, target, segment_ids=source_segments,
                              decoder_segment_ids=target_segments))[0]
    np.testing.assert_allclose(packed[:4], alone[0], atol=1e-5)
    np.testing.assert_allclose(packed[4:10], alone[1], atol=1e-5)
    assert np.isfinite(packed).all()


def test_pack_pairs_fills_rows_in_order_while_both_sides_fit():
    pairs = [([1] * 3, [2] * 2), ([3] * 2, [4] * 3), ([5] * 4, [6]), ([7], [8] * 5), ([9] * 6, [1])]
    rows = pack_pairs(pairs, max_len=6, target_max_len=5)
    assert rows == [pairs[:2], pairs[2:3], pairs[3:4], pairs[4:]]  # 3+2 / 2+3; then 4 + 1 > 6; 1 + 5 > 5 ...
    assert [pair for row in rows for pair in row] == pairs


@pytest.mark.parametrize("preset", ["t5-tiny", "bart-tiny"])
def test_packed_rows_give_the_loss_of_their_pairs_alone(preset):
    """The training loss of packed rows (segment ids on both sides, each target behind its own start id; BART's
    learned positions restart per pair) equals the pairs in rows of their own: the summed token losses and the
    counts (1e-5)."""
    from flaxzoo.train.losses import seq2seq_lm_loss

    config = get_preset(preset, scan_layers=False, dropout=0.0, attention_dropout=0.0)
    model = Seq2SeqForConditionalGeneration(config, rngs=nnx.Rngs(4))
    model.eval()
    rng = np.random.default_rng(1)
    pairs = [(rng.integers(4, 900, int(rng.integers(2, 7))).tolist(), [*rng.integers(4, 900, int(n)).tolist(), 2])
             for n in rng.integers(1, 5, 9)]
    rows = pack_pairs(pairs, max_len=16, target_max_len=12)
    assert len(rows) < len(pairs)
    ids = dict(pad_id=config.pad_token_id, start_id=config.decoder_start_token_id, max_len=16, target_max_len=12)
    loss = nnx.jit(seq2seq_lm_loss)
    packed = [float(x) for x in loss(model, packed_pair_batch(rows, **ids))]
    alone = np.sum([[float(x) for x in loss(model, pair_batch([pair], **ids))] for pair in pairs], 0)
    assert packed[1] == alone[1] == sum(len(target) for _, target in pairs)
    np.testing.assert_allclose(packed, alone, rtol=1e-5)


@pytest.mark.slow_variants
@pytest.mark.parametrize("preset, scan", [("bart-tiny", False), ("t5-tiny", True)])
def test_int8_encoder_decoders_quantise_every_projection_cross_attention_included(preset, scan, tmp_path):
    """``from_pretrained(..., quantize="int8")`` of an encoder-decoder holds int8 kernels in every self-attention,
    cross-attention and MLP projection of both stacks, bit-equal to qwix's PTQ of the float model, and its logits
    equal the float model's with each projection's weight replaced by its dequantised int8 value (numpy)."""
    from flaxzoo.models.adapters.quantize import module_at, projection_paths, quantize_dense

    config = get_preset(preset, scan_layers=scan)
    models.save_pretrained(models.create_model(config, Seq2SeqForConditionalGeneration), tmp_path)
    int8, dequantised = models.from_pretrained(str(tmp_path), quantize="int8"), models.from_pretrained(str(tmp_path))
    paths = projection_paths(int8)
    names = {".".join(map(str, path[-2:])) for path in paths}
    assert {f"{a}.{p}" for a in ("attention", "cross_attention") for p in ("query", "key", "value", "out")} <= names
    stacks = {path[0] for path in paths}  # ("encoder" | "decoder", "layers", ...)
    assert stacks == {"encoder", "decoder"} and len(paths) == len(projection_paths(dequantised))
    for path in paths:
        streamed, reference = module_at(int8, path), quantize_dense(module_at(dequantised, path))
        q, scale = (np.asarray(getattr(streamed.kernel.array, name)[...]) for name in ("qvalue", "scale"))
        assert q.dtype == np.int8
        for name in ("qvalue", "scale"):
            np.testing.assert_array_equal(np.asarray(getattr(reference.kernel.array, name)[...]),
                                          getattr(streamed.kernel.array, name)[...])
        module_at(dequantised, path).kernel.set_value(jnp.asarray(q.astype(np.float32) * scale))
    ids = np.array([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]])
    target = np.array([[config.decoder_start_token_id, 4, 5, 6], [config.decoder_start_token_id, 7, 8, 0]])
    np.testing.assert_allclose(np.asarray(int8(ids, ids != 0, target, target != 0)),
                               np.asarray(dequantised(ids, ids != 0, target, target != 0)), atol=2e-5)


def resolved(config, values) -> FinetuneConfig:
    """``config`` with the dotted keys of ``values`` set (``{"data.max_len": 3}``), resolved."""
    for key, value in values.items():
        target = config
        *parents, leaf = key.split(".")
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    return FinetuneConfig.from_config_dict(config)


def seq2seq_config(**values) -> FinetuneConfig:
    config = base_config()
    config.task = "seq2seq"
    config.data.source = "reverse_words"
    return resolved(config, values)


@pytest.mark.parametrize("values, key", [
    ({"freeze_steps": 3}, "freeze_steps"),
    ({"optim.layer_decay": 0.8}, "optim.layer_decay"),
    ({"num_labels": 4}, "num_labels"),
    ({"data.source": "bbc_headlines"}, "data.source"),
    ({"data.source": "files", "data.train_path": "x.jsonl"}, "data.test_path"),
    ({"data.source": "span_corruption", "data.pack_pairs": True}, "data.pack_pairs"),
])
def test_settings_of_a_classifier_are_refused_by_name(values, key):
    with pytest.raises(ConfigError, match=rf"{key}"):
        seq2seq_config(**values)


def test_a_tokenizer_kind_is_trained_for_a_model_from_scratch_only():
    """``tokenizer="wordpiece"`` / ``"bpe"``: trained on the training texts, for ``init_from="scratch"``; a
    pretrained ``init_from`` has its own, and the refusal names the key and the value."""
    assert seq2seq_config(**{"init_from": "scratch", "tokenizer": "bpe", "model.preset": "t5-tiny"}).tokenizer == "bpe"
    with pytest.raises(ConfigError, match=r"tokenizer: 'wordpiece' trains a tokenizer for a model from scratch"):
        seq2seq_config(**{"init_from": "", "tokenizer": "wordpiece"})


def test_a_trained_tokenizer_is_trained_once_per_texts_and_read_back_after(tmp_path):
    """``cached_trained_tokenizer``: the first call trains and writes ``tokenizer.json``, a later call with the same
    identity reads it without asking for the texts; another identity trains again."""
    from flaxzoo.train.data.tokenizers import cached_trained_tokenizer

    asked = []

    def texts():
        asked.append(1)
        return [" ".join(pair) for pair in reverse_word_pairs(200, seed=5)]

    first = cached_trained_tokenizer(texts, "wordpiece", 96, str(tmp_path), identity="a")
    again = cached_trained_tokenizer(texts, "wordpiece", 96, str(tmp_path), identity="a")
    assert len(asked) == 1 and first.tokenizer.to_str() == again.tokenizer.to_str() and first.vocab_size <= 96
    cached_trained_tokenizer(texts, "wordpiece", 96, str(tmp_path), identity="b")
    assert len(asked) == 2 and len(list((tmp_path / "tokenizers").glob("wordpiece_*/tokenizer.json"))) == 2


def test_beams_and_the_seq2seq_sources_belong_to_seq2seq():
    config = base_config()
    config.num_beams = 4
    with pytest.raises(ConfigError, match=r"num_beams: 4: .*task='seq2seq'"):
        FinetuneConfig.from_config_dict(config)
    for source in ("reverse_words", "span_corruption", "tfds:wmt14_translate/de-en"):
        config = base_config()
        config.data.source = source
        with pytest.raises(ConfigError, match=rf"data.source: '{source}' is task='seq2seq'"):
            FinetuneConfig.from_config_dict(config)


# ------------------------------------------------------------------------------------------------ the command line
def command(workdir, **values) -> list[str]:
    values = {"log_every": 10, **values}
    return ["--config", "seq2seq_reverse", "--workdir", str(workdir), *(f"--config.{k}={v}" for k, v in values.items())]


def losses(workdir) -> dict[int, float]:
    rows = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if "loss" in row}


def write_pairs(path: pathlib.Path, count: int, seed: int) -> pathlib.Path:
    path.write_text("".join(json.dumps({"text": s, "target": t}) + "\n" for s, t in reverse_word_pairs(count, seed)))
    return path


@pytest.mark.slow
@pytest.mark.timeout(900)  # four training runs in subprocesses: the documented one (750 steps), three short ones
def test_the_reversal_task_is_learned_resumed_after_sigkill_and_exported(tmp_path):
    """``python -m flaxzoo.train --config seq2seq_reverse`` learns to reverse held-out word sequences (exact match
    >= 90 %); a run on packed pairs killed (SIGKILL) mid-run and run again ends with the uninterrupted run's losses,
    scores and predictions; ``generate_text`` reverses new prompts; the exported model loads in transformers with equal
    logits."""
    # The documented run with XLA's default code generation: 750 steps run 2.5x faster than at the test processes'
    # -O0 (56 s -> 22 s for 125 steps with their compile, 2-core AMD EPYC), which only pays for short runs.
    whole = run(command(tmp_path / "whole"), timeout=900, XLA_FLAGS="")
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    metrics = json.loads((tmp_path / "whole" / "eval" / "metrics.json").read_text())
    print(f"\n  reversal: exact match {metrics['exact_match']:.1f}%, ROUGE-L {metrics['rougeL']:.1f}, BLEU "
          f"{metrics['bleu']:.1f}, {metrics['steps']} steps in {metrics['train_s']} s")
    assert metrics["exact_match"] >= 90.0

    # resume, on packed pairs from files: 96 pairs in rows of several, 2 epochs of batches of 16 rows, a checkpoint
    # every 2 steps, every step logged, killed after step 5 and run again
    files = {"data.source": "files", "data.train_path": write_pairs(tmp_path / "train.jsonl", 96, seed=11),
             "data.test_path": write_pairs(tmp_path / "test.jsonl", 24, seed=12), "data.pack_pairs": True,
             "batch_size": 16, "eval_batch_size": 24, "epochs": 2, "checkpoint_every": 2, "log_every": 1}
    uninterrupted = run(command(tmp_path / "short", **files), timeout=600)
    assert uninterrupted.returncode == 0, uninterrupted.stdout[-3000:] + uninterrupted.stderr[-3000:]
    packed = re.search(r"packed: 96 training pairs in (\d+) rows", uninterrupted.stdout)
    assert packed and int(packed.group(1)) < 96, uninterrupted.stdout[-3000:]
    args = command(tmp_path / "killed", **files)
    code, out = run_until(args, "step 5/", signal.SIGKILL, tmp_path)
    assert code == -signal.SIGKILL, out[-3000:]
    again = run(args, timeout=600)
    assert again.returncode == 0 and "resumed from checkpoint at step" in again.stdout, again.stdout[-3000:]
    assert sorted(losses(tmp_path / "short")) == list(range(1, 2 * -(-int(packed.group(1)) // 16) + 1))
    assert losses(tmp_path / "killed") == losses(tmp_path / "short")
    resumed, reference = (json.loads((tmp_path / name / "eval" / "metrics.json").read_text())
                          for name in ("killed", "short"))
    for key in ("exact_match", "rouge1", "rouge2", "rougeL", "bleu", "chrf"):
        assert resumed[key] == reference[key], key
    assert ((tmp_path / "killed" / "eval" / "predictions.jsonl").read_text()
            == (tmp_path / "short" / "eval" / "predictions.jsonl").read_text())

    model = models.from_pretrained(str(tmp_path / "whole"))
    tokenizer = models.load_tokenizer(str(tmp_path / "whole"))
    prompts = ["cat dog sun moon", "one two three", "red sea star blue five", "tree house car", "six eight fish"]
    wanted = [" ".join(p.split()[::-1]) for p in prompts]
    for beams in (1, 4):  # generate_text takes the encoder-decoder: greedy and beam search
        texts = models.generate_text(model, tokenizer, prompts, max_new_tokens=12, num_beams=beams)
        assert sum(t == w for t, w in zip(texts, wanted)) >= 4, texts
    models.save_pretrained(model, tmp_path / "hf")
    hf = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    words = tokenizer.encode("cat dog sun moon", add_special_tokens=False).ids  # the trained pieces: a word each
    assert len(words) == 4 and tokenizer.get_vocab_size() <= model.config.vocab_size
    source = np.array([[*words, model.config.eos_token_id, 0]])
    target = np.array([[0, *words[::-1][:3]]])
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(source), attention_mask=torch.tensor(source != 0),
                    decoder_input_ids=torch.tensor(target)).logits.numpy()
    ours = np.asarray(model(jnp.asarray(source), jnp.asarray(source != 0), jnp.asarray(target)))
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def prepared_tfds_pairs(data_dir: pathlib.Path, sizes: dict[str, int]) -> str:
    """A TFDS dataset of reversal pairs (features ``words`` → ``reversed``, splits ``sizes``) prepared as
    array_record in ``data_dir``; its name. Readers need not import the builder: TFDS reads the prepared files."""
    import tensorflow_datasets as tfds

    with tfds.core.registered.skip_registration():  # a class per call: none in TFDS's registry of names
        class ReversalPairs(tfds.core.GeneratorBasedBuilder):
            VERSION = tfds.core.Version("1.0.0")

            def _info(self):
                return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
                    {"words": tfds.features.Text(), "reversed": tfds.features.Text()}))

            def _split_generators(self, dl_manager):
                return {split: self._generate_examples(count, seed)
                        for seed, (split, count) in enumerate(sizes.items())}

            def _generate_examples(self, count, seed):
                for i, (words, reversed_words) in enumerate(reverse_word_pairs(count, seed)):
                    yield i, {"words": words, "reversed": reversed_words}

    ReversalPairs(data_dir=str(data_dir), file_format="array_record").download_and_prepare(
        file_format="array_record")
    return ReversalPairs.name


def test_pairs_of_a_tfds_dataset_are_read_by_its_fields(tmp_path):
    """``data.source="tfds:NAME"``: the prepared dataset's pairs per split (train, test; its validation when it has
    both), by ``data.text_field`` / ``data.target_field``; a missing field is named with the features."""
    from flaxzoo.train.finetune.seq2seq import tfds_pairs

    name = prepared_tfds_pairs(tmp_path, {"train": 12, "test": 5, "validation": 3})
    values = {"data.source": f"tfds:{name}", "data.data_dir": str(tmp_path), "data.text_field": "words",
              "data.target_field": "reversed"}
    pairs, description = tfds_pairs(seq2seq_config(**values).data)
    assert {split: len(p) for split, p in pairs.items()} == {"train": 12, "test": 5, "validation": 3}
    assert sorted(pairs["train"]) == sorted(reverse_word_pairs(12, 0)) and "test = its test" in description
    with pytest.raises(ValueError, match=r"no feature 'target' .* expected one of \['reversed', 'words'\]"):
        tfds_pairs(seq2seq_config(**{**values, "data.target_field": "target"}).data)


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_two_processes_of_two_devices_give_the_losses_and_scores_of_one_process_of_four(tmp_path):
    """The reversal T5 from scratch on a TFDS dataset's pairs, FSDP over 4 devices: 2 processes x 2 devices train
    with the losses of 1 process x 4 (1e-5) and decode the same test predictions."""
    import subprocess

    from train_helper import helper_process_env

    name = prepared_tfds_pairs(tmp_path / "tfds", {"train": 96, "test": 16})
    files = {"data.source": f"tfds:{name}", "data.data_dir": tmp_path / "tfds", "data.text_field": "words",
             "data.target_field": "reversed", "batch_size": 16, "eval_batch_size": 16, "epochs": 1,
             "checkpoint_every": 0, "log_every": 1, "mesh.data": 1, "mesh.fsdp": 4}
    one = run(command(tmp_path / "one", **files), timeout=400, JAX_NUM_CPU_DEVICES="4")
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "flaxzoo.train.launch", "--processes", "2", "--devices-per-process",
                          "2", "--module", "multihost_helper", "--", "train", *command(tmp_path / "two", **files)],
                         cwd=pathlib.Path(__file__).resolve().parent.parent, env=helper_process_env(),
                         capture_output=True, text=True, timeout=400)
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-5000:]
    assert "(2 process(es))" in two.stdout and "mesh data=1 x fsdp=4 x tensor=1" in two.stdout
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert a.keys() == b.keys() == set(range(1, 7))
    assert max(abs(a[s] - b[s]) for s in a) <= 1e-5, (a, b)
    assert ((tmp_path / "one" / "eval" / "predictions.jsonl").read_text()
            == (tmp_path / "two" / "eval" / "predictions.jsonl").read_text())


def test_lora_trains_the_adapters_alone_by_default():
    """An encoder-decoder has no fresh head: LoRA's ``train_fully`` "" trains nothing beside the adapters (a
    classifier's trains its head)."""
    assert seq2seq_config(**{"lora.rank": 4}).fully_trained == ()
    assert seq2seq_config(**{"lora.rank": 4, "lora.train_fully": "head"}).fully_trained == ("head",)
    config = base_config()
    config.lora.rank = 4
    assert FinetuneConfig.from_config_dict(config).fully_trained == ("head",)
