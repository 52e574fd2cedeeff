"""Deviceless compiles for TPU and GPU (``python -m flaxzoo.train.compile``): the step fits, the batch is sharded (FSDP never
replicates it again), the fused attention kernel is in the HLO, a multi-slice mesh puts ``data`` across slices, and
``remat="auto"`` picks by compiled memory. Tiny models: each compile takes seconds."""

import contextlib
import io
import json
import math
import os
import re

import pytest

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # two test workers may load libtpu at once

from flaxzoo.train.tools import compile as compilelib  # noqa: E402
from flaxzoo.train.tools import hlo as hlolib  # noqa: E402
from flaxzoo.train import sharding  # noqa: E402
from flaxzoo.train.tools import targets  # noqa: E402

TPU = "v5e-8"
GPU = "h100x8"
TINY = ["--config.model.num_layers=2", "--config.model.hidden_size=128", "--config.model.num_heads=2",
        "--config.model.intermediate_size=512", "--config.batch_size=32", "--config.seq_len=256",
        "--config.model.max_position_embeddings=256", "--config.precision.remat=none"]


def need(platform: str) -> None:
    ok, why = targets.plugin_available(platform)
    if not ok:
        pytest.skip(why)


def compile_tiny(target: str, *overrides: str, config: str = "default", slices: int = 1, step: str = "train",
                 dump_hlo: str | None = None):
    cfg = compilelib.load_config(config, [*TINY, *overrides])
    return compilelib.compile_config(cfg, targets.parse_target(target, slices), step=step, dump_hlo=dump_hlo)[0]


def mesh_flags(data: int, fsdp: int, tensor: int = 1) -> tuple[str, ...]:
    """The overrides of a (data, fsdp, tensor) mesh at 40 rows (``tensor`` only when it is not 1, so that
    :data:`FSDP8` is the same program, compiled once by ``cli_compile``)."""
    flags = (BATCH40, f"--config.mesh.data={data}", f"--config.mesh.fsdp={fsdp}")
    return flags + ((f"--config.mesh.tensor={tensor}",) if tensor != 1 else ())


BATCH40 = "--config.batch_size=40"  # 40 rows: 5 per device over 8, a size no other dimension of TINY has
FSDP8 = (BATCH40, "--config.mesh.data=1", "--config.mesh.fsdp=8")
# The per-family compiles (each family's mechanisms, not the sizes) at half TINY's widths and length: half the
# compile time (a Qwen3 step on a v5e-8: 4.6 s -> 2.4 s, 2-core AMD EPYC).
FAMILY = ["--config.model.num_layers=2", "--config.model.hidden_size=64", "--config.model.num_heads=2",
          "--config.model.intermediate_size=128", "--config.batch_size=8", "--config.seq_len=128",
          "--config.model.max_position_embeddings=128", "--config.precision.remat=none", "--config.mesh.data=1",
          "--config.mesh.fsdp=8"]
GPU_BF16 = ("--config.mesh.data=8", "--config.precision.compute_dtype=bfloat16")


@pytest.fixture(scope="module")
def cli_compile(tmp_path_factory):
    """``python -m flaxzoo.train.compile --json --dump-hlo DIR`` of the tiny config: (its JSON report, its HLO). A
    compile-only program cannot go through the persistent cache, so each (target, overrides) compiles once here and
    the tests that read the same program share it."""
    done: dict[tuple, tuple[dict, str]] = {}

    def run(target_name: str, *overrides: str) -> tuple[dict, str]:
        if (target_name, overrides) not in done:
            folder = tmp_path_factory.mktemp("hlo")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = compilelib.main(["--config", "default", "--target", target_name, "--json", "--dump-hlo",
                                        str(folder), *TINY, *overrides])
            assert code == 0
            (path,) = folder.glob("*.hlo.txt")
            done[target_name, overrides] = json.loads(out.getvalue().strip().splitlines()[-1]), path.read_text()
        return done[target_name, overrides]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("target_name", [TPU, GPU])
