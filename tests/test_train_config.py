"""Training config checks (train/config.py), sharding rules (train/sharding.py), optimizer pieces (train/optim.py),
FLOP accounting (train/flops.py): all in-process, no training."""

import dataclasses
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from flaxzoo.models import get_preset, param_count
from flaxzoo.train import flops, optim, sharding
from flaxzoo.train.config import ConfigError, MeshConfig, OptimConfig, TrainConfig, execution_defaults
from flaxzoo.train.config_sections import LOSS_CHUNK_BYTES, auto_loss_chunk

REPO = pathlib.Path(__file__).resolve().parent.parent
ALL_CONFIGS = sorted(p.stem for p in (REPO / "configs").glob("*.py") if not p.stem.startswith("_"))
FINETUNE_CONFIGS = ("finetune_cls", "finetune_ner", "finetune_qa",  # task "classify" / "tag" / "qa": train/finetune
                    "headlines_from_scratch", "seq2seq_reverse", "seq2seq_preset",  # and "seq2seq"
                    "span_corruption")
CONFIGS = [name for name in ALL_CONFIGS if name not in FINETUNE_CONFIGS]


def resolve(config, devices, **kw):
    return TrainConfig.from_config_dict(config, devices, **kw)


def load_config(name):
    spec = importlib.util.spec_from_file_location(f"cfg_{name}", REPO / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


# ---------------------------------------------------------------------------------------------------------- configs
def test_required_configs_exist():
    assert {"default", "bert_tiny", "gpt2_small", "gpt2_medium", "bert_base", "llama_small"} <= set(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("devices", [1, 8])
def test_every_config_resolves(name, devices):
    config = load_config(name)
    if config.batch_size % devices:
        pytest.skip("batch does not split over this many devices")
    cfg = TrainConfig.from_config_dict(config, devices)
    assert np.prod(cfg.mesh.shape) == devices
    assert cfg.data.vocab_size <= cfg.model.vocab_size
    assert cfg.objective == cfg.data.objective == ("causal" if cfg.model.causal else "mlm")
    assert json.loads(json.dumps(cfg.to_json_dict()))["steps"] == config.steps  # a checkpoint's meta keeps it


@pytest.mark.parametrize("name", FINETUNE_CONFIGS)
def test_every_finetune_config_resolves(name):
    from flaxzoo.train.finetune.config import FinetuneConfig

    config = load_config(name)
    if config.task in ("tag", "qa") or config.data.source == "files" and not config.data.train_path:
        # CoNLL / SQuAD / JSONL files are the user's: the config names none
        with pytest.raises(ConfigError, match="^data.train_path: ''"):
            FinetuneConfig.from_config_dict(config, 1)
        config.data.train_path, config.data.test_path = "train.txt", "test.txt"
    cfg = FinetuneConfig.from_config_dict(config, 1)
    assert cfg.task == config.task and cfg.mesh.shape == (1, 1, 1)


def test_named_configs_have_the_advertised_sizes():
    # GPT-2 small is 124,439,808; pad_vocab_to=128 adds 47 zero rows to the tied token table.
    assert param_count(resolve(load_config("gpt2_small"), 1).model) == 124_439_808 + (50_304 - 50_257) * 768
    assert resolve(load_config("gpt2_medium"), 1).model.num_layers == 24
    bert = resolve(load_config("bert_base"), 1)
    assert bert.model.hidden_size == 768 and bert.model_cls.__name__ == "BertForMaskedLM"
    llama = resolve(load_config("llama_small"), 1).model
    assert llama.norm == "rmsnorm" and llama.mlp_gated and llama.num_kv_heads == 3


def test_model_fields_override_the_preset_and_references_follow():
    config = load_config("default")
    config.seq_len = 64
    config.model.num_layers = 3
    resolved = resolve(config, 1)
    assert resolved.model.num_layers == 3 and resolved.model.max_position_embeddings == 64
    assert resolved.model.hidden_size == config.model.hidden_size
    config.precision.remat, config.precision.scan_layers = "full", True
    assert resolve(config, 1).model.remat == "full" and resolve(config, 1).model.scan_layers


@pytest.mark.parametrize("change, key", [
    ({"mesh.data": 3}, "mesh"),                           # 3 x 1 x 1 != 8 devices
    ({"mesh.data": 3, "mesh.fsdp": -1}, "mesh.fsdp"),     # -1 cannot fill 8 / 3
    ({"mesh.data": -1, "mesh.fsdp": -1}, "mesh.fsdp"),
    ({"mesh.tensor": 0}, "mesh.tensor"),
    ({"mesh.data": 4, "mesh.fsdp": 2, "batch_size": 12}, "batch_size"),
    ({"model.preset": "gpt-17"}, "model.preset"),
    ({"model.cls": "GPTForEverything"}, "model.cls"),
    ({"steps": -5}, "steps"),
    ({"steps": 0}, "steps"),
    ({"optim.lr": -1.0}, "optim.lr"),
    ({"optim.schedule": "exp"}, "optim.schedule"),
    ({"optim.accum_steps": 3}, "optim.accum_steps"),
    ({"optim.accum_steps": 4}, "optim.accum_steps"),      # 16 / 4 = 4 rows do not split over 8 devices
    ({"precision.remat": "some"}, "precision.remat"),
    ({"precision.compute_dtype": "int8"}, "precision.compute_dtype"),
    ({"model.num_heads": 5}, "model.num_heads"),           # 128 not divisible by 5 (TransformerConfig's field)
    ({"model.num_kv_heads": 3}, "model.num_kv_heads"),     # 3 does not divide 4 heads
    ({"model.dropout": 1.5}, "model.dropout"),
    ({"seq_len": 4096}, "seq_len"),
    ({"data.vocab_size": 60000}, "data.vocab_size"),
    ({"data.objective": "mlm"}, "data.objective"),
    ({"data.source": "s3://x"}, "data.source"),
    ({"data.mask_prob": 1.5}, "data.mask_prob"),           # DataConfig's own check, mapped to its field
    ({"data.prefetch": 0}, "data.prefetch"),
    ({"data.vocab_size": 10}, "data.vocab_size"),          # too small for a BPE alphabet
    ({"seq_len": 4}, "seq_len"),                           # DataConfig: at least 8 tokens per example
    ({"optim.b2": 1.0}, "optim.b2"),
    ({"optim.layer_decay": 0.0}, "optim.layer_decay"),
    ({"optim.warmup_steps": -1}, "optim.warmup_steps"),
    ({"precision.scan_layers": 1}, "precision.scan_layers"),
    ({"precision.param_dtype": "int4"}, "precision.param_dtype"),
    ({"precision.loss_chunk": -1}, "precision.loss_chunk"),
    ({"sample.max_new_tokens": -1}, "sample.max_new_tokens"),
    ({"sample.temperature": -0.5}, "sample.temperature"),
    ({"sample.top_k": -2}, "sample.top_k"),
    ({"eval_every": -1}, "eval_every"),
    ({"keep_checkpoints": 0}, "keep_checkpoints"),
    ({"profile_steps": "5"}, "profile_steps"),
    ({"profile_steps": "4:2"}, "profile_steps"),
    ({"profile_steps": "0:3"}, "profile_steps"),
])
def test_bad_values_name_their_key(change, key):
    # default.py ties data.vocab_size to model.vocab_size (one FieldReference); gpt2_small sets them apart.
    config = load_config("gpt2_small" if "data.vocab_size" in change else "default")
    for dotted, value in change.items():
        node = config
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node[part]
        if dotted == "seq_len":
            config.model.max_position_embeddings = 128  # break the reference: a fixed table
        node[leaf] = value
    with pytest.raises(ConfigError) as info:
        resolve(config, 8)
    assert info.value.key == key, str(info.value)
    assert str(info.value).startswith(key + ": ")
    if key in change:  # the message shows the value
        value = change[key]
        assert repr(value) in str(info.value) or f"={value}" in str(info.value), str(info.value)


@pytest.mark.parametrize("section, key", [("", "stepz"), ("optim", "learning_rate"), ("mesh", "pipeline"),
                                          ("precision", "auto"), ("model", "num_layer"), ("data", "path"),
                                          ("sample", "top_p")])
def test_an_unknown_key_is_named(section, key):
    config = load_config("default")
    node = config[section] if section else config
    node[key] = 3
    with pytest.raises(ConfigError) as info:
        resolve(config, 1)
    dotted = f"{section}.{key}" if section else key
    assert info.value.key == dotted and "unknown key (value 3)" in str(info.value), str(info.value)


def test_a_typed_config_reads_without_casts():
    config = load_config("default")
    config.optim.lr = 1  # an int where a float is expected: widened once
    config.profile_steps = "2:5"
    cfg = resolve(config, 1)
    assert isinstance(cfg.optim, OptimConfig) and type(cfg.optim.lr) is float and cfg.optim.lr == 1.0
    assert cfg.profile_steps == (2, 5) and cfg.mesh.shape == (1, 1, 1) and cfg.tokens_per_step == 16 * 128
    assert (cfg.data.seq_len, cfg.data.batch_size, cfg.data.seed) == (cfg.seq_len, cfg.batch_size, cfg.seed)
    assert cfg.model_cls.__name__ == "GPTForCausalLM" and cfg.to_json_dict()["model_cls"] == "GPTForCausalLM"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.steps = 3
    with pytest.raises(ConfigError, match=r"^optim\.lr: -1\.0: expected a number in \(0, inf\]$"):
        OptimConfig(lr=-1.0)  # a section checks itself at construction, outside any ConfigDict too


def test_execution_defaults_per_backend_and_depth():
    assert execution_defaults("cpu", 4) == ("dots", True) and execution_defaults("cpu", 30) == ("dots", True)
    assert execution_defaults("cpu", 2) == execution_defaults("cpu", 3) == ("none", False)
    assert execution_defaults("gpu", 2) == execution_defaults("tpu", 24) == ("none", True)


@pytest.mark.parametrize("layers, remat, scan", [(2, "none", False), (3, "none", False), (4, "dots", True)])
def test_auto_precision_on_cpu_follows_the_depth(layers, remat, scan):
    config = load_config("default")
    assert config.precision.remat == "auto" and config.precision.scan_layers == "auto"  # base_config's default
    config.model.num_layers = layers
    cfg = resolve(config, 1, backend="cpu")
    assert (cfg.precision.remat, cfg.precision.scan_layers) == (remat, scan)
    assert (cfg.model.remat, cfg.model.scan_layers, cfg.model.dtype) == (remat, scan, "float32")
    assert set(cfg.precision.auto) == {"compute_dtype", "remat", "scan_layers", "loss_chunk"}
    assert cfg.precision.describe("remat") == f"{remat} (auto)"
    # Resolved again (a resumed run on the same backend): the same layout, so the checkpoint's parameters fit.
    assert resolve(config, 1, backend="cpu").model == cfg.model
    gpu = resolve(config, 1, backend="gpu")
    assert (gpu.model.remat, gpu.model.scan_layers, gpu.model.dtype) == ("none", True, "bfloat16")


def test_explicit_precision_values_win_over_auto():
    config = load_config("default")  # 4 layers: auto would be dots + scan on CPU
    config.precision.remat, config.precision.scan_layers = "full", False
    cfg = resolve(config, 1, backend="cpu")
    assert (cfg.model.remat, cfg.model.scan_layers) == ("full", False)
    assert cfg.precision.auto == ("compute_dtype", "loss_chunk")
    assert cfg.precision.describe("scan_layers") == "False"


@pytest.mark.parametrize("seed", [0, 1])
def test_auto_loss_chunk_is_the_largest_power_of_two_within_the_budget(seed):
    """Checked by its definition on random shapes: one piece when all float32 logits fit the budget, else a power of
    two of positions whose logits fit and whose double does not (1 when even one position is over it)."""
    rng = np.random.default_rng(seed)
    budget = LOSS_CHUNK_BYTES
    for _ in range(200):
        rows, positions, vocab = (int(rng.integers(1, 65)), int(rng.integers(1, 8193)),
                                  int(rng.choice([1000, 32000, 50304, 128256, 151936, 262144, 1 << 26])))
        chunk = auto_loss_chunk(rows, positions, vocab)
        logits = lambda n: 4 * rows * n * vocab  # noqa: E731
        if chunk == 0:
            assert logits(positions) <= budget
            continue
        assert logits(positions) > budget and chunk & (chunk - 1) == 0
        assert logits(chunk) <= budget < logits(2 * chunk) or (chunk == 1 and logits(1) > budget)


def test_auto_loss_chunk_follows_the_rows_per_device_and_an_explicit_value_wins(monkeypatch):
    gpt2 = load_config("gpt2_small")  # 64 rows of 1024, 50,304 logits (padded vocabulary), data over every device
    assert gpt2.precision.loss_chunk == "auto"
    on8 = resolve(gpt2, 8, backend="tpu")  # 8 rows per device: 1.5 GiB of float32 logits at once
    assert on8.precision.loss_chunk == 128 and "loss_chunk" in on8.precision.auto
    assert on8.loss_shape() == (8, 1024, 50304)
    assert resolve(gpt2, 64, backend="tpu").precision.loss_chunk == 0  # 1 row per device: 196 MiB, one piece
    llama = load_config("llama3_2_1b")  # 32 rows of 2048, 128,256 logits, FSDP over every device
    assert resolve(llama, 4, backend="tpu").precision.loss_chunk == 64
    assert resolve(llama, 8, backend="tpu").precision.loss_chunk == 128
    llama.mesh.fsdp, llama.mesh.tensor = 4, 2  # the vocabulary split over tensor: half the logits per device
    assert resolve(llama, 8, backend="tpu").precision.loss_chunk == 128
    # A CPU run of the default config: its logits fit, one piece (the main job's loss is computed as before).
    assert resolve(load_config("default"), 1, backend="cpu").precision.loss_chunk == 0
    config = parse_command_line(monkeypatch, "--config.precision.loss_chunk=64")
    cfg = resolve(config, 1, backend="cpu")
    assert cfg.precision.loss_chunk == 64 and "loss_chunk" not in cfg.precision.auto
    config = parse_command_line(monkeypatch, "--config.precision.loss_chunk=many")
    with pytest.raises(ConfigError, match=r"^precision\.loss_chunk: 'many': expected an integer >= 0 or 'auto'"):
        resolve(config, 1)


def parse_command_line(monkeypatch, *overrides):
    """The ConfigDict ``python -m flaxzoo.train`` builds from ``configs/default.py`` and ``overrides`` (as __main__ does)."""
    from absl import flags
    from ml_collections import config_flags

    argv = ["prog", *overrides]
    monkeypatch.setattr(sys, "argv", argv)  # config_flags reads the overrides from sys.argv
    values = flags.FlagValues()
    flag = config_flags.DEFINE_config_file("config", str(REPO / "configs" / "default.py"), flag_values=values,
                                           lock_config=True)
    values(argv)
    return flag.value


def test_command_line_overrides_parse_into_the_typed_config(monkeypatch):
    """``--config.precision.scan_layers=false`` (a key that also takes "auto") and a number reach the typed config."""
    config = parse_command_line(monkeypatch, "--config.precision.scan_layers=false", "--config.precision.remat=dots",
                                "--config.optim.lr=0.01", "--config.model.num_layers=6")
    cfg = resolve(config, 1, backend="cpu")
    assert (cfg.model.scan_layers, cfg.model.remat, cfg.optim.lr, cfg.model.num_layers) == (False, "dots", 0.01, 6)
    config = parse_command_line(monkeypatch, "--config.precision.scan_layers=auto", "--config.model.num_layers=2")
    assert resolve(config, 1, backend="cpu").model.scan_layers is False
    config = parse_command_line(monkeypatch, "--config.precision.scan_layers=yes")
    with pytest.raises(ConfigError, match=r"^precision\.scan_layers: 'yes': expected true or false or 'auto'$"):
        resolve(config, 1)


def test_mesh_fill():
    config = load_config("default")
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, -1, 2
    assert MeshConfig.resolve(config.mesh.to_dict(), 8).shape == (2, 2, 2)
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = -1, 1, 1
    assert MeshConfig.resolve(config.mesh.to_dict(), 8).shape == (8, 1, 1)
    assert MeshConfig.resolve(config.mesh.to_dict(), 8).batch_axes == 8


def test_cli_bad_config_stops_fast_with_the_key(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flaxzoo.train", "--config.steps=-3", "--workdir", str(tmp_path / "w")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "steps" in proc.stderr and "-3" in proc.stderr
    assert not (tmp_path / "w").exists()  # nothing was started
    assert "compiled" not in proc.stdout
    unknown = subprocess.run([sys.executable, "-m", "flaxzoo.train", "--config", "no_such_config"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2 and "no_such_config" in unknown.stderr and "default" in unknown.stderr
    assert time.perf_counter() - start < 60


@pytest.mark.parametrize("flag, expected", [
    ("--config.stpes=10", "config error: --config.stpes: the config has no key 'stpes'; did you mean 'steps'?"),
    ("--config.optim.lrr=0.1", "config error: --config.optim.lrr: config.optim has no key 'lrr'; did you mean "
                               "'optim.lr'?"),
    ("--config.data.max_len=64", "config error: --config.data.max_len: config.data has no key 'max_len'; expected "
                                 "one of ['data_dir',"),
])
def test_cli_mistyped_key_is_one_line_with_exit_2(tmp_path, flag, expected):
    """A key the config lacks: one line on stderr naming the flag and the closest key (or the keys there), exit 2,
    no traceback."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "flaxzoo.train", flag, "--workdir", str(tmp_path / "w")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    ours = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(ours) == 1 and ours[0].startswith(expected), proc.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("flag, expected", [
    ("--config.optimizer.lr=1e-3", "--config.optimizer.lr: the config has no key 'optimizer'; did you mean "
                                   "'optim.lr'?"),
    ("--config.optimizer.nope=1", "--config.optimizer.nope: the config has no key 'optimizer'; did you mean 'optim'?"),
    ("--config.dat.shufle=1", "--config.dat.shufle: the config has no key 'dat'; did you mean 'data.shuffle'?"),
    ("--config.model.num_layer=2", "--config.model.num_layer: config.model has no key 'num_layer'; did you mean "
                                   "'model.num_layers'?"),
    ("--config.lr=1e-3", "--config.lr: the config has no key 'lr'; did you mean 'optim.lr'?"),
])
def test_mistyped_nested_key_suggests_the_nearest_path(tmp_path, capsys, monkeypatch, flag, expected):
    """In process (the flags are read before anything starts): an unknown section or leaf names the closest path."""
    from flaxzoo.train.__main__ import main

    argv = ["flaxzoo.train", flag, "--workdir", str(tmp_path / "w")]
    monkeypatch.setattr(sys, "argv", argv)  # ml_collections reads the overrides from sys.argv
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == f"config error: {expected}"
    assert not (tmp_path / "w").exists()


# --------------------------------------------------------------------------------------------------------- sharding
def abstract_mesh(shape):
    return jax.sharding.AbstractMesh(tuple(shape), sharding.MESH_AXES)


def test_parameters_a_mesh_axis_cannot_split_are_reported():
    """GPT-2's vocabulary (50,257 = 29 · 1,733) splits over no axis: the report names the parameter and the axes."""
    mesh = abstract_mesh((1, 4, 2))
    specs = {"tokens": P("vocab", "embed"), "query": P("embed", "heads", "head_dim"), "norm": P("norm")}
    shapes = {"tokens": jax.ShapeDtypeStruct((50257, 768), jnp.float32),
              "query": jax.ShapeDtypeStruct((768, 12, 64), jnp.float32),
              "norm": jax.ShapeDtypeStruct((768,), jnp.float32)}
    unsplit: list[str] = []
    shardings = sharding.param_shardings(specs, shapes, mesh, unsplit)
    assert shardings["tokens"].spec == P(None, None) and shardings["query"].spec == P("fsdp", "tensor", None)
    assert unsplit == ["tokens (50257, 768): dimension 50257 (vocab) not split over fsdp=4; dimension 50257 (vocab) "
                       "not split over tensor=2"]


def test_logical_rules():
    mesh = abstract_mesh((2, 2, 2))
    assert sharding.logical_to_mesh(("vocab", "embed"), (1000, 64), mesh) == P(("tensor", "fsdp"), None)
    assert sharding.logical_to_mesh(("embed", "heads", "head_dim"), (64, 4, 16), mesh) == P("fsdp", "tensor", None)
    assert sharding.logical_to_mesh(("embed", "mlp"), (64, 256), mesh) == P("fsdp", "tensor")
    assert sharding.logical_to_mesh(("norm",), (64,), mesh) == P(None)
    # A dimension an axis does not divide stays whole on it.
    assert sharding.logical_to_mesh(("embed", "kv_heads", "head_dim"), (64, 1, 16), mesh) == P("fsdp", None, None)
    assert sharding.logical_to_mesh(("vocab", "embed"), (1001, 64), mesh) == P(None, None)
    assert sharding.logical_to_mesh(("vocab", "embed"), (1002, 64), mesh) == P("tensor", None)
    # Axes of size 1 are left out.
    assert sharding.logical_to_mesh(("embed", "mlp"), (64, 256), abstract_mesh((8, 1, 1))) == P(None, None)


def test_optimizer_state_follows_parameter_shardings():
    mesh = jax.make_mesh((1, 1, 1), sharding.MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3,
                         devices=jax.devices()[:1])
    params = {"a": {"kernel": jnp.zeros((4, 8))}, "b": jnp.zeros((3,))}
    special = jax.sharding.NamedSharding(mesh, P("fsdp", "tensor"))
    shardings = {"a": {"kernel": special}, "b": sharding.replicated(mesh)}
    state = optax.adamw(1e-3).init(params)
    out = sharding.tree_shardings_like(state, params, shardings, mesh)
    adam = out[0]
    assert adam.mu["a"]["kernel"] == special and adam.nu["a"]["kernel"] == special
    assert adam.count == sharding.replicated(mesh)


def test_multi_process_detection(monkeypatch):
    from flaxzoo.train import multihost

    for name in [*multihost.EXPLICIT_VARIABLES, "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID",
                 "SLURM_LOCALID", "OMPI_COMM_WORLD_SIZE", "OMPI_MCA_orte_hnp_uri", "PMI_SIZE", "PMIX_SIZE",
                 "WORLD_SIZE", "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS", "FLAXZOO_DISTRIBUTED"]:
        monkeypatch.delenv(name, raising=False)
    assert multihost.launch_kind() is None
    assert multihost.initialize() is False  # one process: nothing to start
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert multihost.launch_kind() is None
    monkeypatch.setenv("SLURM_NTASKS", "16")  # sbatch's allocation without an srun job step
    with pytest.raises(multihost.LaunchError, match=r"SLURM_NTASKS=16 but .*SLURM_STEP_NODELIST.* start the "
                                                    r"processes with srun"):
        multihost.launch_kind()
    for name, value in (("SLURM_JOB_ID", "7"), ("SLURM_STEP_NODELIST", "n[1-4]"), ("SLURM_PROCID", "3"),
                        ("SLURM_LOCALID", "0")):
        monkeypatch.setenv(name, value)
    assert multihost.launch_kind() == "slurm"
    monkeypatch.setenv("FLAXZOO_DISTRIBUTED", "0")
    assert multihost.launch_kind() is None
    monkeypatch.delenv("SLURM_NTASKS")
    monkeypatch.delenv("FLAXZOO_DISTRIBUTED")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "t1k-0,t1k-1")
    assert multihost.launch_kind() == "tpu"
    monkeypatch.delenv("TPU_WORKER_HOSTNAMES")
    # MPICH / Intel MPI and torchrun-style launchers: jax.distributed cannot detect them, so they are refused
    monkeypatch.setenv("PMI_SIZE", "4")
    with pytest.raises(multihost.LaunchError, match=r"PMI_SIZE=4 .*MPICH.* set JAX_COORDINATOR_ADDRESS, "
                                                    r"JAX_NUM_PROCESSES, JAX_PROCESS_ID .*PMI_RANK"):
        multihost.launch_kind()
    # ... unless the explicit variables are all set, which always win
    for name, value in zip(multihost.EXPLICIT_VARIABLES, ("10.0.0.1:1234", "4", "2")):
        monkeypatch.setenv(name, value)
    assert multihost.launch_kind() == "explicit"
    monkeypatch.delenv("PMI_SIZE")
    monkeypatch.delenv("JAX_PROCESS_ID")
    with pytest.raises(multihost.LaunchError, match="JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES set but "
                                                    "JAX_PROCESS_ID not"):
        multihost.launch_kind()
    for name in multihost.EXPLICIT_VARIABLES[:2]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(multihost.LaunchError, match="OMPI_COMM_WORLD_SIZE=2 but OMPI_MCA_orte_hnp_uri"):
        multihost.launch_kind()
    monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "1531576320.0;tcp://10.96.0.1:34911")
    assert multihost.launch_kind() == "openmpi"
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE")
    monkeypatch.setenv("WORLD_SIZE", "8")
    with pytest.raises(multihost.LaunchError, match="WORLD_SIZE=8 .*torchrun"):
        multihost.launch_kind()
    monkeypatch.setenv("FLAXZOO_HEARTBEAT_TIMEOUT_S", "soon")
    monkeypatch.setenv("FLAXZOO_DISTRIBUTED", "1")
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(multihost.LaunchError, match="FLAXZOO_HEARTBEAT_TIMEOUT_S='soon': expected a whole number"):
        multihost.initialize()


# -------------------------------------------------------------------------------------------------------- optimizer
def gpt_params(scan_layers: bool = False):
    from flax import nnx

    from flaxzoo.models import abstract_model

    return nnx.to_pure_dict(nnx.state(abstract_model(get_preset("gpt2-tiny", scan_layers=scan_layers)), nnx.Param))


def test_weight_decay_mask_skips_biases_norms_and_embeddings():
    params = gpt_params()
    mask = optim.decay_mask(params, decay_embeddings=False)
    layer = mask["backbone"]["layers"][0]
    assert layer["attention"]["query"]["kernel"] and layer["mlp"]["up"]["kernel"]
    assert not layer["attention"]["query"]["bias"] and not layer["attention_norm"]["scale"]
    embeddings = mask["backbone"]["embeddings"]
    assert not embeddings["tokens"]["embedding"] and not embeddings["positions"]["embedding"]
    with_embeddings = optim.decay_mask(params, decay_embeddings=True)["backbone"]["embeddings"]
    assert with_embeddings["tokens"]["embedding"]


def test_layer_wise_lr_scales():
    params = gpt_params()
    scales = optim.layer_scales(params, num_layers=2, layer_decay=0.5)
    decoder = scales["backbone"]
    assert float(decoder["embeddings"]["tokens"]["embedding"]) == 0.125  # 0.5 ** 3
    assert float(decoder["layers"][0]["mlp"]["up"]["kernel"]) == 0.25
    assert float(decoder["layers"][1]["mlp"]["up"]["kernel"]) == 0.5
    assert float(decoder["final_norm"]["scale"]) == 1.0


def test_stacked_layers_get_the_per_layer_decay_mask_and_lr_scales():
    """With scan_layers the blocks' parameters are [num_layers, ...]: a stacked bias (2-D) is still a bias, and each
    layer's slice gets that layer's learning-rate scale."""
    layers = optim.decay_mask(gpt_params(scan_layers=True), decay_embeddings=False)["backbone"]["layers"]
    assert layers["attention"]["query"]["kernel"] and not layers["attention"]["query"]["bias"]
    assert not layers["mlp"]["up"]["bias"] and not layers["attention_norm"]["scale"]
    scales = optim.layer_scales(gpt_params(scan_layers=True), num_layers=2, layer_decay=0.5)
    up = np.asarray(scales["backbone"]["layers"]["mlp"]["up"]["kernel"])
    assert up.shape == (2, 1, 1) and up.ravel().tolist() == [0.25, 0.5]
    assert float(scales["backbone"]["embeddings"]["tokens"]["embedding"]) == 0.125


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_schedule_warms_up_then_decays(schedule):
    cfg = OptimConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.1, schedule=schedule)
    fn = optim.make_schedule(cfg, 110)
    assert float(fn(0)) == 0.0 and abs(float(fn(5)) - 0.5) < 1e-6 and abs(float(fn(10)) - 1.0) < 1e-6
    end = float(fn(110))
    assert abs(end - (1.0 if schedule == "constant" else 0.1)) < 1e-6
    if schedule == "cosine":
        assert abs(float(fn(60)) - 0.55) < 1e-6  # halfway: (1 + 0.1) / 2


def test_adamw_chain_matches_optax_adamw():
    """With clipping off, no layer decay and decay on every matrix, the chain is optax.adamw."""
    cfg = OptimConfig(lr=1e-2, warmup_steps=0, min_lr_ratio=1.0, schedule="constant", b1=0.9, b2=0.95, eps=1e-8,
                      weight_decay=0.1, decay_embeddings=True, grad_clip=0.0, layer_decay=1.0)
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.full(3, -0.25)}
    tx, _ = optim.make_optimizer(cfg, 100, params, num_layers=1)
    reference = optax.adamw(1e-2, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1,
                            mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))
    ours, _ = tx.update(grads, tx.init(params), params)
    theirs, _ = reference.update(grads, reference.init(params), params)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_clipping_bounds_the_update_norm():
    cfg = OptimConfig(lr=1.0, warmup_steps=0, min_lr_ratio=1.0, schedule="constant", b1=0.0, b2=0.0, eps=0.0,
                      weight_decay=0.0, decay_embeddings=False, grad_clip=1.0, layer_decay=1.0)
    params = {"w": jnp.zeros((2, 2))}
    tx, _ = optim.make_optimizer(cfg, 10, params, num_layers=1)
    clip_state = tx.init(params)
    clipped = optax.clip_by_global_norm(1.0).update({"w": jnp.full((2, 2), 10.0)}, clip_state[0])[0]
    assert abs(float(jnp.sqrt(jnp.sum(clipped['w'] ** 2))) - 1.0) < 1e-5


