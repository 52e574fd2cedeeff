"""Several processes as one job, on loopback only (127.0.0.1): ``python -m flaxzoo.train.launch``, 2 processes x 2 CPU devices
over Gloo. Meshes whose axes do and do not follow the processes give the one-device losses; checkpoints cross
process counts; SIGTERM to one process stops both after the same step; a killed process is reported by the other;
a checkpoint unreadable on one process is judged the same way by all; LoRA from pretrained weights (a tiny base,
the packaged SmolLM2-135M GGUF) gives the one-process losses. Marked ``multiprocess``."""

import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from train_helper import as_flags, overrides, tiny_base  # noqa: E402
from train_helper import helper_process_env as env  # noqa: E402

pytestmark = pytest.mark.multiprocess

REPO = pathlib.Path(__file__).resolve().parent.parent
STEPS = 8  # GPT runs: 8 steps, checkpoints at 4 and 8
BERT_STEPS = 5
GPT = {"steps": STEPS, "checkpoint_every": 4, "sample.max_new_tokens": 0}
BERT = {"steps": BERT_STEPS, "checkpoint_every": 0, "sample.max_new_tokens": 0}


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.getbasetemp() / "train_data")


def launch(*args, timeout=400, **extra_env):
    """``python -m flaxzoo.train.launch --processes 2 --devices-per-process 2 ARGS``; the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "flaxzoo.train.launch", "--processes", "2", "--devices-per-process", "2",
                           *args], cwd=REPO, env=env(**extra_env), capture_output=True, text=True, timeout=timeout)


def train_command(workdir, data_dir, kind="gpt", **extra):
    return [*as_flags(kind, overrides(kind, data_dir, **{**GPT, **extra})), "--workdir", str(workdir)]


def losses(workdir):
    rows = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows}


def checkpoint_steps(workdir):
    return sorted(int(p.name) for p in (pathlib.Path(workdir) / "checkpoints").iterdir() if p.name.isdigit())


def keep_only_step(source, destination, step):
    """A copy of the work directory ``source`` holding only checkpoint ``step`` (as if the run had stopped there)."""
    shutil.copytree(source, destination)
    for other in checkpoint_steps(destination):
        if other != step:
            shutil.rmtree(pathlib.Path(destination) / "checkpoints" / str(other))


def runs_of(kind_meshes):
    runs = []
    for kind, mesh, interleave in kind_meshes:
        name = f"{kind}{''.join(map(str, mesh))}{'i' if interleave else ''}"
        extra = dict(GPT if kind == "gpt" else BERT)
        if kind == "bert" and mesh == (1, 2, 2):  # a sample at the end too: mask filling over both processes
            extra["sample.max_new_tokens"] = 8
        runs.append({"name": name, "kind": kind, "mesh": list(mesh), "interleave": interleave, "extra": extra})
    return runs


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir):
    """One process, one device: the tiny GPT (8 steps, checkpoints at 4 and 8) and the tiny BERT (5 steps)."""
    root = tmp_path_factory.mktemp("one_device")
    args = {"data_dir": data_dir, "root": str(root), "out": str(root / "report"),
            "runs": runs_of([("gpt", (1, 1, 1), False), ("bert", (1, 1, 1), False)])}
    proc = subprocess.run([sys.executable, "-m", "multihost_helper", "meshes", json.dumps(args)], cwd=REPO,
                          env=env(JAX_NUM_CPU_DEVICES="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return {"gpt": root / "gpt111", "bert": root / "bert111"}


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """2 processes x 2 devices, a fresh data directory (process 0 prepares it): GPT on (4,1,1) (data across the
    processes), on (4,1,1) with the devices interleaved across the processes (p0d0, p1d0, p0d1, p1d1: each process
    holds two blocks of rows that are not neighbours) and on (1,2,2) interleaved (tensor spans the processes); BERT on
    (1,2,2) (FSDP across the processes). Four runs, not every mesh for both models: each run is a compile per
    process, and tests/test_train_parallel.py checks four 8-device meshes of both models in one process."""
    root = tmp_path_factory.mktemp("two_processes")
    data = root / "data"
    plan = [("gpt", (4, 1, 1), False), ("gpt", (1, 2, 2), True), ("gpt", (4, 1, 1), True), ("bert", (1, 2, 2), False)]
    args = {"data_dir": str(data), "root": str(root / "runs"), "out": str(root / "report"), "runs": runs_of(plan)}
    start = time.perf_counter()
    proc = launch("--module", "multihost_helper", "--", "meshes", json.dumps(args), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    reports = [json.loads((root / f"report.p{i}.json").read_text()) for i in range(2)]
    return {"root": root / "runs", "data": data, "reports": reports, "stdout": proc.stdout,
            "seconds": time.perf_counter() - start}


def test_every_mesh_over_two_processes_gives_the_one_device_losses(reference, two_processes):
    for run in two_processes["reports"][0]["runs"]:
        kind = "gpt" if run.startswith("gpt") else "bert"
        expected, got = losses(reference[kind]), losses(two_processes["root"] / run)
        assert sorted(got) == list(range(1, (STEPS if kind == "gpt" else BERT_STEPS) + 1)), run
        assert max(abs(got[s] - expected[s]) for s in got) < 1e-5, (run, got, expected)
    out = two_processes["stdout"]
    assert "devices: 4 x cpu (2 process(es)); mesh data=1 x fsdp=2 x tensor=2" in out
    assert f"[p0] sample at step {BERT_STEPS}: 'masked positions as [predicted|original]" in out


def test_each_process_loads_the_rows_its_devices_hold(two_processes):
    """Batch rows follow the batch sharding, not the process index: 8 rows over the mesh's data x fsdp devices."""
    rows = [report["runs"] for report in two_processes["reports"]]
    assert [r["gpt411"]["rows"] for r in rows] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # contiguous blocks
    assert [r["bert122"]["rows"] for r in rows] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # fsdp over processes
    # devices p0d0, p1d0, p0d1, p1d1 along data: each process holds two blocks that are not neighbours
    assert [r["gpt411i"]["rows"] for r in rows] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    # tensor spans the processes: each process holds both fsdp blocks, i.e. every row
    assert [r["gpt122i"]["rows"] for r in rows] == [list(range(8))] * 2


