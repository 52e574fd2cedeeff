"""Tiny training configs for the tests, and the parts of tests that need their own process (a device count).

Usage: python tests/train_helper.py COMMAND ARGS_JSON
  parity   {"kind", "data_dir", "workdir", "meshes": [[d, f, t], ...], "steps", "out", "extra": {key: value}}
           the losses and parameters after ``steps`` steps on a one-device mesh and on each mesh; writes the largest
           differences, the trained parameters' names and the specs of their shardings and of the frozen ``rest``'s
           to ``out`` (JSON). Needs as many devices as the largest mesh. ``kind="lora"`` needs
           ``extra["init_from"]``: a base written by :func:`tiny_base`.
  save     {"kind", "data_dir", "workdir", "mesh", "steps", "out"}: train ``steps`` steps on ``mesh``, checkpoint,
           write the state to ``out`` (.npz)
  restore  {"kind", "data_dir", "workdir", "mesh", "out"}: restore the latest checkpoint onto ``mesh``, write the
           state and the shardings' specs to ``out`` (.npz / .json)
Run with XLA_FLAGS=--xla_force_host_platform_device_count=N for N CPU devices.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent

# The XLA flags of the training processes the tests start: LLVM at -O0 and XLA's elemental emitters, as the test
# processes themselves compile (tests/conftest.py). Their models are tiny, so compiling is most of their time.
TINY_MODEL_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def helper_process_env(**extra: str) -> dict[str, str]:
    """The environment of a ``python -m multihost_helper`` / launcher process on CPU: this one's without its ``JAX_*``
    variables and ``XLA_FLAGS``, ``tests/`` on the path, the tiny models' XLA flags, then ``extra``."""
    out = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_FLAGS"))}
    return {**out, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO / "tests"),
            "XLA_FLAGS": TINY_MODEL_XLA_FLAGS, **extra}

# A tiny model and a small tokenizer: compiles in a second or two, 40 steps take a few seconds.
TINY_MODEL = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64, "vocab_size": 512}
CONFIG_FILES = {"gpt": "default.py", "bert": "bert_tiny.py", "lora": "lora_smollm2.py"}
TINY_BASE_VOCAB = 512  # the tiny LoRA base's vocabulary (model and tokenizer)


def overrides(kind: str, data_dir: str, **extra: Any) -> dict[str, Any]:
    """Dotted config keys → values for a tiny run of ``kind`` ("gpt" | "bert" | "lora") on the embedded corpus.
    "lora" (``configs/lora_smollm2.py``) sets no ``model.*`` key: the model is ``init_from``'s (give it in ``extra``:
    a :func:`tiny_base` directory)."""
    values: dict[str, Any] = {} if kind == "lora" else {f"model.{k}": v for k, v in TINY_MODEL.items()}
    values.update({
        "seq_len": 32, "batch_size": 8, "steps": 40, "log_every": 1, "eval_every": 0, "eval_batches": 2,
        "checkpoint_every": 5, "keep_checkpoints": 3, "optim.warmup_steps": 5, "optim.lr": 3e-3,
        "data.data_dir": data_dir, "data.tokenizer_max_docs": 1500, "sample.max_new_tokens": 8,
    })
    if kind == "lora":
        values.update({"eval_at_start": False, "optim.lr": 1e-2, "optim.warmup_steps": 1, "lora.rank": 4,
                       "sample.max_new_tokens": 0})
    values.update(extra)
    return values


def config_file(kind: str) -> str:
    return str(REPO / "configs" / CONFIG_FILES[kind])


def tiny_base(directory: str | os.PathLike, data_dir: str, seed: int = 0) -> pathlib.Path:
    """A tiny pretrained base for LoRA runs (``init_from``): a random Llama-layout model (``llama-tiny`` with a
    vocabulary of :data:`TINY_BASE_VOCAB`) written by ``models.save_pretrained`` as a Hugging Face directory, and
    beside it, as ``tokenizer.json``, the byte-level BPE tokenizer the tiny GPT runs train on the embedded corpus
    (``flaxzoo.train.data.build_tokenizer``, cached in ``data_dir``: the LoRA runs then share the GPT runs' packed data)."""
    from flaxzoo import models
    from flaxzoo.train.config import TrainConfig
    from flaxzoo.train.data import build_tokenizer

    directory = pathlib.Path(directory)
    data = TrainConfig.from_config_dict(make_config("gpt", data_dir), 1).data
    tokenizer = build_tokenizer(data)
    if tokenizer.vocab_size > TINY_BASE_VOCAB:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens, more than the base's {TINY_BASE_VOCAB}")
    model = models.create_model(models.get_preset("llama-tiny").replace(vocab_size=TINY_BASE_VOCAB), seed=seed)
    models.save_pretrained(model, directory)
    tokenizer.save(directory / "tokenizer.json")
    return directory


