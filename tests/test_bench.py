"""The benchmark: its FLOP convention against XLA's own count, and its ``--json`` output. No test asserts a time."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxzoo.models.architectures.decoder import GPTForCausalLM
from flaxzoo.models.families import get_preset
from flaxzoo.models.modeling import abstract_model
from flaxzoo.train import flops as flopslib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _xla_flops(fn, *args) -> float:
    """FLOPs XLA's cost analysis assigns to ``fn(*args)`` (the HLO before backend-specific rewrites)."""
    cost = jax.jit(fn).lower(*args).cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per computation
        cost = cost[0]
    return float(cost["flops"])


def test_flop_formula_matches_xla_cost_analysis():
    """``flaxzoo.train.flops.flops_per_token`` is the *training* count, ``6N + 12·L·T·d`` = 3 × the forward count
    ``2N + 4·L·T·d`` (2 FLOPs per multiply-add; the backward pass does twice the forward's matmuls).

    Forward, per token: every matmul parameter does one multiply-add (2N). ``N`` includes the tied token table, once,
    because the output projection multiplies by it; the *lookups* (token gather, learned positions) do no FLOPs and
    the position table is not in ``N``. Attention adds ``Q·Kᵀ`` and ``A·V``, ``2·T·d`` multiply-adds each per token
    and layer (``d`` = heads × head_dim, causal mask not discounted: XLA's CPU attention computes the full square).

    XLA counts the forward pass's HLO: 2 FLOPs per multiply-add of each dot, plus ~1 per element-wise op (norms,
    GELU, softmax, bias adds), which the formula leaves out; with a 256-wide model those are ~1-2% of the total. The
    formula counts biases and norm scales as 2 FLOPs per token each (tiny either way).
    """
    config = get_preset("gpt2", vocab_size=2048, hidden_size=256, num_layers=2, num_heads=4,
                        intermediate_size=1024, max_position_embeddings=128, dropout=0.0, bos_token_id=None,
                        eos_token_id=None)
    batch, seq = 2, 128
    graphdef, state = nnx.split(abstract_model(config, GPTForCausalLM))
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)

    xla_forward = _xla_flops(lambda state, ids: nnx.merge(graphdef, state)(ids), state, ids) / (batch * seq)
    formula_forward = flopslib.flops_per_token(config, seq, GPTForCausalLM) / 3.0
    n = flopslib.matmul_params(config, GPTForCausalLM)
    assert formula_forward == pytest.approx(2 * n + 4 * config.num_layers * seq * config.hidden_size)
    # The tied table counted once, the position table not at all.
    d, v, f, L = config.hidden_size, config.vocab_size, config.intermediate_size, config.num_layers
    per_layer = 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d
    assert n == L * per_layer + v * d + 2 * d
    assert xla_forward == pytest.approx(formula_forward, rel=0.03), (xla_forward, formula_forward)


def test_bench_counts_flops_as_the_training_loop():
    """The bench's MFU uses ``flaxzoo.train.flops.flops_per_token`` with the loader's ``predictions`` (the MLM head on the
    ``P`` gathered slots), the count the training loop reports; causal workloads have no ``predictions``."""
    from flaxzoo.train.tools import bench
    from flaxzoo.train.data import DataConfig

    for work, seq, predictions in (("bert_train", 128, 20), ("bert_base", 128, 20), ("gpt_train", 256, None)):
        spec = bench.workload_spec(work, bench.parse_args(["--work", work]))
        assert (spec["seq"], spec["predictions"]) == (seq, predictions)
        if predictions is not None:
            assert DataConfig(seq_len=seq, objective="mlm").predictions == predictions
        assert bench.train_flops_per_token(spec) == flopslib.flops_per_token(
            spec["config"], seq, spec["cls"], predictions=predictions)


@pytest.mark.parametrize("work, argv", [("gpt_train", []), ("bert_train", []), ("bert_train", ["--tiny"]),
                                        ("gpt_train", ["--tiny", "--seq", "17"])])
