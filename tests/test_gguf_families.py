"""GGUF files of the Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3 and Phi-3 architectures against two references.

Each file is written here from a tiny random transformers model the way llama.cpp's ``convert_hf_to_gguf.py``
writes that architecture, independently of flaxzoo's spec tables: tensor names from gguf-py's own ``TensorNameMap``,
the metadata keys the converter writes (and only those: what a GGUF cannot say, such as Gemma's
``query_pre_attn_scalar``, the models take at the value llama.cpp assumes), Gemma's norms stored as ``1 + w``, Phi-3's
fused ``attn_qkv`` / ``ffn_up`` and LongRoPE factor tensors, a tokenizer (byte-level BPE for Qwen, SentencePiece for
Gemma / Phi-3: the vocabularies of ``tests/test_gguf_tokenizers.py``). Float32 tensors, so that the numbers are the
original model's. Then:

* flaxzoo's ``from_pretrained(file)`` gives the original transformers model's logits on a left-padded batch;
* transformers' own GGUF loader (``AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)``), given the same
  file, gives flaxzoo's logits: an independent check that the file is what llama.cpp writes and that flaxzoo reads
  it as transformers does (the settings transformers' GGUF loader does not read, such as soft caps, the query
  scale, RoPE scaling, Qwen3's head_dim or Phi-3's window, are passed to it by hand; it has no plain ``gemma``
  support at all);
* flaxzoo's tokenizer of the file equals transformers' GGUF tokenizer on a few texts.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any, Callable

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from family_parity import forward, hf_logits, perturbed
from flaxzoo.models.io import from_pretrained
from flaxzoo.models.io.tokenizer import tokenizer_from_gguf
from test_gguf_tokenizers import gemma_vocab, llama_vocab, qwen2_vocab

ATOL = 1e-4
ARCH = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 20_000.0}
GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
               "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}}
LONGROPE = {"rope_type": "longrope", "rope_theta": 10_000.0, "partial_rotary_factor": 0.75,
            "short_factor": (1.0 + 0.5 * np.linspace(0, 1, 6)).tolist(),
            "long_factor": (1.0 + 7.0 * np.linspace(0, 1, 6)).tolist()}
# Phi-3's files name a padding token (transformers' Phi3Config would take 32000 otherwise).
PHI3_VOCAB = functools.partial(llama_vocab, pad=True)
SIZES = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             max_position_embeddings=128)


def ids_of(vocab: dict[str, Any]) -> dict[str, Any]:
    """The special ids a transformers config takes from a test vocabulary."""
    return dict(vocab_size=len(vocab["tokens"]), bos_token_id=vocab["bos"], eos_token_id=vocab["eos"],
                pad_token_id=vocab.get("pad", 0))


@dataclasses.dataclass(frozen=True)
class Case:
    """One architecture: the GGUF ``arch``, the flaxzoo ``model_type`` whose family reads it, the transformers model,
    the tokenizer (``vocab``, ``kind``), and what to pass transformers' GGUF loader that it does not read from the
    file (``overrides``; None: it does not load the architecture)."""

    arch: str
    model_type: str
    build: Callable[[dict[str, Any]], torch.nn.Module]
    vocab: Callable[[], dict[str, Any]]
    kind: str
    overrides: dict[str, Any] | None


CASES: dict[str, Case] = {
    # Qwen2.5: q/k/v biases, untied, YaRN (transformers' GGUF loader reads no RoPE scaling for qwen2).
    "qwen2": Case("qwen2", "qwen2", lambda ids: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **SIZES, **ids, num_hidden_layers=2, tie_word_embeddings=False, rope_parameters=dict(YARN))),
        qwen2_vocab, "gpt2", {"rope_parameters": dict(YARN)}),
    # Qwen3: QK-norm, head_dim 24 (not hidden / heads; transformers' GGUF loader reads no qwen3.attention.key_length),
    # tied.
    "qwen3": Case("qwen3", "qwen3", lambda ids: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **SIZES, **ids, num_hidden_layers=2, head_dim=24, tie_word_embeddings=True, rope_theta=50_000.0)),
        qwen2_vocab, "gpt2", {"head_dim": 24}),
    "gemma": Case("gemma", "gemma", lambda ids: transformers.GemmaForCausalLM(transformers.GemmaConfig(
        **SIZES, **ids, num_hidden_layers=2, head_dim=32)), gemma_vocab, "llama", None),
    # Gemma 2: sandwich norms, soft caps, window 6 on the even layers; query_pre_attn_scalar = head_dim (llama.cpp's).
    "gemma2": Case("gemma2", "gemma2", lambda ids: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        **SIZES, **ids, num_hidden_layers=3, head_dim=24, sliding_window=6, query_pre_attn_scalar=24,
        attn_logit_softcapping=1.5, final_logit_softcapping=2.0)), gemma_vocab, "llama",
        {"query_pre_attn_scalar": 24, "attn_logit_softcapping": 1.5, "final_logit_softcapping": 2.0}),
    # Gemma 3: QK-norm, five sliding layers then a global one (llama.cpp's pattern), local θ unscaled, global θ
    # with linear scaling.
    "gemma3": Case("gemma3", "gemma3_text", lambda ids: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **SIZES, **ids, num_hidden_layers=6, head_dim=32, sliding_window=6, query_pre_attn_scalar=32,
        rope_parameters={k: dict(v) for k, v in GEMMA3_ROPE.items()})), gemma_vocab, "llama",
        {"query_pre_attn_scalar": 32, "rope_parameters": {k: dict(v) for k, v in GEMMA3_ROPE.items()}}),
    # Phi-3: fused qkv / gate-up, window 6 on every layer.
    "phi3": Case("phi3", "phi3", lambda ids: transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **SIZES, **ids, num_hidden_layers=2, sliding_window=6, rope_theta=20_000.0)), PHI3_VOCAB, "llama",
        {"sliding_window": 6}),
    # Phi-3 128k style: LongRoPE past an original length of 10 (the 12-token batch takes the long factors), partial
    # rotary 0.75.
    "phi3_longrope": Case("phi3", "phi3", lambda ids: transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **SIZES, **ids, num_hidden_layers=2, original_max_position_embeddings=10, rope_parameters=dict(LONGROPE))),
        PHI3_VOCAB, "llama", {"rope_parameters": dict(LONGROPE), "original_max_position_embeddings": 10}),
}
TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "  two leading spaces", "digits 12345",
         "line one\nline two\n\n", "café 東京 🙂"]


# ------------------------------------------------------------------------------------ writing as llama.cpp writes
def write_metadata(writer: gguf.GGUFWriter, arch: str, c: Any) -> None:
    """The keys ``convert_hf_to_gguf.py`` writes for ``arch`` from the transformers config ``c``."""
    writer.add_name("tiny")
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if arch in ("qwen3", "gemma", "gemma2", "gemma3"):  # config.json names head_dim
        writer.add_key_length(c.head_dim)
        writer.add_value_length(c.head_dim)
    rope = c.rope_parameters
    if arch in ("qwen2", "qwen3", "phi3"):
        writer.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(c.attn_logit_softcapping)
        writer.add_final_logit_softcapping(c.final_logit_softcapping)
        writer.add_sliding_window(c.sliding_window)
    if arch == "gemma3":
        full, local = rope["full_attention"], rope["sliding_attention"]
        writer.add_rope_freq_base(full["rope_theta"])
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full["factor"])
        writer.add_rope_freq_base_swa(local["rope_theta"])
        writer.add_sliding_window(c.sliding_window)
    if arch == "phi3":
        fraction = rope.get("partial_rotary_factor", 1.0)
        writer.add_rope_scaling_orig_ctx_len(c.original_max_position_embeddings)
        writer.add_rope_dimension_count(int(fraction * c.hidden_size) // c.num_attention_heads)
        writer.add_sliding_window(c.sliding_window or 0)
        if rope.get("rope_type") == "longrope":
            original = c.original_max_position_embeddings
            scale = c.max_position_embeddings / original
            writer.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(scale) / np.log(original))))
            writer.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], np.float32))
            writer.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], np.float32))


def write_tokenizer(writer: gguf.GGUFWriter, arch: str, vocab: dict[str, Any], kind: str) -> None:
    """A test vocabulary as the converter writes a byte-level BPE (``gpt2``) or SentencePiece (``llama``) one."""
    writer.add_tokenizer_model(kind)
    writer.add_tokenizer_pre(vocab.get("pre", "default"))
    writer.add_token_list(vocab["tokens"])
    if kind == "llama":
        writer.add_token_scores(vocab["scores"])
    writer.add_token_types(vocab["types"])
    if kind == "gpt2":
        writer.add_token_merges(vocab["merges"])
        writer.add_add_bos_token(False)
    writer.add_bos_token_id(vocab["bos"])
    writer.add_eos_token_id(vocab["eos"])
    for key, add in (("unk", writer.add_unk_token_id), ("pad", writer.add_pad_token_id)):
        if key in vocab:
            add(vocab[key])
    if arch.startswith("gemma"):
        writer.add_add_space_prefix(False)
        writer.add_add_bos_token(True)


def write_llama_cpp_gguf(path: pathlib.Path, hf: torch.nn.Module, arch: str, vocab: dict[str, Any],
                         kind: str) -> pathlib.Path:
    """``hf`` as llama.cpp's converter writes it (float32): gguf-py's tensor names, no lm_head when tied (Gemma 1 /
    2 never keep one), Gemma's norms plus one, rows as Hugging Face has them (no permutation outside ``llama``)."""
    c = hf.config
    writer = gguf.GGUFWriter(str(path), arch)
    write_metadata(writer, arch, c)
    write_tokenizer(writer, arch, vocab, kind)
    names = gguf.get_tensor_name_map(ARCH[arch], c.num_hidden_layers)
    for name, tensor in hf.state_dict().items():
        if name == "lm_head.weight" and (c.tie_word_embeddings or arch in ("gemma", "gemma2")):
            continue
        module, _, suffix = name.rpartition(".")
        target = names.get_name(module)
        assert target is not None, f"gguf-py has no {arch} name for {name}"
        data = tensor.detach().to(torch.float32).numpy()
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            data = data + 1.0
        writer.add_tensor(f"{target}.{suffix}", np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """``get(case)`` → (the original transformers model, its GGUF file), each written once."""
    cache: dict[str, tuple[torch.nn.Module, pathlib.Path]] = {}

    def get(name: str):
        case = CASES[name]
        if name not in cache:
            vocab = case.vocab()
            torch.manual_seed(0)
            hf = perturbed(case.build(ids_of(vocab)))
            path = write_llama_cpp_gguf(tmp_path_factory.mktemp(name) / f"{name}.gguf", hf, case.arch, vocab,
                                        case.kind)
            cache[name] = hf, path
        return cache[name]

    return get


def left_padded(vocab_size: int, seq: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Two rows of ids; the second left-padded by 4 (mask 0)."""
    ids = np.random.RandomState(0).randint(3, vocab_size, (2, seq)).astype(np.int64)
    mask = np.ones((2, seq), np.int64)
    ids[1, :4], mask[1, :4] = 0, 0
    return ids, mask


def max_diff(ours: Any, theirs: np.ndarray, mask: np.ndarray) -> float:
    """The largest difference over the real (unmasked) positions; both must be finite and not all near zero."""
    real = mask.astype(bool)
    ours, theirs = np.asarray(ours)[real], np.asarray(theirs)[real]
    assert np.isfinite(ours).all() and np.abs(theirs).max() > 0.05
    return float(np.abs(ours - theirs).max())


def flaxzoo_logits(path: pathlib.Path, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    model = from_pretrained(path)
    return np.asarray(forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)))


# ----------------------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", list(CASES))
def test_gguf_gives_the_original_models_logits(written, name):
    hf, path = written(name)
    model = from_pretrained(path)
    case = CASES[name]
    assert model.config.model_type == case.model_type and model.config.rope_layout == "half"
    assert model.config.tie_word_embeddings == hf.config.tie_word_embeddings
    if case.arch.startswith("gemma"):  # the stored 1 + w read back as w
        np.testing.assert_allclose(np.asarray(model.backbone.final_norm.scale[...]),
                                   hf.model.norm.weight.detach().numpy(), rtol=0, atol=1e-6)
    ids, mask = left_padded(hf.config.vocab_size)
    ours = forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32))
    diff = max_diff(ours, hf_logits(hf, ids, mask), mask)
    print(f"\n  {name}: flaxzoo vs original transformers max |diff| = {diff:.2e}")
    assert diff <= ATOL


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.overrides is not None])
def test_transformers_gguf_loader_gives_flaxzoo_logits(written, name):
    """transformers reads the same file (its tensor names, its Gemma norm offset, its un-permuted rows) into the
    same model: the file is what llama.cpp writes, and flaxzoo reads it alike."""
    hf, path = written(name)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, **CASES[name].overrides).eval()
    assert type(reference) is type(hf)
    ids, mask = left_padded(hf.config.vocab_size)
    theirs = hf_logits(reference, ids, mask)
    diff = max_diff(flaxzoo_logits(path, ids, mask), theirs, mask)
    print(f"\n  {name}: flaxzoo vs transformers' GGUF loader max |diff| = {diff:.2e}")
    assert diff <= ATOL
    assert max_diff(hf_logits(hf, ids, mask), theirs, mask) <= ATOL  # and both are the original model


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.overrides is not None and n != "phi3_longrope"])
def test_tokenizer_equals_transformers_gguf_tokenizer(written, name):
    _, path = written(name)
    ours, _ = tokenizer_from_gguf(path)
    theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in TEXTS:
        expected = theirs(text)["input_ids"]
        assert ours.encode(text).ids == expected, text
        assert ours.decode(expected, skip_special_tokens=True) == theirs.decode(expected, skip_special_tokens=True)


def test_gemma_tokenizer_is_rebuilt(written):
    """Gemma 1 (which transformers' GGUF loader does not read) gets Gemma's SentencePiece flavour all the same."""
    _, path = written("gemma")
    tok, pad = tokenizer_from_gguf(path)
    assert pad == (0, "<pad>") and tok.encode("hello world").ids[0] == 2  # BOS; no prefix space follows
    assert tok.decode(tok.encode("two  spaces\n").ids, skip_special_tokens=True) == "two  spaces\n"


# ---------------------------------------------------------------------------------------------------- refusals
def metadata_only(path: pathlib.Path, arch: str, keys: dict[str, Any], tensors: dict[str, np.ndarray]) -> pathlib.Path:
    """A GGUF of ``arch`` with a few sizes, ``keys`` (strings) and ``tensors``: enough for its config to be read."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    for key, value in keys.items():
        writer.add_string(key, value)
    writer.add_tensor("token_embd.weight", np.zeros((10, 8), np.float32))
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("arch, keys, tensors, match", [
    ("qwen2", {"qwen2.rope.scaling.type": "longrope"}, {}, r"qwen2\.rope\.scaling\.type='longrope' is not supported"),
    ("qwen3", {}, {"rope_freqs.weight": np.ones(2, np.float32)}, r"rope_freqs\.weight \(RoPE frequency factors\)"),
    ("phi3", {}, {"rope_factors_long.weight": np.ones(2, np.float32)},
     r"LongRoPE needs both rope_factors_long\.weight and rope_factors_short\.weight"),
])
def test_what_a_spec_cannot_read_is_named(tmp_path, arch, keys, tensors, match):
    path = metadata_only(tmp_path / f"{arch}.gguf", arch, keys, tensors)
    with pytest.raises(ValueError, match=match):
        from_pretrained(path)