def as_flags(kind: str, values: dict[str, Any]) -> list[str]:
    """The command line of ``python -m flaxzoo.train`` for ``values``."""
    return ["--config", config_file(kind)] + [f"--config.{k}={v}" for k, v in values.items()]


def make_config(kind: str, data_dir: str, **extra: Any):
    """The tiny config as a ``ConfigDict`` (for in-process tests)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"config_{kind}", config_file(kind))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    for key, value in overrides(kind, data_dir, **extra).items():
        node = config
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return config


def run_steps(trainer, steps: int):
    """``(state, losses)`` after ``steps`` train steps from a fresh state on ``trainer``'s mesh."""
    import jax
    import jax.numpy as jnp

    from flaxzoo.train.sharding import global_batch

    state, rest = trainer.initial_state()
    iterator = trainer.train_iterator()
    losses = []
    for _ in range(steps):
        state, metrics = trainer._train_step(state, rest, global_batch(next(iterator), trainer.batch_sharding),
                                            jnp.bool_(True))
        losses.append(float(jax.device_get(metrics["loss"])))
    return state, losses


def flat_state(state) -> dict[str, Any]:
    import jax
    import numpy as np

    from flaxzoo.train.checkpoint import _leaf_name

    return {_leaf_name(path): np.asarray(jax.device_get(leaf))
            for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]}


def _mesh_config(args: dict[str, Any], mesh) -> Any:
    return make_config(args["kind"], args["data_dir"], **{"mesh.data": mesh[0], "mesh.fsdp": mesh[1],
                                                          "mesh.tensor": mesh[2]}, **args.get("extra", {}))


def main(command: str, args: dict[str, Any]) -> None:
    import jax
    import numpy as np

    from flaxzoo.train.pretrain import Trainer

    if command == "parity":
        reference = Trainer(_mesh_config(args, (1, 1, 1)), args["workdir"], devices=jax.devices()[:1])
        initial = flat_state(reference.initial_state()[0]["params"])  # what each parameter starts from
        ref_state, ref_losses = run_steps(reference, args["steps"])
        ref_params = flat_state(ref_state["params"])
        report = {}
        for mesh in args["meshes"]:
            count = int(np.prod(mesh))
            trainer = Trainer(_mesh_config(args, mesh), args["workdir"], devices=jax.devices()[:count])
            state, losses = run_steps(trainer, args["steps"])
            params = flat_state(state["params"])
            specs = {str(s.spec) for s in jax.tree.leaves(trainer.state_shardings["params"])}
            report["x".join(map(str, mesh))] = {
                "losses": losses, "reference_losses": ref_losses,
                "max_loss_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)),
                "max_param_diff": max(float(np.max(np.abs(params[k] - ref_params[k]))) for k in ref_params),
                "param_specs": sorted(specs), "param_names": sorted(params),
                "moved": sorted(k for k in params if np.any(params[k] != initial[k])),
                "rest_specs": sorted({str(s.spec) for s in jax.tree.leaves(trainer.rest_shardings)}),
            }
        pathlib.Path(args["out"]).write_text(json.dumps(report, indent=1))
    elif command == "save":
        from flaxzoo.train.checkpoint import Checkpointer

        trainer = Trainer(_mesh_config(args, args["mesh"]), args["workdir"])
        state, _ = run_steps(trainer, args["steps"])
        checkpointer = Checkpointer(args["workdir"])
        checkpointer.save(args["steps"], state, args["steps"], trainer.meta())  # the data position is the step
        checkpointer.close()
        np.savez(args["out"], **flat_state(state))
    elif command == "restore":
        from flaxzoo.train.checkpoint import Checkpointer

        trainer = Trainer(_mesh_config(args, args["mesh"]), args["workdir"])
        checkpointer = Checkpointer(args["workdir"])
        restored = checkpointer.restore_latest(trainer.target, model_class=trainer.model_cls.__name__,
                                               config=trainer.model_config.to_dict())
        checkpointer.close()
        np.savez(args["out"], **flat_state(restored.state))
        specs = {name: str(leaf.sharding.spec) for name, leaf in
                 zip(flat_state(restored.state["params"]), jax.tree.leaves(restored.state["params"]))}
        pathlib.Path(args["out"] + ".json").write_text(json.dumps({"step": restored.step, "devices": jax.device_count(),
                                                                   "specs": specs}))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from flaxzoo.models.jax_startup import fewer_gc_passes, quiet_jax_startup

    quiet_jax_startup()  # before JAX: without the CUDA plugin's / libtpu's start-up lines in the tests' logs
    fewer_gc_passes()
    import jax

    cache = os.environ.get("FLAXZOO_JAX_CACHE")
    if cache:
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    main(sys.argv[1], json.loads(sys.argv[2]))