def test_bench_batches_are_the_clis(work, argv):
    """``make_batch``: exactly the keys, order, shapes and dtype of ``flaxzoo.train.data.batch_shapes`` (what
    ``python -m flaxzoo.train`` compiles its step for), and packed rows as the loader emits them: two or more documents per
    row numbered from 1; causal targets the next token but ``IGNORE_INDEX`` across a document end (after its EOS);
    MLM segments ``[CLS] ... [SEP]``, padding with segment 0 and attention 0, the loader's number of masked tokens
    (``flaxzoo.train.data.masking.num_to_predict``) at ``masked_positions`` (ascending, then 0) with their original ids."""
    from flaxzoo.train.tools import bench
    from flaxzoo.train.batches import IGNORE_INDEX
    from flaxzoo.train.data import DataConfig, batch_shapes
    from flaxzoo.train.data.masking import num_to_predict

    spec = bench.workload_spec(work, bench.parse_args(["--work", work, *argv]))
    rows, seq, vocab = spec["batch"], spec["seq"], spec["config"].vocab_size
    mlm = spec["predictions"] is not None
    batch = bench.make_batch(spec, seed=3)
    shapes = batch_shapes(DataConfig(seq_len=seq, batch_size=rows, objective="mlm" if mlm else "causal"), rows)
    assert list(batch) == list(shapes)
    assert {k: v.shape for k, v in batch.items()} == shapes and all(v.dtype == np.int32 for v in batch.values())
    segments, ids = batch["segment_ids"], batch["input_ids"]
    real = segments > 0
    assert np.all(segments[:, 0] == 1) and np.all(np.diff(segments, axis=1)[real[:, 1:]] >= 0)
    assert np.all(segments.max(axis=1) >= 2), segments.max(axis=1)  # several documents in every row
    assert np.all((ids >= 0) & (ids < vocab))
    if not mlm:
        assert real.all()
        same = segments[:, 1:] == segments[:, :-1]
        np.testing.assert_array_equal(batch["targets"][:, :-1], np.where(same, ids[:, 1:], IGNORE_INDEX))
        assert np.all(ids[:, :-1][~same] == bench.EOS_ID)  # a document's last input is its EOS
        assert np.all((~same).sum(axis=1) == segments.max(axis=1) - 1)
        return
    np.testing.assert_array_equal(batch["attention_mask"], real)
    assert not batch["token_type_ids"].any() and np.all(ids[~real] == bench.PAD_ID)
    starts = np.diff(segments, axis=1, prepend=0) > 0
    ends = np.diff(segments, axis=1, append=0) != 0
    assert np.all(ids[starts] == bench.CLS_ID) and np.all(ids[ends & real] == bench.SEP_ID)
    labels, positions, masked = batch["labels"], batch["masked_positions"], batch["masked_labels"]
    valid = masked != IGNORE_INDEX
    candidates = (real & ~starts & ~ends).sum(axis=1)
    np.testing.assert_array_equal(valid.sum(axis=1), num_to_predict(candidates, 0.15, spec["predictions"]))
    assert np.all(valid[:, :-1] >= valid[:, 1:]) and np.all(positions[~valid] == 0)
    assert np.all(np.diff(positions, axis=1)[valid[:, 1:]] > 0)  # ascending, distinct
    np.testing.assert_array_equal(np.take_along_axis(labels, positions, axis=1)[valid], masked[valid])
    assert (labels != IGNORE_INDEX).sum() == valid.sum() and np.all(masked[valid] >= bench.FIRST_WORD_ID)
    unmasked = labels == IGNORE_INDEX
    assert np.all((ids == bench.MASK_ID) <= ~unmasked)  # [MASK] only where a label is scored


@pytest.mark.slow
def test_bench_json_output_parses():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-m", "flaxzoo.train.bench", "--work", "gpt_train,bert_train,gpt_generate", "--tiny", "--json",
         "--steps", "2", "--warmup", "1", "--generate-repeats", "1", "--peak-size", "256"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    results = [json.loads(line) for line in lines]
    assert [r["work"] for r in results] == ["gpt_train", "bert_train", "gpt_generate"]
    for r in results:
        for key in ("tokens_per_s", "step_ms", "mfu", "compile_s", "peak_memory_mb", "params", "peak_flops"):
            assert isinstance(r[key], (int, float)) and r[key] > 0, (r["work"], key, r[key])
    assert results[2]["first_call_s"] > 0 and len(results[2]["tokens"]) == 8
    decode = results[2]  # the memory roofline of a decode workload
    assert decode["bytes_per_token"] == pytest.approx(decode["weight_bytes_per_token"]
                                                      + decode["cache_bytes_per_token"])
    assert decode["bandwidth"] > 1e8 and decode["bandwidth_fraction"] == pytest.approx(
        decode["bytes_per_token"] * decode["tokens_per_s"] / decode["bandwidth"])


