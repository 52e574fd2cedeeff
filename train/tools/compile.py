"""``python -m flaxzoo.train.compile --config configs/X.py --target TARGET [--slices N] [--config.KEY=VALUE ...]
[--json] [--dump-hlo DIR] [--step train|eval|generate]``

Compiles, on this (CPU) machine, exactly the step ``python -m flaxzoo.train`` would run for the config on the target's
devices: the same model, mesh, shardings, batch (``segment_ids`` included), optimizer, accumulation, remat, loss
chunking and precision (``flaxzoo.train.program.StepProgram``), from abstract values only: nothing is allocated and no
data is read. Fine-tuning configs (``task="classify"``, ``"tag"``, ``"qa"``) compile the fine-tuner's step
(``flaxzoo.train.tools.compile_finetune``). Targets (``flaxzoo.train.tools.targets``): TPU ``v4-8``, ``v5e-1/4/8/16/...``,
``v5p-8/16/...``, ``v6e-1/4/8/...`` (``--slices N`` for several slices), GPU ``h100xN``, ``a100xN``. Needs the
``aot`` extra (``pip install "flaxzoo[aot]"``: libtpu and the CUDA compiler plugin).

It prints the devices and mesh; per-device memory (arguments, outputs, temporaries, code) against the chip's, with
fits / does not fit, and the five largest buffers (shape, the instruction and the JAX operation that produced
each); model FLOPs per device (analytic, ``flaxzoo.train.flops``: XLA's cost analysis counts a loop body once); a
roofline lower bound of the step time; the collectives by kind; the attention kernel found in the compiled HLO.
``--json``: the same as one JSON line.
``docs/accelerators.md`` says what a compile proves and what it does not.

Exit codes: 0 compiled (on GPU also when it does not fit: XLA's GPU compiler does not refuse it, and the report says
so with the largest buffers), 1 the compile failed (on TPU a program over HBM is refused: the message says how much
it needed, and ``XLA_FLAGS=--xla_dump_to=DIR`` writes libtpu's memory report), 2 a bad command line or config, or
the ``aot`` extra missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

# Several test processes may compile for TPU at once; libtpu refuses a second loader without this.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# The CUDA plugin checks NVIDIA's libraries when JAX starts, and a CPU host has none (flaxzoo.train.tools.targets
# registers it).
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

from flaxzoo.models.jax_startup import fewer_gc_passes, quiet_jax_startup

quiet_jax_startup()  # before anything imports JAX: no CUDA plugin / libtpu start-up noise on a CPU machine

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import flags  # noqa: E402
from flax import nnx  # noqa: E402
from ml_collections import ConfigDict, config_flags  # noqa: E402

from flaxzoo.models.layers.attention_core import attention_backend  # noqa: E402
from flaxzoo.models.layers.partitioning import placed  # noqa: E402
from flaxzoo.models.modeling import abstract_model  # noqa: E402
from flaxzoo.train import flops as flopslib  # noqa: E402
from flaxzoo.train.tools import hlo as hlolib  # noqa: E402
from flaxzoo.train import sharding as shardlib  # noqa: E402
from flaxzoo.train.__main__ import DEFAULT_CONFIG, resolve_config_argument  # noqa: E402
from flaxzoo.train.config import ConfigError, TrainConfig  # noqa: E402
from flaxzoo.train.tools.compile_finetune import compile_finetune  # noqa: E402
from flaxzoo.train.finetune.config import TASKS as FINETUNE_TASKS  # noqa: E402
from flaxzoo.train.program import MemoryFigures, StepProgram, choose_remat, pretraining_program  # noqa: E402
from flaxzoo.train.tools.roofline import decode_bytes_per_token  # noqa: E402
from flaxzoo.train.tools.targets import Target, compile_devices, parse_target, persistent_cache_off  # noqa: E402

# ================================================================================================== the report
@dataclasses.dataclass
class Report:
    """What one compile found (``--json`` prints these fields)."""

    target: str
    step: str
    devices: int
    device_kind: str
    slices: int
    mesh: dict[str, int]
    fits: bool
    bytes_per_device: int
    hbm_bytes: int  # what a program may use per device (TPU: libtpu's limit; GPU: JAX's 75% of the memory)
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    code_bytes: int
    flops_per_device: float
    flops_source: str
    tokens_per_step: int
    roofline_s: float
    tokens_per_s_at_100_mfu: float
    tokens_per_s_at_50_mfu: float
    collectives: dict[str, int]
    attention: str
    attention_reason: str
    remat: str
    scan_layers: bool
    compile_s: float
    largest_buffers: list[str]
    notes: list[str]
    global_batch_buffers: list[str] = dataclasses.field(default_factory=list)

    def text(self) -> str:
        gib = 2**30
        lines = [
            f"target {self.target}: {self.devices} x {self.device_kind}"
            + (f" in {self.slices} slices (data across them, over DCN)" if self.slices > 1 else "") + "; mesh "
            + " x ".join(f"{k}={v}" for k, v in self.mesh.items()) + f"; step {self.step}; remat {self.remat}, "
            f"scan_layers {self.scan_layers}; compiled in {self.compile_s:.1f} s",
            f"memory per device: {self.bytes_per_device / gib:.2f} GiB of {self.hbm_bytes / gib:.2f} GiB -> "
            + ("fits" if self.fits else "DOES NOT FIT")
            + f" (arguments {self.argument_bytes / gib:.2f}, outputs {self.output_bytes / gib:.2f}, temporaries "
            f"{self.temp_bytes / gib:.2f}, code {self.code_bytes / gib:.3f} GiB)",
        ]
        if self.largest_buffers:
            lines.append("largest buffers per device: " + "; ".join(self.largest_buffers))
        if self.global_batch_buffers:
            lines.append("WHOLE GLOBAL BATCH on each device: " + "; ".join(self.global_batch_buffers))
        lines += [
            f"FLOPs per device per step: {self.flops_per_device / 1e9:,.1f} GFLOP ({self.flops_source})",
            f"roofline lower bound: {1e3 * self.roofline_s:.1f} ms per step of {self.tokens_per_step:,} tokens: "
            f"{self.tokens_per_s_at_100_mfu:,.0f} tokens/s at 100% MFU, {self.tokens_per_s_at_50_mfu:,.0f} at 50%",
            "collectives: " + (", ".join(f"{k} {v}" for k, v in self.collectives.items()) or "none"),
            f"attention: {self.attention} ({self.attention_reason})",
        ]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def json_line(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def roofline(flops_per_device: float, bytes_per_device: float, target: Target) -> float:
    """Seconds a step needs at least: the larger of its FLOPs at the chip's peak and its bytes at the chip's memory
    bandwidth."""
    return max(flops_per_device / target.peak_flops, bytes_per_device / target.hbm_bandwidth)


def _report(target: Target, step: str, devices: list[jax.Device], mesh: jax.sharding.Mesh,
            compiled: jax.stages.Compiled, *, flops_total: float, flops_source: str, tokens: int,
            attention: tuple[str, str], remat: str, scan_layers: bool, compile_s: float, notes: list[str],
            batch: tuple[int, int] | None = None) -> Report:
    """The report of one compiled program. ``batch``: its global ``(rows, seq)`` when the rows are split over
    several devices, to find buffers that hold them all (:func:`flaxzoo.train.tools.hlo.global_batch_buffers`)."""
    memory = MemoryFigures.of(compiled)
    hlo = compiled.as_text()
    flops_per_device = flops_total / len(devices)
    # Every argument (parameters, optimizer state) is read and every output written at least once.
    traffic = memory.arguments + memory.outputs
    seconds = roofline(flops_per_device, traffic, target)
    found = hlolib.attention_kernels(hlo)
    backend, reason = attention
    kernel = found[0] if found else backend
    if backend in ("splash", "gpu_flash", "cudnn") and backend not in found:
        notes = [*notes, f"the dispatcher chose {backend} but its kernel is not in the compiled HLO"]
    return Report(
        target=target.name, step=step, devices=len(devices), device_kind=devices[0].device_kind,
        slices=shardlib.slice_count(devices),
        mesh=dict(mesh.shape), fits=memory.total <= target.usable_hbm_bytes, bytes_per_device=memory.total,
        hbm_bytes=target.usable_hbm_bytes, argument_bytes=memory.arguments,
        output_bytes=memory.outputs - memory.aliased,
        temp_bytes=memory.temporaries, code_bytes=memory.code, flops_per_device=flops_per_device,
        flops_source=flops_source, tokens_per_step=tokens, roofline_s=seconds,
        tokens_per_s_at_100_mfu=(tokens / (flops_per_device / target.peak_flops)) if flops_per_device else 0.0,
        tokens_per_s_at_50_mfu=(0.5 * tokens / (flops_per_device / target.peak_flops)) if flops_per_device else 0.0,
        collectives=hlolib.collectives(hlo), attention=kernel, attention_reason=reason, remat=remat,
        scan_layers=scan_layers, compile_s=compile_s,
        largest_buffers=hlolib.largest_buffers(hlo), notes=notes,
        global_batch_buffers=hlolib.global_batch_buffers(hlo, *batch) if batch else [])


# ================================================================================================= compiling
def compile_pretraining(cfg: TrainConfig, target: Target, devices: list[jax.Device], *, step: str = "train",
                        dump_hlo: str | None = None) -> list[Report]:
    """Compile a pre-training config's train (or eval / generate) step for ``devices``; one report per program."""
    mesh = shardlib.make_mesh(cfg.mesh.shape, devices)
    platform = shardlib.platform_of(devices[0])
    notes: list[str] = []
    start = time.perf_counter()
    if step == "generate":
        return compile_generate(cfg, target, devices, mesh, dump_hlo=dump_hlo)
    if step == "train" and "remat" in cfg.precision.auto:
        choice = choose_remat(cfg, mesh, target.usable_hbm_bytes)
        notes.append(choice.describe(target.usable_hbm_bytes))
        program, compiled = choice.program, choice.compiled
        if compiled is None:  # even full remat failed to compile within HBM: report its figures as the error said
            raise RuntimeError("; ".join(v for _, _, v in choice.tried))
    else:
        program = pretraining_program(cfg, mesh)
        lowered = program.lower_train_step() if step == "train" else program.lower_eval_step()
        compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    cfg = program.cfg
    notes += [f"unsplit: {line}" for line in program.unsplit]
    predictions = cfg.data.predictions if cfg.objective == "mlm" else None
    per_token = flopslib.flops_per_token(cfg.model, cfg.seq_len, cfg.model_cls, predictions=predictions,
                                         trained=program.trainable_count if program.lora else None)
    if step == "eval":  # the forward pass alone
        per_token = flopslib.forward_flops_per_token(cfg.model, cfg.seq_len, cfg.model_cls)
    tokens = cfg.batch_size * cfg.seq_len
    if dump_hlo:
        _dump(dump_hlo, f"{target.name}x{target.slices}_{step}", compiled)
    attention = attention_backend(cfg.model, q_len=cfg.seq_len, masked=True, training=step == "train",
                                  platform=platform)
    rows = cfg.batch_size // (cfg.optim.accum_steps if step == "train" else 1)  # a (micro-)batch's rows
    split = cfg.mesh.data * cfg.mesh.fsdp > 1
    return [_report(target, step, devices, mesh, compiled, flops_total=per_token * tokens,
                    flops_source="analytic model FLOPs, flaxzoo.train.flops (6N + 12LTd; XLA counts a scanned layer "
                                 "once)",
                    tokens=tokens, attention=attention, remat=cfg.model.remat, scan_layers=cfg.model.scan_layers,
                    compile_s=compile_s, notes=notes, batch=(rows, cfg.seq_len) if split else None)]