# -------------------------------------------------------------------------------------------------------- precision
def test_precision_rules_are_one_set_for_every_task():
    """float16 compute and low-precision parameters are refused by pre-training and fine-tuning alike, with the same
    reason; bfloat16 compute keeps float32 master weights and float32 Adam moments, and its step is finite."""
    from flaxzoo.train.finetune.config import FinetuneConfig
    from flaxzoo.train.precision import training_precision_error
    from flaxzoo.train.program import pretraining_program
    from flaxzoo.train import sharding

    for change, key in (({"compute_dtype": "float16"}, "precision.compute_dtype"),
                        ({"param_dtype": "bfloat16"}, "precision.param_dtype"),
                        ({"param_dtype": "float16"}, "precision.param_dtype")):
        config = load_config("default")
        for field, value in change.items():
            config.precision[field] = value
        with pytest.raises(ConfigError) as info:
            resolve(config, 1)
        assert info.value.key == key
        expected = training_precision_error(config.precision.compute_dtype, config.precision.param_dtype)[1]
        assert str(info.value) == f"{key}: {expected}"
    finetune = load_config("finetune_cls")
    finetune.precision.compute_dtype = "float16"  # the same key as pre-training's
    with pytest.raises(ConfigError) as info:
        FinetuneConfig.from_config_dict(finetune)
    assert str(info.value) == "precision.compute_dtype: " + training_precision_error("float16")[1]
    assert "loss scaling" in str(info.value)

    config = load_config("default")
    for key, value in {"model.num_layers": 2, "model.hidden_size": 64, "model.num_heads": 2,
                       "model.intermediate_size": 128, "batch_size": 4, "seq_len": 32, "steps": 2}.items():
        node, leaf = (config[key.split(".")[0]], key.split(".")[1]) if "." in key else (config, key)
        node[leaf] = value
    config.precision.compute_dtype = "bfloat16"
    cfg = resolve(config, 1)
    program = pretraining_program(cfg, sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    state, rest = program.init()
    floats = [x for x in jax.tree.leaves({"params": state["params"], "opt_state": state["opt_state"]})
              if jnp.issubdtype(x.dtype, jnp.floating)]
    assert floats and all(x.dtype == jnp.float32 for x in floats)
    rng = np.random.default_rng(0)
    batch = {k: jnp.asarray(rng.integers(1, 200, shape), jnp.int32)
             for k, shape in datalib_batch_shapes(cfg).items()}
    batch["segment_ids"] = jnp.ones_like(batch["segment_ids"])
    state, metrics = program.train_step(state, rest, batch, jnp.bool_(False))
    assert np.isfinite(float(metrics["loss"])) and np.isfinite(float(metrics["grad_norm"]))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state["params"]))