@pytest.mark.parametrize("mesh", [(1, 8, 1), (2, 2, 2)])
def test_the_batch_is_never_replicated(target_name, mesh, cli_compile):
    """Every activation of the partitioned program holds this device's rows only: 40 rows over data x fsdp devices
    are ``40 / (data * fsdp)`` per device, and no buffer is ``[40, 256, ...]`` (the whole batch). Without the
    activation constraints XLA followed the FSDP-split weights and kept ``[40, 256, 128]`` hidden states (and, at
    GPT-2 size, 65.8 GB of temporaries on a 16 GB v5e chip). (1, 8, 1) is :data:`FSDP8`, the program the FSDP
    tests below read."""
    need(targets.parse_target(target_name).platform)
    data, fsdp, tensor = mesh
    _, hlo = cli_compile(target_name, *mesh_flags(data, fsdp, tensor))
    rows = 40 // (data * fsdp)
    whole = sorted(set(re.findall(r"\b(?:bf16|f32|f16)\[40,256[\d,]*\]", hlo)))
    assert not whole, f"the whole batch on one device: {whole}"
    assert re.search(rf"\b(?:bf16|f32)\[{rows},256,", hlo), f"no [{rows}, 256, ...] activation found"
    if fsdp > 1:  # FSDP: weights gathered for use, gradients reduced back to each device's slice
        kinds = hlolib.collectives(hlo)
        assert kinds.get("all-gather", 0) + kinds.get("collective-permute", 0) > 0
        assert "all-to-all" not in kinds  # the replicated-batch program reshuffled activations


@pytest.mark.slow
@pytest.mark.parametrize("target_name, config, preset", [
    (TPU, "default", "qwen2.5-0.5b"), (GPU, "default", "qwen2.5-0.5b"),  # a tied token table
    (TPU, "default", "mistral-7b"), (GPU, "bert_tiny", "bert-base-uncased")])  # an own head; an MLM head
def test_no_buffer_holds_the_global_batch_at_a_large_vocabulary(target_name, config, preset, tmp_path):
    """With 16,384 token rows split over FSDP 8, XLA looked the embeddings up by collecting every device's ids:
    ``f32[40, 256, 128]``, the whole global batch's embeddings, on each device (``f32[32, 2048, 2048]`` for
    Llama-3.2-1B's step on a v5p-8). The compile report names any buffer that leads with the global ``[rows, seq]``
    (or their product). The loss runs in chunks of 64 positions, as ``loss_chunk="auto"`` cuts a large
    vocabulary's: the head holds one chunk of the FSDP group's rows for its slice of the vocabulary
    (``[40, 64, 16384 / 8]``, ``LMHead``). Nor is the token table ever whole on a device: the lookup passes its
    row blocks round a ring, and its gradient is reduce-scattered by one (``models/layers/table_lookup.py``; the
    gathered table and the scatter-added gradient, ``bf16[16384, 128]``, were there before)."""
    need(targets.parse_target(target_name).platform)
    report = compile_tiny(target_name, *FSDP8, f"--config.model.preset={preset}", "--config.model.vocab_size=16384",
                          "--config.precision.loss_chunk=64",
                          "--config.model.bos_token_id=1", "--config.model.eos_token_id=2",
                          "--config.model.pad_token_id=0", "--config.model.num_kv_heads=2", config=config,
                          dump_hlo=str(tmp_path))
    assert report.mesh == {"data": 1, "fsdp": 8, "tensor": 1} and report.fits
    assert report.global_batch_buffers == []
    (hlo,) = [path.read_text() for path in tmp_path.glob("*.hlo.txt")]
    assert re.search(r"\b(?:bf16|f32)\[2048,128\]", hlo), "no [16384 / 8, 128] slice of the table found"
    assert not re.findall(r"\b(?:bf16|f32|f16)\[16384,128\]", hlo), "the whole token table on one device"


