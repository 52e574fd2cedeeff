"""flaxzoo.models.io.sharded: pretrained weights loaded shard by shard, against ``from_pretrained`` as the reference.

The multi-device checks run in one subprocess with 8 CPU devices (tests/sharded_load_helper.py): tiny random
transformers checkpoints (Llama in 2 safetensors shards, BERT with and without its classifier), a GGUF file and
flaxzoo work directories, on the meshes (1,8,1), (1,4,2), (2,2,2), per layer and stacked: every parameter equals
``from_pretrained``'s exactly and has the sharding asked for, and each stored element is read once, by the box.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

from flaxzoo.models.families.base import IDENTITY, LINEAR, Transform, layout
from flaxzoo.models.io.slicing import Unmappable, read_index, trace_layouts

REPO = pathlib.Path(__file__).resolve().parent.parent
HELPER = REPO / "tests" / "sharded_load_helper.py"
MESHES = [[1, 8, 1], [1, 4, 2], [2, 2, 2]]

transformers.logging.set_verbosity_error()


def run_helper(command: str, args: dict, devices: int = 8, timeout: int = 600) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0"}
    proc = subprocess.run([sys.executable, str(HELPER), command, json.dumps(args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"helper {command} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Every parameter moved off its initial value (zero biases, unit norm scales would hide a misplaced slice)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.1)
    return model.eval()


def write_gguf(path: pathlib.Path, hf: transformers.LlamaForCausalLM) -> pathlib.Path:
    """``hf`` as a float32 llama.cpp GGUF (llama.cpp's names and Q/K row order, written out independently here)."""
    import gguf

    c = hf.config
    writer = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((writer.add_block_count, c.num_hidden_layers), (writer.add_context_length, 64),
                       (writer.add_embedding_length, c.hidden_size),
                       (writer.add_feed_forward_length, c.intermediate_size),
                       (writer.add_head_count, c.num_attention_heads), (writer.add_head_count_kv, c.num_key_value_heads),
                       (writer.add_rope_freq_base, 10_000.0), (writer.add_layer_norm_rms_eps, c.rms_norm_eps),
                       (writer.add_vocab_size, c.vocab_size),
                       (writer.add_rope_dimension_count, c.hidden_size // c.num_attention_heads)):
        add(value)
    layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    for name, tensor in hf.state_dict().items():
        array, base = tensor.numpy().astype(np.float32), name.rsplit(".", 1)[0]
        if base.startswith("model.layers."):
            _, _, i, rest = base.split(".", 3)
            heads = {"self_attn.q_proj": c.num_attention_heads, "self_attn.k_proj": c.num_key_value_heads}.get(rest)
            if heads:  # llama.cpp's rotate-half -> interleaved pair order
                array = array.reshape(heads, 2, -1, array.shape[-1]).swapaxes(1, 2).reshape(array.shape)
            writer.add_tensor(f"blk.{i}.{layer[rest]}.weight", array)
        else:
            writer.add_tensor(f"{top[base]}.weight", array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    """The helper's report on every case (one 8-device process)."""
    root = tmp_path_factory.mktemp("sharded")
    torch.manual_seed(0)
    small = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=64, intermediate_size=128)
    llama = perturbed(transformers.LlamaForCausalLM(transformers.LlamaConfig(**small, num_key_value_heads=2)))
    llama.save_pretrained(root / "llama", max_shard_size="500KB")
    assert len(list((root / "llama").glob("model-*-of-00002.safetensors"))) == 2
    perturbed(transformers.BertModel(transformers.BertConfig(**small))).save_pretrained(root / "bert_base")
    perturbed(transformers.BertForSequenceClassification(transformers.BertConfig(**small, num_labels=3))
              ).save_pretrained(root / "bert_cls")
    gguf_file = write_gguf(root / "llama.gguf", llama)

    cases = []
    for (scan, mesh) in itertools.product([False, True], MESHES):
        tag = f"{'stacked' if scan else 'per_layer'}_{'x'.join(map(str, mesh))}"
        cases += [
            {"name": f"llama_{tag}", "path": str(root / "llama"), "mesh": mesh, "reads": True,
             "kwargs": {"scan_layers": scan}},
            {"name": f"bert_base_as_classifier_{tag}", "path": str(root / "bert_base"), "mesh": mesh, "reads": True,
             "kwargs": {"scan_layers": scan, "cls": "BertForSequenceClassification", "num_labels": 5, "seed": 3}},
        ]
    cases += [
        {"name": "llama_padded_bfloat16", "path": str(root / "llama"), "mesh": [1, 4, 2], "reads": True,
         "kwargs": {"scan_layers": True, "pad_vocab_to": 128, "param_dtype": "bfloat16"}},
        {"name": "bert_cls_stacked", "path": str(root / "bert_cls"), "mesh": [2, 2, 2], "reads": True,
         "kwargs": {"scan_layers": True}},
        {"name": "gguf", "path": str(gguf_file), "mesh": [1, 4, 2], "kwargs": {"scan_layers": True}},
    ]
    workdirs = [{"from": str(root / "llama"), "kwargs": {}, "to": str(root / "wd_llama")},
                {"from": str(root / "llama"), "kwargs": {"scan_layers": True}, "to": str(root / "wd_llama_stacked")},
                {"from": str(root / "bert_base"), "kwargs": {}, "to": str(root / "wd_bert")}]
    for name, mesh, kwargs in [("wd_llama", [1, 8, 1], {}),
                               ("wd_llama", [2, 2, 2], {"scan_layers": True, "pad_vocab_to": 128}),
                               ("wd_llama_stacked", [1, 4, 2], {}),
                               ("wd_llama_stacked", [1, 4, 2], {"scan_layers": False, "param_dtype": "bfloat16"}),
                               ("wd_llama", [1, 8, 1], {"cls": "GPTModel"}),
                               ("wd_bert", [2, 2, 2], {"cls": "BertForSequenceClassification", "num_labels": 4})]:
        cases.append({"name": f"{name}_{'x'.join(map(str, mesh))}_{'_'.join(map(str, kwargs.values()))}",
                      "path": str(root / name), "mesh": mesh, "kwargs": kwargs})
    out = root / "report.json"
    run_helper("checks", {"cases": cases, "workdirs": workdirs, "out": str(out)})
    return json.loads(out.read_text())


@pytest.mark.slow
def test_every_parameter_equals_from_pretrained_with_the_sharding_asked_for(report):
    assert len(report) == 21
    for name, case in report.items():
        assert case["names_equal"], name
        assert case["unequal"] == [] and case["wrong_dtype"] == [], (name, case)
        assert case["wrong_sharding"] == [], (name, case["wrong_sharding"])
        assert case["warnings_equal"], name
    # The meshes really split the parameters, and the lacking heads were initialised (not read).
    assert report["llama_per_layer_2x2x2"]["split"] == ["fsdp", "tensor"]
    assert report["llama_stacked_1x8x1"]["split"] == ["fsdp"]
    assert all(report[f"bert_base_as_classifier_{t}"]["initialised"] == 1 for t in ["per_layer_1x8x1", "stacked_2x2x2"])
    assert report["wd_bert_2x2x2_BertForSequenceClassification_4"]["initialised"] == 1


@pytest.mark.slow
def test_each_stored_element_is_read_once_by_the_box(report):
    """Every tensor is read exactly (never whole), each element once in the process whatever mesh (a shard that
    several devices replicate is read once); on FSDP over 8 devices every matrix is read in 8 parts of 1/8 each."""
    for name, case in report.items():
        for tensor, read in case.get("reads", {}).items():
            assert read["exact"], (name, tensor)
        sizes = {t: r["total"] for t, r in case.get("reads", {}).items()}
        if name.startswith("llama_per_layer"):  # the sizes are known independently: transformers' shapes
            assert sizes["model.embed_tokens.weight"] == sizes["lm_head.weight"] == 1000 * 64
            assert sizes["model.layers.1.self_attn.q_proj.weight"] == 64 * 64
            assert sizes["model.layers.1.self_attn.k_proj.weight"] == 32 * 64
            assert sizes["model.layers.0.mlp.down_proj.weight"] == 64 * 128
            assert len(sizes) == 2 + 1 + 2 * 9
    for llama, bert in [("llama_per_layer_1x8x1", "bert_base_as_classifier_per_layer_1x8x1"),
                        ("llama_stacked_1x8x1", "bert_base_as_classifier_stacked_1x8x1")]:
        reads = {**report[llama]["reads"], **report[bert]["reads"]}
        assert sum(r["total"] for r in report[llama]["reads"].values()) == 2 * 1000 * 64 + 64 + 2 * (
            64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 64 * 128 + 2 * 64)
        matrices = {t: r for t, r in reads.items() if t.endswith("weight") and "norm" not in t.lower()}
        # Llama: embeddings, LM head, 7 per layer; BERT: 3 embedding tables, 6 per layer, the pooler.
        assert len(matrices) == (2 + 2 * 7) + (3 + 2 * 6 + 1)
        for tensor, read in matrices.items():
            assert read["count"] == 8 and read["largest"] * 8 == read["total"], (llama, tensor, read)


@pytest.mark.slow
def test_sharded_peak_host_memory_is_below_from_pretrained(tmp_path):
    """A 29 M-parameter float32 Llama (112 MiB): the peak resident set of a process loading it sharded over 8 devices stays
    below that of one loading it with ``from_pretrained`` (which holds the read tensors beside the model)."""
    directory = tmp_path / "llama"
    run_helper("llama", {"dir": str(directory), "hidden": 512, "layers": 8, "intermediate": 1536, "vocab": 2000,
                         "heads": 8}, devices=1)
    peaks = {}
    for mode in ("sharded", "full"):
        out = tmp_path / f"{mode}.json"
        run_helper("memory", {"path": str(directory), "mode": mode, "mesh": [1, 8, 1], "out": str(out)})
        peaks[mode] = json.loads(out.read_text())
    assert peaks["sharded"]["params"] == peaks["full"]["params"] == 2 * 2000 * 512 + 512 + 8 * (
        4 * 512 * 512 + 3 * 512 * 1536 + 2 * 512)
    size_mib = peaks["full"]["params"] * 4 / 2**20
    assert peaks["sharded"]["peak_rss_mib"] < peaks["full"]["peak_rss_mib"] - size_mib / 2, (peaks, size_mib)


# ------------------------------------------------------------------------------------------ one process, one device

TRANSFORMS = [(IDENTITY, (10, 4)), (LINEAR, (6, 4)), (layout("(h k) d", "d h k", h=4), (12, 6)),
              (layout("d (h k)", "h k d", h=2), (4, 6)), (layout("(h k)", "h k", h=4), (12,)),
              (layout("d (parts h k)", "parts d h k", parts=3, h=2), (4, 12)),
              (layout("a b c", "(c a) b"), (2, 3, 4)), (layout("(a b) c", "c (b a)", a=2), (6, 4))]


@pytest.mark.parametrize("transform,shape", TRANSFORMS, ids=range(len(TRANSFORMS)))
def test_every_box_of_every_output_equals_to_flax_sliced(transform, shape):
    """Every index of unit-step slices (all of them, on small shapes) of every output of a transform, read through
    the traced layout, equals ``to_flax`` of the whole tensor sliced; the reads stay inside the stored tensor."""
    stored = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    outputs = transform.to_flax(stored)
    layouts = trace_layouts(transform, shape)
    assert len(layouts) == len(outputs)
    spans = lambda n: [slice(a, b) for a in range(n) for b in range(a + 1, n + 1)]  # noqa: E731
    for output, traced in zip(outputs, layouts):
        for index in itertools.product(*(spans(d) for d in output.shape)):
            np.testing.assert_array_equal(read_index(traced, index, lambda box: stored[box]), output[index])


def test_a_transform_that_computes_is_not_mapped():
    with pytest.raises(Unmappable, match=r"computes \(mul\)"):
        trace_layouts(Transform(lambda w: (w * 2,), lambda w: w / 2), (3, 4))
    with pytest.raises(Unmappable):  # a gather of rows (llama.cpp's Q/K permutation is one)
        trace_layouts(Transform(lambda w: (w[np.array([1, 0, 2])],), lambda w: w), (3, 4))


def test_a_head_split_inside_a_head_reads_the_smallest_span():
    """Splitting ``k`` of a ``(h k)`` axis is not a box of the stored rows: the span is read, the rest dropped."""
    traced, = trace_layouts(layout("(h k) d", "d h k", h=2), (8, 3))
    stored = np.arange(24.0).reshape(8, 3)
    boxes = []
    got = read_index(traced, (slice(0, 3), slice(0, 2), slice(1, 3)), lambda box: boxes.append(box) or stored[box])
    np.testing.assert_array_equal(got, stored.reshape(2, 4, 3).transpose(2, 0, 1)[:, :, 1:3])
    assert boxes == [(slice(1, 7), slice(0, 3))]  # rows 1, 2 and 5, 6 needed; 1..6 read


def test_shardings_that_do_not_match_are_named(tmp_path):
    import jax
    from flax import nnx
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from flaxzoo.models.io.sharded import load_sharded, pretrained_shapes

    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=32,
                                                   max_position_embeddings=16)).save_pretrained(tmp_path)
    mesh = Mesh(np.array(jax.devices()[:1]), ("fsdp",))
    shapes = pretrained_shapes(tmp_path)
    full = {p: NamedSharding(mesh, PartitionSpec()) for p, _ in nnx.to_flat_state(shapes.params)}
    with pytest.raises(ValueError, match=r"no sharding for backbone\.embeddings\.norm\.bias; shardings for "
                                         r"parameters the model lacks: none"):
        load_sharded(tmp_path, shardings={p: s for p, s in full.items() if p[-2:] != ("norm", "bias")})
    with pytest.raises(ValueError, match=r"shardings\['pooler\.kernel'\] is str: expected a "
                                         r"jax\.sharding\.NamedSharding"):
        load_sharded(tmp_path, shardings={**full, ("pooler", "kernel"): "fsdp"})
    with pytest.raises(ValueError, match=r"shardings\['backbone\.embeddings\.tokens\.embedding'\] = "
                                         r"P\('fsdp',\) does not divide the parameter's shape \(100, 16\) "
                                         r"on the mesh \{'fsdp': 3\}"):
        odd = Mesh(np.array(jax.devices()[:1] * 3), ("fsdp",))
        load_sharded(tmp_path, shardings={**full, ("backbone", "embeddings", "tokens", "embedding"):
                                          NamedSharding(odd, PartitionSpec("fsdp"))})
