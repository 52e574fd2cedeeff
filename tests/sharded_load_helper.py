"""The sharded-loading tests' side that needs its own process (tests/test_sharded_load.py): a device count, or a
clean peak-memory figure.

Usage: python tests/sharded_load_helper.py COMMAND ARGS_JSON
  checks  {"cases": [{"name", "path", "mesh", "kwargs", "reads"}...], "workdirs": [{"from", "kwargs", "to"}...],
           "out"}: first writes each work directory (``save_checkpoint`` of ``from_pretrained(from, **kwargs)``),
           then per case compares ``load_sharded(path, shardings=<param_shardings on mesh>, **kwargs)`` with
           ``from_pretrained(path, **kwargs)``: the parameter names, each value (exactly), dtype and sharding; with
           ``reads``, every ``Read`` summed per tensor. Writes a JSON report to ``out``. Needs 8 devices.
  memory  {"path", "mode": "sharded" | "full", "mesh", "out"}: load ``path`` with ``load_sharded`` on ``mesh`` or
           with ``from_pretrained``, block until ready, write the peak resident set (``VmHWM``) and the
           parameter count to ``out``.
  llama   {"dir", "hidden", "layers", "intermediate", "vocab", "heads"}: a random transformers LlamaForCausalLM
           saved there (float32 safetensors), for ``memory``.
Run with XLA_FLAGS=--xla_force_host_platform_device_count=8 and JAX_PLATFORMS=cpu.
"""

from __future__ import annotations

import json
import pathlib
import resource
import sys
import warnings
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent


def mesh_shardings(mesh_shape: list[int]):
    """The callable ``load_sharded`` takes: the trainers' shardings (``param_shardings``) of the abstract params."""
    from flax import nnx

    from flaxzoo.train.sharding import make_mesh, param_shardings

    mesh = make_mesh(mesh_shape)
    return lambda abstract: param_shardings(nnx.to_pure_dict(nnx.get_partition_spec(abstract)),
                                            nnx.to_pure_dict(abstract), mesh)


def compare(case: dict[str, Any]) -> dict[str, Any]:
    """One case's report: names equal, values unequal, dtypes / shardings other than asked, reads per tensor."""
    import numpy as np
    from flax import nnx

    from flaxzoo.models.families.base import dotted
    from flaxzoo.models.io import from_pretrained
    from flaxzoo.models.io.sharded import load_sharded, pretrained_shapes
    from flaxzoo.models.io.sharded_plan import flat_tree

    kwargs = case.get("kwargs", {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reference = dict(nnx.to_flat_state(nnx.split(from_pretrained(case["path"], **kwargs), nnx.Param, ...)[1]))
    reference_warnings = sorted(str(w.message) for w in caught if "lacks" in str(w.message))
    shardings = mesh_shardings(case["mesh"])
    shape_kwargs = {k: v for k, v in kwargs.items() if k != "seed"}
    asked = flat_tree(shardings(pretrained_shapes(case["path"], **shape_kwargs).params))
    reads: list[Any] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = dict(nnx.to_flat_state(load_sharded(case["path"], shardings=shardings, on_read=reads.append,
                                                     **kwargs)))
    report: dict[str, Any] = {
        "names_equal": sorted(map(dotted, loaded)) == sorted(map(dotted, reference)),
        "unequal": [dotted(p) for p in reference if p in loaded and not np.array_equal(
            np.asarray(reference[p].get_value()), np.asarray(loaded[p].get_value()))],
        "wrong_dtype": [dotted(p) for p in reference if p in loaded and
                        loaded[p].get_value().dtype != reference[p].get_value().dtype],
        "wrong_sharding": [dotted(p) for p, v in loaded.items() if v.get_value().sharding != asked[p]],
        "split": sorted({a for s in asked.values() for e in s.spec if e is not None
                         for a in ((e,) if isinstance(e, str) else e)}),
        "warnings_equal": sorted(str(w.message) for w in caught if "lacks" in str(w.message)) == reference_warnings,
        "initialised": len(reference_warnings),
    }
    if case.get("reads"):
        per: dict[str, dict[str, Any]] = {}
        for r in reads:
            entry = per.setdefault(r.tensor, {"total": 0, "largest": 0, "count": 0, "exact": True})
            entry["total"] += r.elements
            entry["largest"] = max(entry["largest"], r.elements)
            entry["count"] += 1
            entry["exact"] = entry["exact"] and r.exact
        report["reads"] = per
    return report


def checks(args: dict[str, Any]) -> None:
    import jax

    from flaxzoo.models.io.checkpoint import save_checkpoint
    from flaxzoo.models.io import from_pretrained

    assert jax.device_count() == 8, jax.devices()
    for workdir in args.get("workdirs", []):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            save_checkpoint(from_pretrained(workdir["from"], **workdir.get("kwargs", {})), workdir["to"])
    report = {case["name"]: compare(case) for case in args["cases"]}
    pathlib.Path(args["out"]).write_text(json.dumps(report, indent=1))


def memory(args: dict[str, Any]) -> None:
    import jax
    from flax import nnx

    from flaxzoo.models.io import from_pretrained
    from flaxzoo.models.io.sharded import load_sharded

    jax.devices()
    baseline = status_kib("VmRSS")  # imports and backend, before loading
    if args["mode"] == "sharded":
        params = load_sharded(args["path"], shardings=mesh_shardings(args["mesh"]))
    else:
        params = nnx.split(from_pretrained(args["path"]), nnx.Param, ...)[1]
    leaves = jax.block_until_ready(jax.tree.leaves(params))
    pathlib.Path(args["out"]).write_text(json.dumps({
        "peak_rss_mib": status_kib("VmHWM") / 1024, "baseline_rss_mib": baseline / 1024, "params": int(sum(x.size for x in leaves)),
        "devices": jax.device_count()}))


def status_kib(field: str) -> int:
    """``field`` of /proc/self/status in KiB: ``VmHWM`` (the peak resident set of this program alone: ``ru_maxrss``
    keeps the high-water mark of the process it was forked from across ``exec``), ``VmRSS`` (now). Without /proc:
    ``ru_maxrss`` (KiB on Linux)."""
    status = pathlib.Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

def llama(args: dict[str, Any]) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=args["vocab"], hidden_size=args["hidden"],
                                      num_hidden_layers=args["layers"], num_attention_heads=args["heads"],
                                      num_key_value_heads=args["heads"], intermediate_size=args["intermediate"],
                                      max_position_embeddings=128)
    transformers.LlamaForCausalLM(config).save_pretrained(args["dir"], max_shard_size="2GB")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    from flaxzoo.models.jax_startup import fewer_gc_passes, quiet_jax_startup

    quiet_jax_startup()  # before JAX: without the CUDA plugin's / libtpu's start-up lines in the tests' logs
    fewer_gc_passes()
    {"checks": checks, "memory": memory, "llama": llama}[sys.argv[1]](json.loads(sys.argv[2]))