@pytest.mark.slow
@pytest.mark.parametrize("target_name", [TPU, GPU])
def test_fsdp_gradients_are_reduced_to_each_devices_slice(target_name, cli_compile):
    """Under fsdp=8 no weight's gradient is all-reduced whole: the layers' gradients are reduce-scattered (on TPU
    the compiler's collective-permute rings), and what is all-reduced is small (biases and norm scales, which stay
    replicated, the position table, and the loss sums). libtpu writes some reduce-scatters as an all-reduce
    inside an ``%all-reduce-scatter`` computation whose result is the device's slice (the token table's gradient,
    from the lookup): those count as reduce-scatters."""
    need(targets.parse_target(target_name).platform)
    _, hlo = cli_compile(target_name, *FSDP8)
    hlo = re.sub(r"(?ms)^%all-reduce-scatter[\w.]* \(.*?^\}$", "", hlo)
    reduced = re.findall(r"= \(?(?:bf16|f32)\[([\d,]*)\][^=]*? all-reduce(?:-start)?\(", hlo)
    sizes = {dims: math.prod(int(d) for d in dims.split(",") if d) for dims in reduced}
    smallest_kernel = 128 * 512  # hidden x intermediate: the smallest FSDP-split weight of TINY
    large = {dims for dims, size in sizes.items() if size >= smallest_kernel}
    assert not large, f"whole gradients all-reduced: {sorted(large)}"
    kinds = hlolib.collectives(hlo)
    assert kinds.get("reduce-scatter", 0) + kinds.get("collective-permute", 0) > 0, kinds


@pytest.mark.slow
@pytest.mark.parametrize("target_name", [TPU, GPU])
def test_no_bfloat16_copy_of_the_stacked_layer_weights(target_name, cli_compile):
    """The scanned layers' float32 weights (``[layers, ...]``, this device's FSDP slice) are cast to bfloat16 one
    layer at a time, inside the scan. XLA used to move the cast ahead of the scan's slicing and out of the loop, and
    the step held a bfloat16 copy of every stacked weight from the forward pass to the end of the backward (0.33 GB
    per chip for Llama-3.2-1B on a v6e-8; ``models.layers.linear.compute_copy``). Under full remat, as the
    large presets train: without it the backward pass keeps each layer's bfloat16 weights as saved residuals."""
    need(targets.parse_target(target_name).platform)
    # Three layers: a leading 3 is a layer stack (TINY's 2 is also the halves of XLA's reduce-scatter rings).
    _, hlo = cli_compile(target_name, *FSDP8, "--config.precision.remat=full", "--config.model.num_layers=3")
    entry = next(line for line in hlo.splitlines() if line.startswith("ENTRY"))
    stacked = set(re.findall(r"\bf32\[(3,\d+,\d+(?:,\d+)*)\]", entry))  # the stacked kernels
    assert len(stacked) >= 3, f"no stacked layer weights among the step's arguments: {entry[:300]}"
    copies = sorted(dims for dims in stacked if re.search(rf"\bbf16\[{dims}\]", hlo))
    assert not copies, f"bfloat16 copies of whole weight stacks: {copies}"


