"""The multi-process tests' side of each process (tests/test_multihost.py), run as ``python -m multihost_helper``
(``PYTHONPATH=tests``), usually by ``python -m flaxzoo.train.launch --module multihost_helper``.

  meshes ARGS_JSON   {"data_dir", "root", "out", "runs": [{"name", "kind", "mesh", "interleave", "extra"}]}: train
                     each run with ``flaxzoo.train.pretrain.Trainer`` in ``root/name``; the devices in ``jax.devices()`` order,
                     or with ``interleave`` ordered device-major across processes (p0d0, p1d0, p0d1, p1d1), so the
                     mesh's axes do not follow process boundaries. Every process writes ``out.p<i>.json``: the
                     rows it loaded per run, and every file it opened for writing (a Python audit hook).
  train ARGS...      ``python -m flaxzoo.train ARGS...``, with test hooks from the environment:
                     FLAXZOO_TEST_STEP_DELAY=S    sleep S seconds after each logged step (so signals land mid-run);
                     FLAXZOO_TEST_UNREADABLE=P:STEP:TIMES[,...]  on process P, reading checkpoint STEP raises
                                                  OSError the first TIMES times (0 = always);
                     FLAXZOO_TEST_PID_DIR=DIR     write this process's pid to DIR/p<i>;
                     FLAXZOO_TEST_READS=FILE      FILE.p<i>: the elements of each stored tensor this process read
                                                  while loading init_from (JSON).
  shared TEMPLATE    ``flaxzoo.train.multihost.check_shared`` on one folder, then on a folder of each process's own.
  sleeper CODE       no JAX: print the process id, wait for SIGTERM / SIGINT (print it, exit 0) or exit CODE
                     after 0.5 s when CODE is not 0 and this is process 1 (the launcher's own tests).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def record_writes() -> list[str]:
    """Every path this process opens for writing from now on (Python-level opens: ``open``, ``os.open``)."""
    written: list[str] = []

    def hook(event, args):
        if event != "open" or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path, mode, flags = (list(args) + [None, None])[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & WRITE_FLAGS)
        if writing:
            written.append(os.path.abspath(os.fsdecode(path)))

    sys.addaudithook(hook)
    return written


def meshes(args: dict) -> None:
    written = record_writes()
    import jax

    from flaxzoo.train import multihost
    from flaxzoo.train.pretrain import Trainer
    from train_helper import make_config

    multihost.initialize()
    index = jax.process_index()
    report: dict = {"process": index, "runs": {}}
    for run in args["runs"]:
        mesh = run["mesh"]
        cfg = make_config(run["kind"], args["data_dir"], **{"mesh.data": mesh[0], "mesh.fsdp": mesh[1],
                                                            "mesh.tensor": mesh[2]}, **run.get("extra", {}))
        devices = jax.devices()
        if run.get("interleave"):
            devices = sorted(devices, key=lambda d: (devices.index(d) % jax.local_device_count(), d.process_index))
        trainer = Trainer(cfg, pathlib.Path(args["root"]) / run["name"], devices=devices)
        trainer.run()
        report["runs"][run["name"]] = {"rows": trainer.placement.rows.tolist()}
    report["written"] = sorted(set(written))
    pathlib.Path(f"{args['out']}.p{index}.json").write_text(json.dumps(report))


def _install_faults() -> None:
    import jax

    from flaxzoo.train.checkpoint import Checkpointer

    faults = {}
    for item in os.environ.get("FLAXZOO_TEST_UNREADABLE", "").split(","):
        if item:
            process, step, times = (int(x) for x in item.split(":"))
            if process == jax.process_index():
                faults[step] = times
    if faults:
        original = Checkpointer._read_state
        calls: dict[int, int] = {}

        def read_state(self, step, target):
            calls[step] = calls.get(step, 0) + 1
            if step in faults and (faults[step] == 0 or calls[step] <= faults[step]):
                raise OSError(f"injected read error: checkpoint {step} on process {jax.process_index()}, "
                              f"read {calls[step]}")
            return original(self, step, target)

        Checkpointer._read_state = read_state
    reads_file = os.environ.get("FLAXZOO_TEST_READS")
    if reads_file:  # count the elements this process reads of each stored tensor (load_sharded's on_read hook)
        from flaxzoo.models.io import sharded

        load, counts = sharded.load_sharded, {}

        def counted(*args, **kwargs):
            def on_read(read):
                counts[read.tensor] = counts.get(read.tensor, 0) + read.elements
            try:
                return load(*args, on_read=on_read, **kwargs)
            finally:
                pathlib.Path(f"{reads_file}.p{jax.process_index()}").write_text(json.dumps(counts))

        sharded.load_sharded = counted
    delay = float(os.environ.get("FLAXZOO_TEST_STEP_DELAY", "0") or 0)
    if delay:
        from flaxzoo.train import pretrain

        write = pretrain.MetricsWriter.write

        def slow_write(self, row):
            write(self, row)
            time.sleep(delay)

        pretrain.MetricsWriter.write = slow_write


def train(argv: list[str]) -> int:
    from flaxzoo.train import multihost

    multihost.initialize()  # before the hooks touch jax (train.__main__ then finds it done)
    import jax

    pid_dir = os.environ.get("FLAXZOO_TEST_PID_DIR")
    if pid_dir:
        pathlib.Path(pid_dir).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(pid_dir) / f"p{jax.process_index()}").write_text(str(os.getpid()))
    _install_faults()
    from flaxzoo.train.__main__ import main

    multihost.initialize = lambda: True  # already done above
    return main(["train", *argv])


def sleeper(code: int) -> int:
    index = os.environ.get("JAX_PROCESS_ID")
    got: list[str] = []
    signal.signal(signal.SIGTERM, lambda s, f: got.append("SIGTERM"))
    signal.signal(signal.SIGINT, lambda s, f: got.append("SIGINT"))
    print(f"process {index} of {os.environ.get('JAX_NUM_PROCESSES')} at {os.environ.get('JAX_COORDINATOR_ADDRESS')}, "
          f"{os.environ.get('JAX_NUM_CPU_DEVICES')} devices", flush=True)
    print(f"stderr line of process {index}", file=sys.stderr, flush=True)
    start = time.monotonic()
    while not got and time.monotonic() - start < 60:
        if code and index == "1" and time.monotonic() - start > 0.5:
            return code
        time.sleep(0.05)
    print(f"process {index} got {got[0] if got else 'nothing'}", flush=True)
    return 0


def shared(template: str) -> int:
    """``check_shared`` on ``template.format(0)`` (one folder for both processes) and then on
    ``template.format(process index)`` (a folder of each process's own, as two hosts' local disks are): prints
    what each says; exit 3 when the second is refused."""
    from flaxzoo.train import multihost

    multihost.initialize()
    import jax

    print(f"one folder: shared={multihost.check_shared(template.format(0), 'the one folder')}", flush=True)
    print(f"own folders, not required: shared="
          f"{multihost.check_shared(template.format(jax.process_index()), 'own folder', required=False)}", flush=True)
    try:
        multihost.check_shared(template.format(jax.process_index()), "own folder")
    except multihost.StorageNotShared as exc:
        print(f"refused: {exc}", flush=True)
        return 3
    return 0


if __name__ == "__main__":
    from flaxzoo.models.jax_startup import fewer_gc_passes, quiet_jax_startup

    quiet_jax_startup()  # before JAX: without the CUDA plugin's / libtpu's start-up lines in the tests' logs
    fewer_gc_passes()
    command = sys.argv[1]
    if command == "meshes":
        meshes(json.loads(sys.argv[2]))
    elif command == "train":
        sys.exit(train(sys.argv[2:]))
    elif command == "shared":
        sys.exit(shared(sys.argv[2]))
    elif command == "sleeper":
        sys.exit(sleeper(int(sys.argv[2])))
    else:
        sys.exit(f"unknown command {command!r}")