def compile_generate(cfg: TrainConfig, target: Target, devices: list[jax.Device], mesh: jax.sharding.Mesh, *,
                     dump_hlo: str | None = None) -> list[Report]:
    """One cached decode step (one new token per row against a ``seq_len`` cache) at batch 1 and at the config's
    batch, the parameters sharded as in training."""
    program = pretraining_program(cfg, mesh)
    params_sharding = program.state_shardings["params"]
    graphdef, rest = program.graphdef, program.abstract_rest
    per_token = flopslib.forward_flops_per_token(cfg.model, cfg.seq_len, cfg.model_cls)
    reports = []
    for batch in sorted({1, cfg.batch_size}):
        def decode(params, rest, state, tokens):
            model = nnx.merge(graphdef, params, rest)
            model.eval()
            with placed(program.activation_placement):  # the target's platform, as on its devices
                logits, state = model.decode(tokens, state)
            return jnp.argmax(logits[:, -1], axis=-1), state

        state_shape = jax.eval_shape(lambda: _init_state(program, batch, cfg.seq_len))
        state_sharding = jax.tree.map(lambda _: program.replicated, state_shape)  # the cache whole on every device
        abstract_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state_shape,
                                      state_sharding)
        tokens = jax.ShapeDtypeStruct((batch, 1), jnp.int32, sharding=program.replicated)
        start = time.perf_counter()
        compiled = jax.jit(decode, in_shardings=(params_sharding, program.rest_shardings, state_sharding,
                                                 program.replicated)).lower(
            program.target["params"], rest, abstract_state, tokens).compile()
        compile_s = time.perf_counter() - start
        if dump_hlo:
            _dump(dump_hlo, f"{target.name}x{target.slices}_generate_b{batch}", compiled)
        attention = attention_backend(cfg.model, q_len=1, k_len=cfg.seq_len, masked=True,
                                      platform=shardlib.platform_of(devices[0]))
        moved = decode_bytes_per_token(abstract_model(cfg.model, cfg.model_cls), batch, cfg.seq_len)
        step_s = moved["total"] * batch / (len(devices) * target.hbm_bandwidth)
        roofline = (f"decode roofline: {moved['total'] / 1e6:,.2f} MB per new token (weights "
                    f"{moved['weights'] / 1e6:,.2f}, cache {moved['cache'] / 1e6:,.2f}) over {len(devices)} x "
                    f"{target.hbm_bandwidth / 1e9:,.0f} GB/s of HBM: >= {1e3 * step_s:.3f} ms per step, <= "
                    f"{batch / step_s:,.0f} new tokens/s")
        reports.append(_report(target, f"generate (batch {batch}, cache {cfg.seq_len})", devices, mesh, compiled,
                               flops_total=per_token * batch, flops_source="analytic forward FLOPs (2N + 4LTd)",
                               tokens=batch, attention=attention, remat="none", scan_layers=cfg.model.scan_layers,
                               compile_s=compile_s, notes=["the decode state is replicated on every device",
                                                           roofline]))
    return reports