@pytest.mark.slow
def test_fsdp_figures_on_tpu(cli_compile):
    need("tpu")
    data = compile_tiny(TPU, "--config.mesh.data=8", "--config.mesh.fsdp=1")
    fsdp, _ = cli_compile(TPU, *FSDP8)
    assert data.fits and fsdp["fits"] and fsdp["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
    assert fsdp["argument_bytes"] < data.argument_bytes / 4  # parameters and Adam moments split 8 ways
    assert data.collectives.get("all-reduce", 0) >= 1  # data parallelism: gradients all-reduced


@pytest.mark.slow
def test_splash_attention_is_in_the_tpu_program(cli_compile):
    """The decoder's causal packed rows (the FSDP program the tests above share) and an encoder's padding masks."""
    need("tpu")
    report, hlo = cli_compile(TPU, *FSDP8)
    assert report["attention"] == "splash", report["attention_reason"]
    assert hlolib.attention_kernels(hlo) == ["splash"]
    encoder = compile_tiny(TPU, config="bert_tiny", step="eval")  # padding masks: query and key segments differ
    assert encoder.attention == "splash", encoder.attention_reason


@pytest.mark.slow
def test_gpu_flash_attention_takes_the_clis_packed_batches(cli_compile):
    need("gpu")
    report, _ = cli_compile(GPU, *GPU_BF16)
    assert report["fits"] and report["devices"] == 8
    assert report["attention"] == "gpu_flash", (report["attention"], report["attention_reason"])
    assert report["flops_per_device"] > 0 and report["roofline_s"] > 0


@pytest.mark.slow
def test_two_slices_put_the_data_axis_over_dcn():
    need("tpu")
    target = targets.parse_target(TPU, slices=2)
    devices = targets.compile_devices(target)
    mesh = sharding.make_mesh((4, 4, 1), devices)
    slices = [[d.slice_index for d in row.flat] for row in mesh.devices]  # [data][fsdp, tensor]
    assert all(len(set(row)) == 1 for row in slices)  # fsdp x tensor inside one slice
    assert {row[0] for row in slices} == {0, 1}
    with pytest.raises(ValueError, match="multiple of 2"):
        sharding.make_mesh((1, 16, 1), devices)
    report = compile_tiny(TPU, "--config.mesh.data=4", "--config.mesh.fsdp=4", slices=2)
    assert report.devices == 16 and report.slices == 2 and report.fits


def keep_compiles_per_policy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``StepProgram.lower_train_step`` that compiles each remat policy once and hands the same executable (its
    memory figures) to every later ``choose_remat`` over the same config; the policies compiled, in order."""
    from flaxzoo.train import program as programlib

    lower, kept, compiled = programlib.StepProgram.lower_train_step, {}, []

    class Kept:
        def __init__(self, executable):
            self.executable = executable

        def compile(self):
            return self.executable

    def lower_train_step(self):
        policy = self.cfg.precision.remat
        if policy not in kept:
            kept[policy] = lower(self).compile()
            compiled.append(policy)
        return Kept(kept[policy])

    monkeypatch.setattr(programlib.StepProgram, "lower_train_step", lower_train_step)
    return compiled


@pytest.mark.slow
def test_auto_remat_picks_the_cheapest_policy_that_fits(monkeypatch):
    """128 rows of 256 tokens: activations dominate, so each policy needs less memory than the one before it; the
    choice is the first (none -> dots -> full) whose compiled step fits the capacity. The second choice reads the
    first's executables (:func:`keep_compiles_per_policy`): three compiles, not five."""
    need("tpu")
    from flaxzoo.train.config import TrainConfig
    from flaxzoo.train.program import REMAT_ORDER, choose_remat

    devices = targets.compile_devices(targets.parse_target(TPU))
    overrides = [*TINY[:-1], "--config.batch_size=128", "--config.mesh.data=8", "--config.mesh.fsdp=1"]
    cfg = TrainConfig.from_config_dict(compilelib.load_config("default", overrides), 8, backend="tpu")
    assert "remat" in cfg.precision.auto
    mesh = sharding.make_mesh(cfg.mesh.shape, devices)
    compiled = keep_compiles_per_policy(monkeypatch)
    with targets.persistent_cache_off():
        nothing_fits = choose_remat(cfg, mesh, capacity=1)
        assert [t[0] for t in nothing_fits.tried] == list(REMAT_ORDER) and nothing_fits.remat == "full"
        need_none, need_dots, need_full = (figures.total for _, figures, _ in nothing_fits.tried)
        assert need_none > need_dots > need_full
        dots = choose_remat(cfg, mesh, capacity=need_dots)
        assert dots.remat == "dots" and [t[2] for t in dots.tried] == ["does not fit", "fits"]
        assert dots.program.cfg.model.remat == "dots" and dots.compiled is not None
    assert compiled == list(REMAT_ORDER)
    assert "remat dots" in dots.describe(need_dots)


def test_auto_remat_stops_at_the_first_policy_that_fits():
    """With room for anything, ``none`` is chosen after one compile (on this machine's CPU: the choice is the same
    on every platform, and the TPU test above covers the figures)."""
    import jax

    from flaxzoo.train.config import TrainConfig
    from flaxzoo.train.program import choose_remat

    overrides = [*TINY[:-1], "--config.batch_size=4", "--config.seq_len=32", "--config.mesh.data=1"]
    cfg = TrainConfig.from_config_dict(compilelib.load_config("default", overrides), 1, backend="cpu")
    choice = choose_remat(cfg, sharding.make_mesh(cfg.mesh.shape, jax.devices("cpu")[:1]), capacity=2**40)
    assert choice.remat == "none" and [t[2] for t in choice.tried] == ["fits"] and choice.compiled is not None


@pytest.mark.slow
def test_cli_json_line(cli_compile):
    need("tpu")
    row, _ = cli_compile(TPU, *FSDP8)
    for key in ("target", "devices", "mesh", "fits", "bytes_per_device", "hbm_bytes", "temp_bytes",
                "flops_per_device", "collectives", "attention"):
        assert key in row
    assert row["target"] == TPU and row["devices"] == 8 and row["fits"] is True


def test_cli_refuses_bad_input(capsys):
    assert compilelib.main(["--target", "v9z-8"]) == 2
    assert "v9z-8" in capsys.readouterr().err
    assert compilelib.main(["--target", TPU, "--config.stpes=3"]) == 2


def test_hlo_readers_count_collectives_and_kernels():
    hlo = """
  %all-gather-start.1 = (bf16[8,96]{1,0}, bf16[64,96]{1,0}) all-gather-start(bf16[8,96]{1,0} %p), dimensions={0}
  %all-gather-done.1 = bf16[64,96]{1,0} all-gather-done(%all-gather-start.1)
  %reduce-scatter.2 = f32[96]{0} reduce-scatter(f32[768]{0} %g), dimensions={0}
  %all-reduce.3 = f32[] all-reduce(f32[] %x), to_apply=%add
  %big = bf16[12,64,1024,3072]{3,2,1,0} fusion(%a), kind=kLoop
  %custom-call.4 = bf16[8,2,256,64]{3,2,1,0} custom-call(%q), custom_call_target="tpu_custom_call", kernel="splash_mha_fwd"
"""
    assert hlolib.collectives(hlo) == {"all-gather": 1, "all-reduce": 1, "reduce-scatter": 1}
    assert hlolib.attention_kernels(hlo) == ["splash"]
    assert hlolib.largest_buffers(hlo, top=1) == ["bf16[12,64,1024,3072] (big, a fusion): 4.50 GiB"]
    traced = ('%convert.7 = f32[8,256,50304]{2,1,0} convert(bf16[8,256,50304]{2,1,0} %d), '
              'metadata={op_name="jit(train_step)/jvp(loss)/while/body/lm_head/convert_element_type"}')
    assert hlolib.largest_buffers(traced) == [
        "f32[8,256,50304] (convert.7, a convert from .../body/lm_head/convert_element_type): 0.38 GiB"]
    whole = ("%gather_fusion = f32[10240,128]{1,0} fusion(f32[2048,128]{1,0} %t, s32[10240]{0} %i), kind=kLoop\n"
             "%input = f32[40,256,128]{2,1,0} parameter(0)\n%ids = s32[40,256]{1,0} parameter(1)\n"
             "%mine = f32[5,256,128]{2,1,0} add(%a, %b)\n")
    assert hlolib.global_batch_buffers(whole, 40, 256) == ["f32[10240,128] (gather_fusion, a fusion)",
                                                           "f32[40,256,128] (input, a parameter)"]
    fused = "%fused_computation.1 (p: f32[4]) -> f32[4] {\n  %inner = f32[999,999,999] add(%p, %p)\n}\n"
    assert hlolib.largest_buffers(fused) == []  # a fusion's inner values are no buffers
    assert hlolib.global_batch_buffers(fused, 999, 999) == []
    assert hlolib.collectives("%r = f32[8] ragged-all-to-all(%a)") == {}
    cudnn = '%c = bf16[8,12,64] custom-call(%q), custom_call_target="__cudnn$fmhaSoftmax"'
    assert hlolib.attention_kernels(cudnn) == ["cudnn"]


@pytest.mark.slow
def test_generate_step_compiles_at_batch_one_and_the_configs_batch():
    need("tpu")
    reports = compilelib.compile_config(compilelib.load_config("default", TINY), targets.parse_target(TPU),
                                        step="generate")
    assert [r.tokens_per_step for r in reports] == [1, 32]  # one new token per row
    assert all(r.fits and r.step.startswith("generate") for r in reports)
    assert reports[0].attention == "xla"  # one query over the cache: no full-sequence kernel
    from flaxzoo.models.modeling import abstract_model
    from flaxzoo.train.config import TrainConfig
    from flaxzoo.train.tools.roofline import decode_bytes_per_token

    cfg = TrainConfig.from_config_dict(compilelib.load_config("default", TINY), 8, backend="tpu")
    for report, batch in zip(reports, (1, 32)):  # the memory roofline against the chips' HBM bandwidth
        moved = decode_bytes_per_token(abstract_model(cfg.model, cfg.model_cls), batch, cfg.seq_len)
        (line,) = [note for note in report.notes if note.startswith("decode roofline")]
        assert f"{moved['total'] / 1e6:,.2f} MB per new token" in line and "8 x 819 GB/s" in line, line


@pytest.mark.slow
def test_finetune_config_compiles_the_finetuners_step(minilm_dir):
    need("gpu")
    config = compilelib.load_config("finetune_cls", [f"--config.init_from={minilm_dir}", "--config.num_labels=5"])
    report = compilelib.compile_config(config, targets.parse_target(GPU))[0]
    assert report.step == "train (fine-tune)" and report.fits
    assert report.mesh == {"data": 8, "fsdp": 1, "tensor": 1}  # batch 32 over 8 GPUs, parameters replicated
    assert report.tokens_per_step == 32 * 64  # batch_size x data.max_len


@pytest.mark.slow
def test_tagging_config_compiles_the_taggers_step_without_data_files(minilm_dir, tmp_path):
    """``configs/finetune_ner.py`` (``task="tag"``) as shipped: it names no CoNLL file, and none is needed; the step
    is the tagger's (``BertForTokenClassification``, the per-token loss), its head one logit per tag at every
    position of each device's rows, with the default 9 tags (CoNLL-2003's BIO)."""
    from flaxzoo.models import BertForTokenClassification
    from flaxzoo.models.io.sources import open_source
    from flaxzoo.train import flops as flopslib
    from flaxzoo.train.tools.compile_finetune import DEFAULT_TAGS

    need("gpu")  # as the classify compile above (on 2 CPU cores: 32 s for h100x8, 56 s for v5e-8)
    config = compilelib.load_config("finetune_ner", [f"--config.init_from={minilm_dir}"])
    assert not config.data.train_path and not config.data.test_path
    report = compilelib.compile_config(config, targets.parse_target(GPU), dump_hlo=str(tmp_path))[0]
    assert report.step == "train (fine-tune, task=tag)" and report.fits and report.bytes_per_device > 0
    assert report.mesh == {"data": 8, "fsdp": 1, "tensor": 1} and report.tokens_per_step == 32 * 128
    assert DEFAULT_TAGS == 9 and any("compiled with 9" in note for note in report.notes)
    encoder = open_source(minilm_dir).describe()[0].replace(num_labels=DEFAULT_TAGS)
    per_token = flopslib.flops_per_token(encoder, 128, BertForTokenClassification)
    assert report.flops_per_device == pytest.approx(per_token * 32 * 128 / 8)
    hlo = (tmp_path / f"{GPU}x1_finetune_tag.hlo.txt").read_text()
    assert re.search(r"\[4,128,9\]", hlo)  # the tag logits: 32 rows / 8 GPUs x max_len 128 x 9 tags


@pytest.mark.slow
def test_qa_config_compiles_the_span_step_without_data_files(tmp_path):
    """``configs/finetune_qa.py`` (``task="qa"``) on a tiny BERT directory: no SQuAD file is named or opened; the
    step is the span loss over ``BertForQuestionAnswering`` with the pair's ``token_type_ids`` (11 s on 2 cores)."""
    import transformers

    from finetune_data import write_vocab

    need("gpu")
    transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, pad_token_id=0)).save_pretrained(tmp_path / "bert")
    config = compilelib.load_config("finetune_qa", [f"--config.init_from={tmp_path / 'bert'}",
                                                    f"--config.tokenizer={write_vocab(tmp_path / 'vocab')}",
                                                    "--config.data.max_len=64", "--config.batch_size=16"])
    report = compilelib.compile_config(config, targets.parse_target(GPU), dump_hlo=str(tmp_path))[0]
    assert report.step == "train (fine-tune, task=qa)" and report.fits and report.tokens_per_step == 16 * 64
    assert report.mesh == {"data": 8, "fsdp": 1, "tensor": 1} and not report.notes  # no num_labels to follow
    hlo = (tmp_path / f"{GPU}x1_finetune_qa.hlo.txt").read_text()
    assert re.search(r"\[2,64,2\]", hlo)  # qa_outputs: 16 rows / 8 GPUs x max_len 64 x (start, end)