def datalib_batch_shapes(cfg):
    from flaxzoo.train import data as datalib

    return datalib.batch_shapes(cfg.data, cfg.batch_size)


# ------------------------------------------------------------------------------------------------------------ flops
def test_flops_convention_for_gpt2():
    config = get_preset("gpt2")
    n = param_count(config) - 1024 * 768  # the learned position table is a lookup
    assert flops.matmul_params(config) == n
    assert flops.flops_per_token(config, 1024) == 6 * n + 12 * 12 * 1024 * 768
    # A frozen base (LoRA): its weights cost the forward and the backward to the activations only.
    assert flops.flops_per_token(config, 1024, trained=1000) == 4 * n + 6 * 1000 + 12 * 12 * 1024 * 768


def test_mfu_is_never_above_one_when_the_peak_was_measured_on_a_busy_host():
    """A CPU peak measured while the host was busy (here: set 1000x too low) is measured again when the work outruns
    it; an MFU over 100% is never reported."""
    meter = flops.PeakMeter(jax.devices()[:1], cpu_size=256)
    true_peak = meter.peak
    meter.peak = true_peak / 1000
    work = 1e6  # FLOPs per token
    value = meter.mfu(work, 0.5 * true_peak / work)  # half the real peak: plausible, above the stale one
    assert meter.peak > true_peak / 10 and "again" in meter.source
    assert value is None or 0 < value <= 1
    assert value is None or abs(value - 0.5 * true_peak / meter.peak) < 1e-12
    assert meter.mfu(work, 50 * meter.peak / work) is None and "MFU left out" in meter.untrusted
    assert meter.mfu(work, 0.1 * meter.peak / work) == pytest.approx(0.1)