def test_one_process_writes_logs_tokenizer_and_data(two_processes):
    """Process 1 opens no file for writing but its own orbax shard metadata and the data directory's locks; the
    files process 0 writes (metrics, TensorBoard, tokenizer, the prepared data) exist once."""
    written = [report["written"] for report in two_processes["reports"]]
    allowed = [p for p in written[1] if p.endswith("/.flaxzoo.lock") or "/array_metadatas/process_1" in p]
    assert sorted(written[1]) == sorted(allowed), written[1]
    zero = "\n".join(written[0])
    for part in ("gpt411/metrics.jsonl", "gpt411/.tokenizer-", "gpt411/tensorboard/", "flaxzoo_packed/",
                 "tokenizers/"):
        assert part in zero, part


def test_checkpoints_cross_process_counts(reference, two_processes, data_dir, tmp_path):
    """Step 4 of the 2-process run resumed by one process of 4 devices, and step 4 of the one-device run resumed by
    2 processes: the uninterrupted runs' losses within 1e-5. Not bit for bit even at 4 devices both ways: Gloo's
    all-reduce sums the devices' partial losses and gradients in another order than XLA's in-process all-reduce
    (measured: 1 float32 ulp, 4.8e-7, on the first resumed step's loss). With the same processes the resumed run is
    bit-identical (the SIGTERM and unreadable-checkpoint tests)."""
    two = two_processes["root"] / "gpt411"
    keep_only_step(two, tmp_path / "a", 4)
    proc = subprocess.run([sys.executable, "-m", "flaxzoo.train", *train_command(tmp_path / "a", data_dir, **{
        "mesh.data": 4})], cwd=REPO, env=env(JAX_NUM_CPU_DEVICES="4"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "resumed from checkpoint at step 4" in proc.stdout
    uninterrupted, got = losses(two), losses(tmp_path / "a")
    assert max(abs(got[s] - uninterrupted[s]) for s in range(5, STEPS + 1)) < 1e-5

    keep_only_step(reference["gpt"], tmp_path / "b", 4)
    proc = launch("--", *train_command(tmp_path / "b", data_dir, **{"mesh.data": 4}))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "[p1] process 1: resumed from checkpoint at step 4" in proc.stdout
    one_device, got = losses(reference["gpt"]), losses(tmp_path / "b")
    assert max(abs(got[s] - one_device[s]) for s in range(5, STEPS + 1)) < 1e-5


def test_sigterm_to_one_process_stops_both_after_the_same_step(two_processes, data_dir, tmp_path):
    workdir, pids = tmp_path / "w", tmp_path / "pids"
    rng = random.Random()
    target, at_step = rng.choice([0, 1]), rng.randint(2, 4)  # 0.6 s steps: 4+ steps (2.4 s) left to agree
    with open(tmp_path / "stderr", "w") as err_file:
        proc = subprocess.Popen([sys.executable, "-m", "flaxzoo.train.launch", "--processes", "2", "--devices-per-process",
                                 "2", "--module", "multihost_helper", "--", "train",
                                 *train_command(workdir, data_dir, checkpoint_every=0, **{"mesh.data": 4})],
                                cwd=REPO, env=env(FLAXZOO_TEST_STEP_DELAY="0.6", FLAXZOO_TEST_PID_DIR=str(pids)),
                                stdout=subprocess.PIPE, stderr=err_file, text=True)
        lines = []
        try:
            for line in proc.stdout:
                lines.append(line)
                if line.startswith(f"[p0] step {at_step}/"):
                    os.kill(int((pids / f"p{target}").read_text()), signal.SIGTERM)
                    break
            out, _ = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()  # the children die with the launcher (PR_SET_PDEATHSIG)
    err = (tmp_path / "stderr").read_text()
    out = "".join(lines) + out
    assert proc.returncode == 75, (target, at_step, out[-3000:], err[-5000:])  # exit_codes.PREEMPTED, passed on
    assert "[launch] stopped: every process saved its checkpoint" in err, err[-3000:]
    stopped = {}
    for line in out.splitlines():
        for i in range(2):
            prefix = f"[p{i}] process {i}: SIGTERM received: stopped after step "
            if line.startswith(prefix):
                stopped[i] = int(line[len(prefix):].split(",")[0])
    assert len(stopped) == 2 and stopped[0] == stopped[1], (target, at_step, stopped, out[-3000:])
    step = stopped[0]
    assert at_step <= step < STEPS and checkpoint_steps(workdir) == [step]
    # the restart (2 processes again) continues with the uninterrupted run's losses
    proc = launch("--", *train_command(workdir, data_dir, checkpoint_every=0, **{"mesh.data": 4}))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    uninterrupted, got = losses(two_processes["root"] / "gpt411"), losses(workdir)
    assert [got[s] for s in range(1, STEPS + 1)] == [uninterrupted[s] for s in range(1, STEPS + 1)]


def test_a_killed_process_is_reported_by_the_other_within_a_minute(data_dir, tmp_path):
    """SIGKILL to process 1: process 0 (blocked in a collective with it) is ended by the runtime once process 1's
    heartbeats stop, with a message naming it. Run with a 10 s heartbeat timeout to keep the test short; with the
    default (30 s) the survivor ended 16.7 s after the kill (2-core AMD EPYC)."""
    from flaxzoo.train.launch import free_port

    port = free_port()
    command = [sys.executable, "-m", "multihost_helper", "train",
               *train_command(tmp_path / "w", data_dir, steps=40, checkpoint_every=0, **{"mesh.data": 4})]
    errors = [open(tmp_path / f"stderr{i}", "w") for i in range(2)]
    procs = [subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL,
                              stderr=errors[i], text=True, env=env(
        JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i),
        JAX_NUM_CPU_DEVICES="2", FLAXZOO_TEST_STEP_DELAY="0.2", FLAXZOO_HEARTBEAT_TIMEOUT_S="10")) for i in range(2)]
    try:
        for line in procs[0].stdout:
            if line.startswith("step 3/"):
                break
        procs[1].kill()
        killed = time.monotonic()
        procs[0].communicate(timeout=120)
        elapsed = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for f in errors:
            f.close()
    err = (tmp_path / "stderr0").read_text()
    assert procs[0].returncode != 0
    assert elapsed < 60, elapsed
    assert "The following tasks are unhealthy (stopped sending heartbeats):\n1\n" in err, err[-3000:]
    print(f"survivor exited {procs[0].returncode} {elapsed:.1f} s after the kill")


