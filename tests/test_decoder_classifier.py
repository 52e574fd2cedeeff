"""Decoder sequence classification (``GPTForSequenceClassification``) against transformers v5's
``LlamaForSequenceClassification`` / ``Qwen2...`` / ``Qwen3...`` / ``Mistral...``: logits both ways on a left- and a
right-padded batch, the row read at its last real token (transformers' rule from ``pad_token_id``), a causal-LM
checkpoint loaded as a classifier (the score initialised and said), and a fine-tune of a tiny Llama classifier through
the fine-tuning engine. Figures print with ``-s``."""

from __future__ import annotations

import json
import random
from typing import Callable

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from family_parity import SMALL, VOCAB, checkpoint_fixture, forward, hf_logits, loaded, perturbed, tiered
from flaxzoo import models
from flaxzoo.models import GPTForCausalLM, GPTForSequenceClassification
from flaxzoo.models.families import FAMILIES
from flaxzoo.models.architectures.decoder.model import last_token_index
from flaxzoo.models.io import from_pretrained, save_pretrained

ATOL, LABELS, PAD = 1e-4, 3, SMALL["pad_token_id"]


def _llama() -> torch.nn.Module:
    return transformers.LlamaForSequenceClassification(transformers.LlamaConfig(
        **SMALL, num_hidden_layers=2, num_labels=LABELS, tie_word_embeddings=False))


def _qwen2() -> torch.nn.Module:
    return transformers.Qwen2ForSequenceClassification(transformers.Qwen2Config(
        **SMALL, num_hidden_layers=2, num_labels=LABELS, use_sliding_window=True, sliding_window=6,
        max_window_layers=1))


def _qwen3() -> torch.nn.Module:
    return transformers.Qwen3ForSequenceClassification(transformers.Qwen3Config(
        **SMALL, num_hidden_layers=2, num_labels=LABELS, head_dim=24, tie_word_embeddings=True))


def _mistral() -> torch.nn.Module:
    return transformers.MistralForSequenceClassification(transformers.MistralConfig(
        **SMALL, num_hidden_layers=2, num_labels=LABELS, sliding_window=6))


def _gemma2() -> torch.nn.Module:
    return transformers.Gemma2ForSequenceClassification(transformers.Gemma2Config(
        **SMALL, num_hidden_layers=2, num_labels=LABELS, head_dim=16, sliding_window=6, query_pre_attn_scalar=16))