def _init_state(program: StepProgram, batch: int, max_len: int):
    model = nnx.merge(program.graphdef, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), program.target["params"]),
                      jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), program.abstract_rest))
    return model.init_state(batch, max_len)


def _dump(directory: str, name: str, compiled: jax.stages.Compiled) -> None:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.hlo.txt")
    with open(path, "w") as f:
        f.write(compiled.as_text())
    print(f"HLO written to {path}", file=sys.stderr)


# ============================================================================================ the command line
def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m flaxzoo.train.compile", description=__doc__.split("\n\n")[1])
    parser.add_argument("--config", default="default", help="a config file or a name from configs/")
    parser.add_argument("--target", help="v4-8, v5e-8, v5p-8, v6e-8, h100x8, a100x8, ...")
    parser.add_argument("--slices", type=int, default=1, help="TPU slices joined over DCN (default 1)")
    parser.add_argument("--step", choices=("train", "eval", "generate"), default="train")
    parser.add_argument("--json", action="store_true", help="one JSON line per compiled program")
    parser.add_argument("--dump-hlo", metavar="DIR", help="write the compiled HLO text into DIR")
    parser.add_argument("--table", action="store_true",
                        help="compile every accelerator preset on v5e-8, v5p-8, v6e-8 and h100x8 (or --configs / "
                             "--targets) and print a markdown table")
    parser.add_argument("--configs", default=",".join(TABLE_CONFIGS), help="--table: comma-separated configs")
    parser.add_argument("--targets", default=",".join(TABLE_TARGETS), help="--table: comma-separated targets")
    return parser.parse_known_args(argv)