def test_peak_table():
    class Device:
        def __init__(self, kind):
            self.device_kind = kind

    assert flops.peak_flops(Device("NVIDIA H100 80GB HBM3")) == 989e12
    assert flops.peak_flops(Device("NVIDIA H200")) == 989e12
    assert flops.peak_flops(Device("NVIDIA A100-SXM4-80GB")) == 312e12
    assert flops.peak_flops(Device("TPU v4")) == 275e12
    assert flops.peak_flops(Device("TPU v5 lite")) == 197e12
    assert flops.peak_flops(Device("TPU v5p")) == 459e12
    assert flops.peak_flops(Device("TPU v6 lite")) == 918e12
    assert flops.peak_flops(Device("cpu")) is None
    assert flops.measure_cpu_peak(size=256, repeats=2) > 1e8


def test_the_loop_and_the_bench_measure_the_same_cpu_peak():
    """One peak function and one matmul size for both, named with the figure (their MFUs used to disagree)."""
    from flaxzoo.train.tools import bench

    assert bench.parse_args(["--work", "gpt_train"]).peak_size == flops.CPU_PEAK_SIZE
    peak, source = flops.device_peak(jax.devices()[:1], cpu_size=256)
    assert peak > 1e8 and source == "measured fp32 matmul peak (256^3, best of 5)"


