"""The token table's lookup on a mesh (``models/layers/table_lookup.py``): on 8 simulated CPU devices, every mesh
that splits the table's rows and the batch gives numpy's lookup and numpy's scatter-add gradient, out-of-range ids
included; the ring's plan names the axes each mesh should use."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from flaxzoo.models.layers.partitioning import placed
from flaxzoo.models.layers.table_lookup import ring_plan, sharded_lookup
from flaxzoo.train import sharding

rows, hidden, limit, batch, seq = 96, 12, 90, 8, 5
rng = np.random.default_rng(7)
table = rng.normal(size=(rows, hidden)).astype(np.float32)
ids = rng.integers(0, limit, size=(batch, seq)).astype(np.int32)
ids[0, 0], ids[3, 2], ids[5, 4] = limit, -1, rows + 3  # a padding row, a negative id, one past the table
upstream = rng.normal(size=(batch, seq, hidden)).astype(np.float32)

def loss(t, i, dtype):
    out = sharded_lookup(t, i, dtype, limit)
    return jnp.sum(jnp.where(jnp.isnan(out), 0, out).astype(jnp.float32) * upstream), out

report = {}
for shape in json.loads(sys.argv[1]):
    mesh = sharding.make_mesh(shape)
    with placed(sharding.activation_placement(mesh)):
        plan = ring_plan((rows, hidden), jnp.float32, (batch, seq))
        step = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=2)
        (_, out), grad = step(jnp.asarray(table), jnp.asarray(ids), jnp.float32)
        (_, out16), grad16 = step(jnp.asarray(table), jnp.asarray(ids), jnp.bfloat16)
    report["x".join(map(str, shape))] = dict(
        plan=None if plan is None else [list(plan.row_axes), list(plan.ring_axes), list(plan.sum_axes)],
        out=np.asarray(out).tolist(), grad=np.asarray(grad).tolist(),
        out16=np.asarray(out16, np.float32).tolist(), grad16=np.asarray(grad16).tolist(),
        grad_dtype=str(grad.dtype), grad_spec=str(grad.sharding.spec))
json.dump(dict(table=table.tolist(), ids=ids.tolist(), upstream=upstream.tolist(), limit=limit, report=report),
          sys.stdout)
"""

MESHES = {"1x8x1": (["fsdp"], ["fsdp"], []), "2x4x1": (["fsdp"], ["fsdp"], ["data"]),
          "2x2x2": (["tensor", "fsdp"], ["fsdp"], ["data"]), "1x2x4": (["tensor", "fsdp"], ["fsdp"], []),
          "8x1x1": None}


def test_ring_lookup_and_gradient_equal_numpys_on_every_mesh():
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"}
    shapes = [[int(n) for n in name.split("x")] for name in MESHES]
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(shapes)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    found = json.loads(proc.stdout)
    table, ids, upstream = (np.asarray(found[k], np.float32) for k in ("table", "ids", "upstream"))
    ids = ids.astype(np.int64)
    valid = (ids >= 0) & (ids < found["limit"])
    expected = np.where(valid[..., None], table[np.where(valid, ids, 0)], np.nan)
    expected_grad = np.zeros_like(table)
    np.add.at(expected_grad, ids[valid], upstream[valid])
    assert (~valid).sum() == 3
    for name, plan in MESHES.items():
        result = found["report"][name]
        assert result["plan"] == (None if plan is None else list(plan)), name
        np.testing.assert_array_equal(np.asarray(result["out"], np.float32), expected, err_msg=name)
        np.testing.assert_allclose(result["grad"], expected_grad, rtol=1e-6, atol=1e-6, err_msg=name)
        assert result["grad_dtype"] == "float32"
        # bfloat16 compute: rows rounded once on the way out, the gradient summed in float32
        np.testing.assert_allclose(result["out16"], expected, rtol=2 ** -8, err_msg=name)
        np.testing.assert_allclose(result["grad16"], expected_grad, rtol=2e-2, atol=2e-2, err_msg=name)
        if plan is not None:  # the gradient comes out split like the table's rows
            assert "fsdp" in result["grad_spec"], (name, result["grad_spec"])