TABLE_CONFIGS = ("gpt2_small", "gpt2_medium", "bert_base", "llama_small", "qwen2_5_0_5b", "gemma3_270m",
                 "finetune_cls", "modernbert_tiny")
TABLE_TARGETS = ("v5e-8", "v5p-8", "v6e-8", "h100x8")


def table(configs: list[str], target_names: list[str], overrides: list[str], *, slices: int = 1) -> tuple[str, int]:
    """``(markdown table, failed compiles)``: one row per (config, target) with fits, GiB per chip, the roofline step
    time and tokens/s at 50% MFU. A compile that fails gets its one-line error in the row."""
    failures = 0
    rows = ["| config | target | mesh | remat | attention | fits | GiB / chip (of) | roofline step | tokens/s at "
            "50% MFU | compile |", "|---|---|---|---|---|---|---:|---:|---:|---:|"]
    for name in configs:
        for target_name in target_names:
            target = parse_target(target_name, slices)
            try:
                report = compile_config(load_config(name, overrides), target)[0]
            except Exception as exc:  # noqa: BLE001 - the table says what failed and goes on
                failures += 1
                rows.append(f"| {name} | {target_name} | | | | error: {str(exc).splitlines()[0][:160]} | | | | |")
                print(rows[-1], file=sys.stderr, flush=True)
                continue
            mesh = " x ".join(f"{k}={v}" for k, v in report.mesh.items() if v > 1) or "1 device"
            rows.append(f"| {name} | {target_name} | {mesh} | {report.remat} | {report.attention} | "
                        f"{'yes' if report.fits else 'no'} | {report.bytes_per_device / 2**30:.2f} "
                        f"({report.hbm_bytes / 2**30:.1f}) | {1e3 * report.roofline_s:.1f} ms | "
                        f"{report.tokens_per_s_at_50_mfu:,.0f} | {report.compile_s:.0f} s |")
            print(rows[-1], file=sys.stderr, flush=True)
    return "\n".join(rows), failures