@pytest.mark.slow
def test_bench_times_the_main_job(tmp_path):
    """``main_gpt_train`` runs ``python -m flaxzoo.train --config gpt_train`` (tiny here) and reports its logged tokens/s."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-m", "flaxzoo.train.tools.bench", "--work", "main_gpt_train", "--tiny", "--json", "--steps", "2",
         "--peak-size", "256"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert result["work"] == "main_gpt_train" and result["tokens_per_s"] > 0 and 0 < result["mfu"] < 1
    assert len(result["windows"]) == 3 and np.isfinite(result["loss"])


def test_bench_mfu_is_never_above_one(monkeypatch):
    """MFU against the round's peak; work that outran it has the CPU peak measured again (the higher kept), and
    work that still outruns that is left out with a reason, never reported above 100%."""
    from flaxzoo.train.tools.bench import common

    assert jax.devices()[0].platform == "cpu"
    monkeypatch.setattr(flopslib, "time_cpu_matmul", lambda size: 2e9)  # the peak measured again after the work
    kind = "measured fp32 matmul peak (256^3, best of 5, beside the round)"

    def side(tokens_per_s):
        return dict(flops_per_token=1e6, tokens_per_s=tokens_per_s, step_ms=1.0, peak_memory_mb=1.0,
                    memory_kind="process max RSS", params=1)

    below = common.add_mfu(side(500.0), 1e9, kind, 256)  # 0.5 GFLOP/s of 1: no second measurement
    assert below["mfu"] == pytest.approx(0.5) and below["peak_flops"] == 1e9 and "mfu_note" not in below
    again = common.add_mfu(side(1500.0), 1e9, kind, 256)  # 1.5 of 1, then of 2
    assert again["mfu"] == pytest.approx(0.75) and again["peak_flops"] == 2e9
    assert "measured again after the work" in again["peak_kind"]
    above = common.add_mfu(side(3000.0), 1e9, kind, 256)  # 3 of 2 still
    assert above["mfu"] is None and "MFU left out" in above["mfu_note"] and above["peak_flops"] == 2e9
    assert "MFU left out" in common.report_line("gpt_train", above)
    assert "MFU 75.0% of 2 GFLOP/s" in common.report_line("gpt_train", again)


def test_bench_imports_no_data_stack():
    """The accelerator image has no Grain, tensorflow-datasets or ml_collections: the bench must not import them."""
    code = ("import sys, flaxzoo.train.tools.bench; bad = [m for m in ('grain', 'tensorflow_datasets', 'ml_collections', 'torch', "
            "'transformers', 'flaxzoo.train.data') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_bench_profile_lists_the_compiled_programs_operations(tmp_path):
    """``--profile`` traces the step and sums per-operation times: the matmuls of the step must be among them,
    labelled with their HLO shapes."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "flaxzoo.train.tools.bench", "--work", "gpt_train", "--tiny", "--json", "--steps", "1",
         "--warmup", "1", "--peak-size", "256", "--profile", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    profile = result["profile"]
    assert profile and all(row["ms_per_call"] >= 0 for row in profile)
    assert any("dot" in row["op"] or "dot_general" in row["label"] for row in profile), profile
    assert list(tmp_path.glob("gpt_train/**/*.trace.json.gz"))


@pytest.mark.slow
def test_bench_classify_serves_the_same_labels_as_transformers():
    """``--work classify``: the packaged MiniLM with a 5-class head, flaxzoo and transformers on the same weights and
    headlines (times are the benchmark's business; here: it runs, and both sides give the same labels)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "flaxzoo.train.tools.bench", "--work", "classify", "--headlines", "12", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert result["label_agreement"] == 1.0 and result["headlines"] == 12
    for side in ("flaxzoo", "transformers"):
        assert result[side]["ms_per_headline_batch1"] > 0 and result[side]["headlines_per_s_batch64"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--quantize", "int4"], "--quantize 'int4': expected one of int8"),
    (["--quantize", "8"], "--quantize '8': expected one of int8"),
    (["--batch", "0"], "--batch 0: expected a positive integer"),
    (["--new-tokens", "-1"], "--new-tokens -1: expected a positive integer"),
    (["--generate-repeats", "0"], "--generate-repeats 0: expected a positive integer"),
    (["--compare", "transformers"], "smollm2_generate compares with llama.cpp"),
])
def test_bench_smollm2_generate_argument_errors(argv, message, capsys):
    """``--work smollm2_generate``'s options: one clear error per bad value (nothing is loaded)."""
    from flaxzoo.train.tools import bench

    with pytest.raises(SystemExit):
        bench.parse_args(["--work", "smollm2_generate", *argv])
    assert message in capsys.readouterr().err
    for other in (["--work", "gpt_train", "--quantize", "int8"], ["--work", "gpt_generate", "--compare", "llama.cpp"]):
        with pytest.raises(SystemExit):
            bench.parse_args(other)
        assert "only the smollm2_generate workload" in capsys.readouterr().err
    args = bench.parse_args(["--work", "smollm2_generate", "--quantize", "int8", "--compare", "llama.cpp"])
    assert (args.works, args.quantize, args.compare) == (("smollm2_generate",), "int8", "llama.cpp")
    assert bench.smollm2_batches(args) == [1, 16]


@pytest.mark.slow
def test_bench_t5_generate_equals_transformers_on_the_same_weights():
    """``t5_generate --compare transformers`` (tiny here): both sides greedy on the same saved weights and sources give
    the same first row, and each batch size has both sides' new tokens/s and their ratio."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-m", "flaxzoo.train.tools.bench", "--work", "t5_generate", "--tiny", "--compare",
         "transformers", "--json", "--generate-repeats", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert result["work"] == "t5_generate" and result["same_tokens"] is True and result["new_tokens"] == 8
    assert list(result["batches"]) == ["1", "2"]
    for entry in result["batches"].values():
        assert entry["ratio"] > 0 and len(entry["first_row"]) == 9 and entry["first_row"][0] == 0
        for side in ("flaxzoo", "transformers"):
            assert entry[side]["tokens_per_s"] > 0 and entry[side]["first_call_s"] > 0