def _gemma3() -> torch.nn.Module:
    return transformers.Gemma3TextForSequenceClassification(transformers.Gemma3TextConfig(
        **SMALL, num_hidden_layers=2, num_labels=LABELS, head_dim=16, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"]))


def _phi3() -> torch.nn.Module:
    return transformers.Phi3ForSequenceClassification(transformers.Phi3Config(
        **SMALL, num_hidden_layers=2, num_labels=LABELS, sliding_window=6))


def _gpt_neox() -> torch.nn.Module:
    small = {k: v for k, v in SMALL.items() if k != "num_key_value_heads"}
    return transformers.GPTNeoXForSequenceClassification(transformers.GPTNeoXConfig(
        **small, num_hidden_layers=2, num_labels=LABELS))


def _olmo2() -> torch.nn.Module:
    return transformers.Olmo2ForSequenceClassification(transformers.Olmo2Config(
        **SMALL, num_hidden_layers=2, num_labels=LABELS))


CASES: dict[str, Callable[[], torch.nn.Module]] = {"llama": _llama, "qwen2": _qwen2, "qwen3": _qwen3,
                                                   "mistral": _mistral, "gemma2": _gemma2, "gemma3": _gemma3,
                                                   "phi3": _phi3, "gpt_neox": _gpt_neox, "olmo2": _olmo2}


checkpoint = checkpoint_fixture(CASES)


def padded(side: str, seed: int, seq: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Three rows of ids (never the pad id): whole, and padded by 3 and by 7 on ``side`` (pad id, mask 0)."""
    ids = np.random.RandomState(seed).randint(3, VOCAB, (3, seq)).astype(np.int64)
    mask = np.ones_like(ids)
    for row, n in ((1, 3), (2, 7)):
        cut = slice(0, n) if side == "left" else slice(seq - n, seq)
        ids[row, cut], mask[row, cut] = PAD, 0
    return ids, mask


def max_difference(model: nnx.Module, hf: torch.nn.Module, seed: int) -> dict[str, float]:
    """The largest |flaxzoo − transformers| logit on a left- and a right-padded batch (each asserted within ATOL)."""
    out = {}
    for side in ("left", "right"):
        ids, mask = padded(side, seed)
        ours = np.asarray(forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)))
        theirs = hf_logits(hf, ids, mask)
        assert ours.shape == theirs.shape == (3, LABELS) and np.isfinite(ours).all()
        assert np.abs(theirs).max() > 0.05  # a real signal, not zeros
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL, err_msg=side)
        out[side] = float(np.abs(ours - theirs).max())
    return out


QUICK = ("llama",)  # the quick tier's case (``-m "not slow"``); the other families' LMs: their family files


@pytest.mark.parametrize("case", tiered(CASES, QUICK))
def test_transformers_classifier_loads_with_same_logits(checkpoint, case):
    hf, directory = checkpoint(case)
    model = loaded(directory)
    assert isinstance(model, GPTForSequenceClassification) and model.config.model_type == hf.config.model_type
    assert model.config.num_labels == LABELS and model.config.pad_token_id == PAD
    assert model.score.kernel.get_value().shape == (SMALL["hidden_size"], LABELS) and model.score.bias is None
    print(f"\n  {case} transformers -> flaxzoo: max |logit difference| {max_difference(model, hf, seed=0)}")


@pytest.mark.parametrize("case", tiered(CASES, QUICK))
def test_saved_classifier_loads_in_transformers_with_same_logits(checkpoint, case, tmp_path):
    hf, directory = checkpoint(case)
    model = loaded(directory)
    again = transformers.AutoModelForSequenceClassification.from_pretrained(save_pretrained(model, tmp_path)).eval()
    assert type(again) is type(hf)
    assert again.config.architectures == [type(hf).__name__]
    assert again.config.num_labels == LABELS and again.config.pad_token_id == PAD
    np.testing.assert_array_equal(again.score.weight.detach().numpy(), hf.score.weight.detach().numpy())
    print(f"\n  {case} flaxzoo -> transformers: max |logit difference| {max_difference(model, again, seed=1)}")


def test_the_row_is_read_at_its_last_real_token():
    """transformers' rule: the rightmost id that is not ``pad_token_id`` (left or right padding; an EOS used as pad
    that ends a text is skipped, as there); the mask's last kept position without a pad id; the last position for one
    row without either, and a ValueError for more rows."""
    ids = jnp.asarray([[5, 6, 7, 8], [0, 0, 7, 8], [5, 6, 0, 0], [0, 0, 0, 0], [5, 2, 2, 2]], jnp.int32)
    np.testing.assert_array_equal(last_token_index(ids, None, 0), [3, 3, 1, 0, 3])
    np.testing.assert_array_equal(last_token_index(ids, None, 2), [3, 3, 3, 3, 0])  # pad = eos = 2
    mask = jnp.asarray([[1, 1, 1, 1], [0, 0, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]])
    np.testing.assert_array_equal(last_token_index(ids, mask, None), [3, 3, 1, 0, 2])
    np.testing.assert_array_equal(last_token_index(ids[:1], None, None), [3])
    with pytest.raises(ValueError, match="a batch of 5 rows needs config.pad_token_id or an attention_mask"):
        last_token_index(ids, None, None)

    config = models.get_preset("llama-tiny").replace(num_labels=2, pad_token_id=None)
    model = models.create_model(config, GPTForSequenceClassification)
    hidden = np.asarray(model.hidden_states(ids[1:3], mask[1:3]))
    kernel = np.asarray(model.score.kernel.get_value())
    np.testing.assert_allclose(np.asarray(model(ids[1:3], mask[1:3])),
                               np.stack([hidden[0, 3] @ kernel, hidden[1, 1] @ kernel]), atol=1e-5)
    with pytest.raises(ValueError, match="segment_ids"):
        model(ids[:1], segment_ids=jnp.ones((1, 4), jnp.int32))


def test_causal_lm_checkpoint_loads_as_classifier_and_back(tmp_path):
    """The fine-tuning start: a causal LM (untied lm_head) as ``cls="GPTForSequenceClassification"``: the score is
    initialised as create_model would (seeded) and named in one warning, lm_head is skipped, the stack is the LM's.
    A classifier checkpoint loads as the causal LM likewise (its score skipped, lm_head initialised)."""
    torch.manual_seed(2)
    lm = perturbed(transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, num_hidden_layers=2,
                                                                         tie_word_embeddings=False)))
    lm.save_pretrained(tmp_path / "lm")
    with pytest.warns(UserWarning, match=r"lacks 1 tensor\(s\), initialised with the model's initialisers "
                                         r"\(seed=3\): score\.weight") as caught:
        model = from_pretrained(tmp_path / "lm", cls="GPTForSequenceClassification", num_labels=LABELS, seed=3)
    assert len([w for w in caught if "lacks" in str(w.message)]) == 1
    assert isinstance(model, GPTForSequenceClassification) and model.config.num_labels == LABELS
    fresh = models.create_model(model.config, GPTForSequenceClassification, seed=3)
    np.testing.assert_array_equal(np.asarray(model.score.kernel.get_value()),
                                  np.asarray(fresh.score.kernel.get_value()))
    ids, mask = padded("right", seed=3)
    with torch.no_grad():
        hidden = lm.model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state
    last = mask.sum(-1) - 1
    expected = hidden.numpy()[np.arange(3), last] @ np.asarray(model.score.kernel.get_value())
    np.testing.assert_allclose(np.asarray(forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32))),
                               expected, atol=ATOL)

    save_pretrained(model, tmp_path / "classifier")
    with pytest.warns(UserWarning, match=r"lacks 1 tensor\(s\).*: lm_head\.weight"):
        back = from_pretrained(tmp_path / "classifier", cls=GPTForCausalLM)
    np.testing.assert_array_equal(np.asarray(back.backbone.layers[1].mlp.down.kernel.get_value()),
                                  np.asarray(model.backbone.layers[1].mlp.down.kernel.get_value()))


def test_every_class_of_the_llama_family_has_gguf_names():
    """A Llama GGUF has no classifier: the score is optional under llama.cpp's classifier-output name, and the
    causal LM's table skips it."""
    family, config = FAMILIES["llama"], models.get_preset("llama-tiny")
    classifier = family.gguf_weights(config, GPTForSequenceClassification)
    assert classifier.optional == {"cls.output.weight"} and r"output\.weight" in classifier.ignored
    assert r"cls\.output\.weight" in family.gguf_weights(config, GPTForCausalLM).ignored
    for prefix in ("Llama", "Qwen2", "Qwen3", "Mistral"):
        cls = getattr(transformers, f"{prefix}ForSequenceClassification")
        assert FAMILIES[prefix.lower()].architectures[cls.__name__] is GPTForSequenceClassification


# ------------------------------------------------------------------------------------------------- fine-tuning
TOPICS = {"sport": ["goal", "match", "cup", "striker"], "money": ["bank", "profit", "market", "shares"],
          "film": ["movie", "actor", "oscar", "studio"]}
FILLER = ["the", "a", "new", "after", "says", "over", "in", "for"]


def rows(n: int, seed: int) -> list[tuple[str, str]]:
    """Texts of two topic words among three filler words, the topic as the label."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = list(TOPICS)[i % len(TOPICS)]
        words = rng.sample(TOPICS[label], 2) + rng.sample(FILLER, 3)
        rng.shuffle(words)
        out.append((" ".join(words), label))
    return out


def write_rows(path, data) -> str:
    import csv

    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("text", "label"))
        writer.writerows(data)
    return str(path)


def save_word_tokenizer(directory) -> None:
    """A word-level ``tokenizer.json`` over the texts' words; ids 0 / 1 / 2 are the pad / BOS / EOS of ``SMALL``."""
    import tokenizers

    words = sorted({w for ws in TOPICS.values() for w in ws} | set(FILLER))
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(words)}}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["llama", "gemma2", "gpt_neox"])
def test_a_decoder_classifier_finetunes_on_the_engine(tmp_path, case):
    """``init_from`` = a tiny transformers classifier directory of the family (its tokenizer with it): the fine-tuner
    trains ``GPTForSequenceClassification`` on right-padded batches, and its work directory loads as that classifier
    with the label names, whose export gives transformers' logits (Llama's table; Gemma 2's sandwich norms, soft caps
    and window; GPT-NeoX's own tensor names and parallel residual)."""
    from flaxzoo.train.finetune.config import FinetuneConfig, base_config
    from flaxzoo.train.finetune.trainer import Finetuner

    torch.manual_seed(4)
    source = tmp_path / f"{case}_cls"
    original = CASES[case]().eval()
    original.save_pretrained(source)
    save_word_tokenizer(source)
    c = base_config()
    c.init_from, c.epochs, c.batch_size, c.eval_batch_size, c.log_every = str(source), 3, 16, 16, 1
    c.optim.lr, c.checkpoint_every = 3e-3, 100
    c.data.source, c.data.max_len, c.data.data_dir = "files", 16, str(tmp_path / "data")
    c.data.train_path = write_rows(tmp_path / "train.csv", rows(48, seed=1))
    c.data.test_path = write_rows(tmp_path / "test.csv", rows(12, seed=2))
    finetuner = Finetuner(FinetuneConfig.from_config_dict(c), tmp_path / "work")
    assert finetuner.MODEL is GPTForSequenceClassification
    summary = finetuner.run()
    assert summary.steps == 9 and summary.metrics is not None
    logged = [json.loads(line) for line in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in logged if "loss" in row]
    print(f"\n  decoder fine-tune: losses {[round(x, 3) for x in losses]}, test accuracy "
          f"{summary.metrics['accuracy']:.3f}, {summary.train_s:.1f} s training")
    assert len(losses) == 9 and losses[-1] < losses[0]

    model = models.from_pretrained(tmp_path / "work")
    assert isinstance(model, GPTForSequenceClassification)
    assert model.config.label_names == ("film", "money", "sport") and model.config.pad_token_id == PAD
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        save_pretrained(model, tmp_path / "export")).eval()
    assert type(hf) is type(original)
    ids, mask = padded("right", seed=5)
    np.testing.assert_allclose(np.asarray(forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32))),
                               hf_logits(hf, ids, mask), atol=ATOL)