# ------------------------------------------------------------------------------------------- object-store workdirs
def test_an_object_store_work_directory_is_used_as_a_uri(tmp_path, monkeypatch):
    """``gs://`` work directories stay URIs (not ``$PWD/gs:/...``), and the files process 0 writes there
    (metrics.jsonl, rewritten whole as object stores cannot append) go through etils.epath. Run with epath's own
    mock backend mapping gs://bucket to a local folder; orbax's array writes to gs:// (tensorstore's GCS driver)
    need the network and are not run here."""
    from etils.epath import backend, testing as epath_testing

    from flaxzoo.train.checkpoint import is_remote, resolve_workdir
    from flaxzoo.train.pretrain import MetricsWriter

    monkeypatch.chdir(tmp_path)
    assert str(resolve_workdir("gs://bucket/run")) == "gs://bucket/run" and is_remote(resolve_workdir("gs://b/r"))
    assert str(resolve_workdir("runs/a")) == str(tmp_path / "runs" / "a") and not is_remote(resolve_workdir("x"))

    def local(path):
        return os.fspath(path).replace("gs://bucket", str(tmp_path / "bucket"))

    calls = []

    def redirect(name):
        def call(original, path, *args, **kwargs):
            del original
            calls.append((name, os.fspath(path)))
            args = [local(a) if isinstance(a, (str, os.PathLike)) and "gs://" in os.fspath(a) else a for a in args]
            return getattr(backend.os_backend, name)(local(path), *args, **kwargs)
        return call

    names = ("open", "exists", "isdir", "makedirs", "mkdir", "listdir", "glob", "remove", "rename", "replace",
             "rmtree", "stat", "walk", "copy")
    (tmp_path / "bucket" / "run").mkdir(parents=True)
    (tmp_path / "bucket" / "run" / "metrics.jsonl").write_text('{"step": 1, "loss": 3.0}\n{"step": 2, "loss": 9}\n')
    with epath_testing.mock_epath(**{name: redirect(name) for name in names}):
        writer = MetricsWriter(resolve_workdir("gs://bucket/run"), start_step=1)  # resumed at step 1
        writer.write({"step": 2, "loss": 2.5})
        writer.write({"step": 3, "loss": 2.0})
        writer.close()
    rows = [json.loads(line) for line in (tmp_path / "bucket" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5}, {"step": 3, "loss": 2.0}]
    assert ("open", "gs://bucket/run/metrics.jsonl") in calls


