"""Training over device meshes, in processes with 8 (or 4, or 1) simulated CPU devices (tests/train_helper.py):
losses and parameters equal to the one-device run, checkpoints that restore on other meshes and device counts."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
HELPER = REPO / "tests" / "train_helper.py"
MESHES = [[8, 1, 1], [2, 4, 1], [2, 2, 2], [1, 1, 8]]
# Each test trains in its own 8-device process, a compile per mesh: the slow tier.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.getbasetemp() / "train_data")


def run_helper(command, devices, timeout=600, **args):
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0"}
    proc = subprocess.run([sys.executable, str(HELPER), command, json.dumps(args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"helper {command} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


@pytest.mark.parametrize("kind", ["gpt", "bert"])
def test_three_steps_on_every_mesh_equal_one_device(kind, data_dir, tmp_path):
    out = tmp_path / "parity.json"
    run_helper("parity", 8, kind=kind, data_dir=data_dir, workdir=str(tmp_path / "w"), meshes=MESHES, steps=3,
               out=str(out))
    report = json.loads(out.read_text())
    assert sorted(report) == sorted("x".join(map(str, m)) for m in MESHES)
    for mesh, result in report.items():
        assert result["max_loss_diff"] < 1e-5, (mesh, result)
        assert result["max_param_diff"] < 1e-5, (mesh, result)
        if kind == "gpt":  # (masked-LM losses are too noisy to fall reliably in 3 steps)
            assert result["losses"][2] < result["losses"][0]
    # The meshes really split the parameters (over fsdp and tensor), not only the batch.
    assert any("fsdp" in spec for spec in report["2x4x1"]["param_specs"])
    assert any("tensor" in spec for spec in report["2x2x2"]["param_specs"])
    assert any("tensor" in spec for spec in report["1x1x8"]["param_specs"])


def test_checkpoint_from_a_2x2x2_mesh_restores_bit_equal_on_one_device_and_on_1x4x1(data_dir, tmp_path):
    workdir = str(tmp_path / "w")
    saved = tmp_path / "saved.npz"
    run_helper("save", 8, kind="gpt", data_dir=data_dir, workdir=workdir, mesh=[2, 2, 2], steps=2, out=str(saved))
    with np.load(saved) as z:
        expected = {k: z[k] for k in z.files}
    assert any(k.startswith("opt_state") for k in expected) and "step" in expected and "rng" in expected
    for devices, mesh in [(1, [1, 1, 1]), (4, [1, 4, 1])]:
        out = tmp_path / f"restored_{devices}.npz"
        run_helper("restore", devices, kind="gpt", data_dir=data_dir, workdir=workdir, mesh=mesh, out=str(out))
        info = json.loads(pathlib.Path(str(out) + ".json").read_text())
        assert info["step"] == 2 and info["devices"] == devices
        with np.load(out) as z:
            restored = {k: z[k] for k in z.files}
        assert restored.keys() == expected.keys()
        for key in expected:
            np.testing.assert_array_equal(restored[key], expected[key], err_msg=key)
        if devices == 4:
            assert any("fsdp" in spec for spec in info["specs"].values())


def test_gradient_accumulation_on_sharded_meshes_equals_one_device(data_dir, tmp_path):
    """Accumulation's running gradient keeps the parameters' shardings (FSDP: each device its slice); the result is
    the one-device run's."""
    out = tmp_path / "accum.json"
    run_helper("parity", 8, kind="gpt", data_dir=data_dir, workdir=str(tmp_path / "w"), meshes=[[2, 4, 1], [1, 8, 1]],
               steps=2, out=str(out), extra={"optim.accum_steps": 2, "batch_size": 16})
    for mesh, result in json.loads(out.read_text()).items():
        assert result["max_loss_diff"] < 1e-5 and result["max_param_diff"] < 1e-5, (mesh, result)
        assert any("fsdp" in spec for spec in result["param_specs"]), mesh


@pytest.fixture(scope="session")
def tiny_base_dir(tmp_path_factory, data_dir) -> str:
    """A tiny pretrained Llama-layout base with its BPE tokenizer (``train_helper.tiny_base``), for LoRA runs."""
    from train_helper import tiny_base

    return str(tiny_base(tmp_path_factory.mktemp("tiny_base"), data_dir))


def test_three_lora_steps_on_sharded_meshes_equal_one_device(data_dir, tiny_base_dir, tmp_path):
    """LoRA (``configs/lora_smollm2.py`` on a tiny base): the adapters' losses and values after 3 steps on (8,1,1),
    (2,4,1) and (2,2,2) equal one device's; the adapters (the whole trained state) are split over fsdp and tensor as
    their base kernels are, and so is the frozen base."""
    out = tmp_path / "lora.json"
    meshes = [[8, 1, 1], [2, 4, 1], [2, 2, 2]]
    run_helper("parity", 8, kind="lora", data_dir=data_dir, workdir=str(tmp_path / "w"), meshes=meshes, steps=3,
               out=str(out), extra={"init_from": tiny_base_dir})
    report = json.loads(out.read_text())
    assert sorted(report) == sorted("x".join(map(str, m)) for m in meshes)
    for mesh, result in report.items():
        assert result["max_loss_diff"] < 1e-5 and result["max_param_diff"] < 1e-5, (mesh, result)
        names = result["param_names"]  # the trained state: adapters only, on every attention and MLP projection
        assert names and all(n.endswith(("kernel_lora_a", "kernel_lora_b")) for n in names), names
        assert len(names) == 2 * 2 * 7  # 2 layers x (query, key, value, out, up, gate, down) x (A, B)
        assert {n for n in result["moved"] if n.endswith("kernel_lora_b")} == \
            {n for n in names if n.endswith("kernel_lora_b")}  # every B left zero
    assert any("fsdp" in spec for spec in report["2x4x1"]["param_specs"])
    assert any("tensor" in spec for spec in report["2x2x2"]["param_specs"])
    assert not any("fsdp" in spec or "tensor" in spec for spec in report["8x1x1"]["param_specs"])
    assert any("fsdp" in spec for spec in report["2x4x1"]["rest_specs"])  # the frozen base: sharded too
    assert any("tensor" in spec for spec in report["2x2x2"]["rest_specs"])