@pytest.mark.slow
def test_lora_config_compiles_in_bfloat16():
    """LoRA on the packaged SmolLM2 with the accelerators' bfloat16 compute and scanned layers: qwix's float32
    adapters once turned the residual stream float32 inside the scan ("carry input and carry output must have equal
    types"), which no CPU (float32) run could show."""
    need("tpu")
    config = compilelib.load_config("lora_smollm2", ["--config.batch_size=8", "--config.seq_len=128"])
    report = compilelib.compile_config(config, targets.parse_target(TPU))[0]
    assert report.fits and report.attention == "splash" and report.scan_layers


@pytest.mark.slow
def test_dump_hlo_writes_the_compiled_program(cli_compile):
    need("gpu")
    report, text = cli_compile(GPU, *GPU_BF16)
    assert "HloModule" in text and hlolib.attention_kernels(text) == ["gpu_flash"]
    assert report["attention"] == "gpu_flash"


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["qwen2.5-0.5b", "qwen3-0.6b", "mistral-7b", "gemma-3-270m", "phi-3-mini",
                                    "pythia-160m", "olmo-2-1b"])
def test_every_decoder_family_compiles_for_tpu(preset):
    """Each new decoder family's train step (its preset's mechanisms: biases, QK-norm, sliding windows per layer,
    sandwich / post-branch norms, parallel residual, partial rotary) at the tiny sizes, FSDP over a v5e-8."""
    need("tpu")
    from flaxzoo.models import get_preset

    config = compilelib.load_config("default", [*FAMILY, f"--config.model.preset={preset}",
                                                "--config.model.vocab_size=1024", "--config.model.num_kv_heads=1",
                                                "--config.model.head_dim=64", "--config.model.bos_token_id=1",
                                                "--config.model.eos_token_id=2", "--config.model.pad_token_id=0"])
    if get_preset(preset).layer_types is not None:  # the preset's pattern is per layer: keep one of each kind
        config.model.layer_types = ("sliding_attention", "full_attention")
    report = compilelib.compile_config(config, targets.parse_target(TPU))[0]
    assert report.fits and report.mesh["fsdp"] == 8 and report.flops_per_device > 0