def test_a_checkpoint_unreadable_on_one_process_is_judged_alike_everywhere(two_processes, data_dir, tmp_path):
    """Process 1 cannot read step 8 at all and fails its first read of step 4 (a transient error): both processes
    set step 8 aside (process 0 moves it, once) and resume from step 4 after process 1's retry."""
    workdir = tmp_path / "w"
    shutil.copytree(two_processes["root"] / "gpt411", workdir)
    proc = launch("--module", "multihost_helper", "--", "train", *train_command(workdir, data_dir, **{
        "mesh.data": 4}), FLAXZOO_TEST_UNREADABLE="1:8:0,1:4:1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for i in range(2):
        assert f"[p{i}] process {i}: checkpoint at step 8 is damaged" in proc.stdout
        assert f"[p{i}] process {i}: resumed from checkpoint at step 4" in proc.stdout
    assert "unreadable on process(es) [1]" in proc.stdout
    assert "reading checkpoint 4 failed (OSError: injected read error" in proc.stderr
    assert "attempt 2 of 3" in proc.stderr
    assert sorted(p.name for p in (workdir / "damaged_checkpoints").iterdir()) == ["8"]
    assert checkpoint_steps(workdir) == [4, 8]  # 8 written afresh by the resumed run
    uninterrupted, got = losses(two_processes["root"] / "gpt411"), losses(workdir)
    assert [got[s] for s in range(5, STEPS + 1)] == [uninterrupted[s] for s in range(5, STEPS + 1)]


def test_launcher_prefixes_lines_forwards_signals_and_returns_the_first_failure(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "flaxzoo.train.launch", "--processes", "2", "--devices-per-process", "3",
                             "--module", "multihost_helper", "--", "sleeper", "0"], cwd=REPO, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if len(seen) == 2:
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    out = "".join(seen) + out
    assert proc.returncode == 0, (out, err)
    for i in range(2):
        assert f"[p{i}] process {i} of 2 at 127.0.0.1:" in out and ", 3 devices" in out
        assert f"[p{i}] process {i} got SIGTERM" in out
        assert f"[p{i}] stderr line of process {i}" in err
    # process 1 exits 3 at once; process 0 waits for a signal: killed after the grace period, exit code 3
    proc = subprocess.run([sys.executable, "-m", "flaxzoo.train.launch", "--processes", "2", "--grace-s", "1", "--module",
                           "multihost_helper", "--", "sleeper", "3"], cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "[launch] process 1 ended first with exit code 3" in proc.stderr
    assert "[launch] process 0 still running 1 s later: killed" in proc.stderr
    bad = subprocess.run([sys.executable, "-m", "flaxzoo.train.launch", "--processes", "0"], cwd=REPO, env=env(),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--processes=0: expected at least 1" in bad.stderr


def test_storage_that_is_not_shared_is_told_plainly_on_every_process(tmp_path):
    """Each process's own folder stands for each host's own disk: the marker process 0 writes is not seen by
    process 1, and both processes say so, naming the folder and process 1."""
    template = str(tmp_path / "disk{}")
    proc = launch("--devices-per-process", "1", "--module", "multihost_helper", "--", "shared", template, timeout=120)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    for i in range(2):
        assert f"[p{i}] one folder: shared=True" in proc.stdout
        assert f"[p{i}] own folders, not required: shared=False" in proc.stdout
        assert f"[p{i}] refused: own folder {template.format(i)} is not shared storage: process(es) [1]" in proc.stdout
    assert not list(tmp_path.glob("disk*/.flaxzoo_shared_*"))  # the markers are removed


def test_lora_from_pretrained_weights_over_two_processes_reads_halves_and_equals_one_process(data_dir, tmp_path):
    """``init_from`` with several processes (pre-training's LoRA on a tiny Llama base, FSDP over the 4 devices of 2
    processes): each process reads only the half of every stored matrix its devices hold (the weights are loaded
    shard by shard), and the losses equal 1 process x 4 devices."""
    from safetensors import safe_open

    base = tiny_base(tmp_path / "base", data_dir)
    values = overrides("lora", data_dir, init_from=str(base), steps=4, checkpoint_every=0, log_every=1,
                       **{"mesh.data": 1, "mesh.fsdp": 4})
    one = subprocess.run([sys.executable, "-m", "multihost_helper", "train", *as_flags("lora", values), "--workdir",
                          str(tmp_path / "one")], cwd=REPO, env=env(JAX_NUM_CPU_DEVICES="4"), capture_output=True,
                         text=True, timeout=300)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    two = launch("--module", "multihost_helper", "--", "train", *as_flags("lora", values), "--workdir",
                 str(tmp_path / "two"), FLAXZOO_TEST_READS=str(tmp_path / "reads"))
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-5000:]
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert a.keys() == b.keys() == {1, 2, 3, 4} and max(abs(a[s] - b[s]) for s in a) <= 1e-5, (a, b)
    with safe_open(base / "model.safetensors", "np") as stored:
        shapes = {name: stored.get_slice(name).get_shape() for name in stored.keys()}
    for i in range(2):
        reads = json.loads((tmp_path / f"reads.p{i}").read_text())
        matrices = [n for n, shape in shapes.items() if len(shape) == 2]
        assert len(matrices) >= 7 * 2 and set(reads) == set(shapes)
        for name in matrices:
            rows, cols = shapes[name]
            assert reads[name] == rows * cols // 2, (i, name, reads[name], shapes[name])


def test_lora_on_the_packaged_smollm2_over_two_processes_equals_one_process(data_dir, tmp_path):
    """``configs/lora_smollm2.py`` as shipped: ``init_from`` the packaged SmolLM2-135M-Instruct GGUF (each tensor
    dequantised whole, then laid out over the mesh), FSDP over the 4 devices of 2 processes; the losses equal
    1 process x 4 devices. Two steps of 4 rows of 32 tokens (the smallest batch fsdp=4 takes), no eval, no sample."""
    values = overrides("lora", data_dir, steps=2, seq_len=32, batch_size=4, checkpoint_every=0, log_every=1,
                       eval_every=0, **{"mesh.data": 1, "mesh.fsdp": 4})
    assert "init_from" not in values  # the config's own: the packaged GGUF
    start = time.perf_counter()
    one = subprocess.run([sys.executable, "-m", "multihost_helper", "train", *as_flags("lora", values), "--workdir",
                          str(tmp_path / "one")], cwd=REPO, env=env(JAX_NUM_CPU_DEVICES="4"), capture_output=True,
                         text=True, timeout=400)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    middle = time.perf_counter()
    two = launch("--module", "multihost_helper", "--", "train", *as_flags("lora", values), "--workdir",
                 str(tmp_path / "two"))
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-5000:]
    print(f"1 process: {middle - start:.0f} s, 2 processes: {time.perf_counter() - middle:.0f} s")
    assert "devices: 4 x cpu (2 process(es)); mesh data=1 x fsdp=4 x tensor=1" in two.stdout, two.stdout[-3000:]
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert a.keys() == b.keys() == {1, 2} and max(abs(a[s] - b[s]) for s in a) <= 1e-5, (a, b)