def load_config(config: str, overrides: list[str]) -> ConfigDict:
    """The ``ConfigDict`` of ``--config`` with ``--config.KEY=VALUE`` overrides, as ``python -m flaxzoo.train`` reads
    it."""
    argv, error = resolve_config_argument(["compile", f"--config={config}", *overrides])
    if error:
        raise ConfigError("config", error)
    values = flags.FlagValues()
    saved, sys.argv = sys.argv, argv  # ml_collections defines the override flags from sys.argv
    try:
        flag = config_flags.DEFINE_config_file("config", str(DEFAULT_CONFIG), "config", flag_values=values,
                                               lock_config=True)
        values(argv)
        return flag.value
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError("config", str(exc).splitlines()[0]) from None
    finally:
        sys.argv = saved


def compile_config(config: ConfigDict, target: Target, *, step: str = "train",
                   dump_hlo: str | None = None) -> list[Report]:
    """Compile a ``ConfigDict`` (pre-training, ``task="classify"``, ``"tag"`` or ``"qa"``) for ``target``; its
    reports."""
    devices = compile_devices(target)
    with persistent_cache_off():  # compile-only executables can be stored in it but not loaded back
        return _compile_config(config, target, devices, step=step, dump_hlo=dump_hlo)


def _compile_config(config: ConfigDict, target: Target, devices: list[jax.Device], *, step: str,
                    dump_hlo: str | None) -> list[Report]:
    task = config.get("task", None)
    if task in FINETUNE_TASKS:
        report, compiled = compile_finetune(config, target, devices, report=_report)
        if dump_hlo:
            _dump(dump_hlo, f"{target.name}x{target.slices}_finetune" + ("" if task == "classify" else f"_{task}"),
                  compiled)
        return [report]
    cfg = TrainConfig.from_config_dict(config, len(devices), backend=shardlib.platform_of(devices[0]))
    return compile_pretraining(cfg, target, devices, step=step, dump_hlo=dump_hlo)


def main(argv: list[str] | None = None) -> int:
    fewer_gc_passes()
    args, rest = parse_args(list(sys.argv[1:] if argv is None else argv))
    unknown = [a for a in rest if not a.startswith("--config.")]
    if unknown:
        print(f"error: unrecognised arguments {unknown}; expected --config.KEY=VALUE overrides", file=sys.stderr)
        return 2
    if args.table:
        if args.json or args.step != "train" or args.dump_hlo or args.target:
            print("error: --table compiles the train step of --configs on --targets; it takes no --target, --step, "
                  "--json or --dump-hlo", file=sys.stderr)
            return 2
        text, failures = table(args.configs.split(","), args.targets.split(","), rest, slices=args.slices)
        print(text)
        return 1 if failures else 0
    if not args.target:
        print("error: --target is required (v5e-8, v5p-8, v6e-8, h100x8, a100x8, ...)", file=sys.stderr)
        return 2
    try:
        target = parse_target(args.target, args.slices)
        config = load_config(args.config, rest)
    except (ValueError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        reports = compile_config(config, target, step=args.step, dump_hlo=args.dump_hlo)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the compiler's own error (e.g. RESOURCE_EXHAUSTED), said in one line
        first = str(exc).splitlines()[0][:2000] if str(exc) else type(exc).__name__
        verdict = "does not fit" if "RESOURCE_EXHAUSTED" in str(exc) else "the compile failed"
        print(f"error: {verdict} on {target.name}: {first}", file=sys.stderr)
        return 1
    for report in reports:
        print(report.json_line() if args.json else report.text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