@pytest.mark.slow
@pytest.mark.parametrize("preset, kernel", [
    ("distilbert-base-uncased", "splash"), ("xlm-roberta-base", "splash"), ("albert-base-v2", "splash"),
    ("electra-small-discriminator", "splash"), ("deberta-v3-small", "xla"), ("modernbert-base", "splash")])
def test_every_encoder_family_compiles_for_tpu(preset, kernel):
    """Each new encoder family's masked-LM train step (its preset's mechanisms: no token types, factorised embeddings,
    one shared layer, relative attention, local / global layers in one scan) at tiny sizes, FSDP over a v5e-8, and
    the attention core in the compiled program: splash, or XLA for DeBERTa's additive bias (splash takes none)."""
    need("tpu")
    config = compilelib.load_config("bert_tiny", [*FAMILY, f"--config.model.preset={preset}",
                                                  "--config.model.vocab_size=1024", "--config.model.head_dim=64",
                                                  "--config.model.max_position_embeddings=130",  # XLM-R: offset 2
                                                  "--config.model.pad_token_id=0", "--config.model.bos_token_id=1",
                                                  "--config.model.eos_token_id=2",
                                                  "--config.precision.scan_layers=true"])
    report = compilelib.compile_config(config, targets.parse_target(TPU))[0]
    assert report.fits and report.mesh["fsdp"] == 8 and report.flops_per_device > 0
    assert report.attention == kernel, (report.attention, report.attention_reason)
    if kernel == "xla":
        assert "bias" in report.attention_reason