def test_tensorboard_events_are_written_without_importing_torch(tmp_path):
    """tensorboardX's writer imports torch (1.5 s) only to take torch tensors: the metrics writer keeps it out of a
    training process, writes the scalars TensorBoard reads, and leaves ``import torch`` working afterwards."""
    script = f"""
import struct, sys
from etils import epath
from flaxzoo.train.hooks import MetricsWriter
writer = MetricsWriter(epath.Path({str(tmp_path)!r}), start_step=0)
writer.write({{"step": 1, "loss": 2.5, "val_loss": 3.0, "note": "text is not a scalar"}})
writer.write({{"step": 2, "loss": 2.0}})
writer.close()
assert "torch" not in sys.modules, "tensorboardX imported torch"
from tensorboardX.proto import event_pb2
(path,) = epath.Path({str(tmp_path)!r}, "tensorboard").glob("events.out.tfevents.*")
data, i, scalars = path.read_bytes(), 0, []
while i < len(data):
    (n,) = struct.unpack("<Q", data[i:i + 8])
    event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
    scalars += [(event.step, v.tag, round(v.simple_value, 4)) for v in event.summary.value]
    i += 12 + n + 4
print(sorted(scalars))
import torch
print(torch.tensor([1.5]).item())
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[-2] == "[(1, 'eval/loss', 3.0), (1, 'train/loss', 2.5), (2, 'train/loss', 2.0)]", proc.stdout
    assert lines[-1] == "1.5"
