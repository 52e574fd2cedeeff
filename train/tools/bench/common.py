"""What every bench workload shares: the host (:func:`machine`, :func:`cpu_model_name`), timing (:func:`timed`),
memory, the peak each round's MFU is measured against, each side's median round, and the printed line.

**Peak and MFU.** On CPU the peak is the float32 matmul peak (``N x N`` by ``N x N``, ``N = --peak-size``, best of 5,
``flaxzoo.train.flops.time_cpu_matmul``) measured in this process right before each round's work (:func:`round_peak`):
the peak and the work see the same machine, seconds apart, however many rounds and workloads the run has. On
accelerators it is the device's table peak. :func:`add_mfu` never reports an MFU above 100 %: when a round's work ran
faster than the peak measured before it (a host that was busy during the measurement), the peak is measured again
after the work and the higher kept; if the work still outruns it, MFU is left out (``None``) and ``mfu_note`` says
why.

**Peak memory**: ``device.memory_stats()["peak_bytes_in_use"]`` where the backend has it (GPU, TPU); on CPU the
process's maximum resident set size (``getrusage``), which includes Python, the libraries and, after a comparison,
PyTorch.
"""

from __future__ import annotations

import math
import os
import platform
import resource
import time
from typing import Any, Callable

import jax

from flaxzoo.train import flops as flopslib


# ===================================================================================================== the host
def machine() -> str:
    """The device the workloads run on: ``"<lscpu model name>, N cores"`` or ``"N x <device kind>"``."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        return f"{cpu_model_name()}, {os.cpu_count()} cores"
    return f"{len(jax.devices())} x {device.device_kind}"


def cpu_model_name() -> str:
    """The CPU's model name as ``lscpu`` shows it (``/proc/cpuinfo``), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def current_rss_mb() -> float:
    """This process's resident set now, in MiB (``/proc/self/statm``; NaN where there is none)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except OSError:
        return float("nan")


def peak_memory_bytes() -> tuple[int, str]:
    """``(bytes, what they are)``: the device's ``peak_bytes_in_use`` where the backend has it, else the process's
    maximum resident set."""
    stats = jax.devices()[0].memory_stats() if jax.devices()[0].platform != "cpu" else None
    if stats and "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process max RSS"


def timed(fn: Callable[[], Any], warmup: int, steps: int) -> list[float]:
    """Wall-clock seconds of ``steps`` calls of ``fn`` (which blocks until its result is ready) after ``warmup``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


# ======================================================================================================= the peak
def round_peak(size: int) -> tuple[float, str]:
    """``(peak FLOP/s, how it was obtained)`` for one round: on CPU the matmul peak measured now, beside the round's
    work; on an accelerator the table's dense bf16 peak of one device (NaN when the device is not in the table)."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        return flopslib.time_cpu_matmul(size), f"measured fp32 matmul peak ({size}^3, best of 5, beside the round)"
    return flopslib.device_peak([device], cpu_size=size)


def add_mfu(result: dict[str, Any], peak: float, peak_kind: str, size: int) -> dict[str, Any]:
    """``result`` (with ``flops_per_token`` and ``tokens_per_s``) given ``mfu``, ``peak_flops`` and ``peak_kind``.

    MFU is never above 1: on CPU, work that outran ``peak`` has the peak measured again (after the work; the higher
    kept); if it still outruns it, or the peak is unknown, ``mfu`` is None and ``mfu_note`` says why."""
    achieved = result["flops_per_token"] * result["tokens_per_s"]
    if achieved > peak and jax.devices()[0].platform == "cpu":
        again = flopslib.time_cpu_matmul(size)
        if again > peak:
            peak, peak_kind = again, peak_kind.replace("beside the round", "measured again after the work")
    result.update(peak_flops=peak, peak_kind=peak_kind, mfu=None)
    if not math.isfinite(peak) or peak <= 0:
        result["mfu_note"] = f"MFU left out: {peak_kind}"
    elif achieved > peak:
        result["mfu_note"] = (f"MFU left out: the work ran at {achieved / 1e9:.1f} GFLOP/s, above the measured peak of "
                              f"{peak / 1e9:.1f} GFLOP/s (a busy host when the peak was measured)")
    else:
        result["mfu"] = achieved / peak
    return result


# ===================================================================================================== the rounds
def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median tokens/s (the lower middle one for an even count), with the first round's compile
    and first-call times (later rounds reuse compiled programs)."""
    ranked = sorted(rounds, key=lambda r: r["tokens_per_s"])
    summary = dict(ranked[(len(ranked) - 1) // 2])
    summary.update({key: rounds[0][key] for key in ("compile_s", "first_call_s") if key in rounds[0]})
    return summary


def report_line(name: str, r: dict[str, Any]) -> str:
    """One side of one round as printed: tokens/s, time per step (per new token when generating), MFU and the peak
    it is against (or why it is left out), a decode's bytes per token and the fraction of the measured memory
    bandwidth they take, compile and first-call times, peak memory, parameters."""
    extra = f", first call {r['first_call_s']:.2f} s" if "first_call_s" in r else ""
    compile_s = f", compile {r['compile_s']:.2f} s" if "compile_s" in r else ""
    unit = "new tokens/s" if name == "gpt_generate" else "tokens/s"
    step = "ms/token" if name == "gpt_generate" else "ms/step"
    mfu = (f"MFU {100 * r['mfu']:.1f}% of {r['peak_flops'] / 1e9:,.0f} GFLOP/s" if r["mfu"] is not None
           else f"{r['mfu_note']}")
    roofline = (f", {r['bytes_per_token'] / 1e6:.2f} MB/token: {100 * r['bandwidth_fraction']:.0f}% of "
                f"{r['bandwidth'] / 1e9:.1f} GB/s (roofline {r['roofline_tokens_per_s']:,.0f} tokens/s)"
                if "bandwidth_fraction" in r else "")
    return (f"{r['tokens_per_s']:,.0f} {unit}, {r['step_ms']:.2f} {step}, {mfu}{roofline}{compile_s}{extra}, peak "
            f"memory {r['peak_memory_mb']:,.0f} MiB ({r['memory_kind']}), {r['params']:,} params")
