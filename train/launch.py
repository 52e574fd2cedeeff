"""``python -m flaxzoo.train.launch --processes N [--devices-per-process K] [--platform cpu|gpu|auto] -- <train args>``

Starts N processes of ``python -m flaxzoo.train <train args>`` on this machine as one multi-process JAX job, as a cluster
would start one per host: each gets ``JAX_COORDINATOR_ADDRESS`` (127.0.0.1 and a free port: loopback only),
``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``, so ``jax.distributed.initialize`` connects them (``flaxzoo.train.multihost``).

- ``--platform cpu`` (default): ``JAX_PLATFORMS=cpu`` and ``JAX_NUM_CPU_DEVICES=K`` (default 1) in each process;
  their collectives run over Gloo. ``gpu``: process ``i`` gets local GPUs ``i*K .. i*K+K-1``
  (``JAX_LOCAL_DEVICE_IDS``; K is required with N > 1, else every process would claim every GPU; without it one
  process sees them all). ``auto``: nothing is forced.
- The processes die with the launcher (Linux: ``PR_SET_PDEATHSIG``), even when it is killed outright.
- Every line a process writes is printed with its id in front (``[p1] step 4/5 ...``; stderr to stderr).
- SIGINT / SIGTERM to the launcher go to every process (the training loop agrees on a step to stop after, saves one
  checkpoint and exits 75, ``flaxzoo.train.exit_codes.PREEMPTED``; the launcher exits 75 too).
- The launcher exits with the first non-zero exit code (a process killed by signal S counts as 128 + S), after
  giving the others ``--grace-s`` seconds (default 120: longer than the runtime's heartbeat timeout, so the survivors
  report the lost process themselves) to end; then they are killed. 0 when every process exits 0.
- ``--module`` runs another module than ``flaxzoo.train`` the same way (``flaxzoo.train.data`` to prepare data, a test harness).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from flaxzoo.train import exit_codes

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_environment(index: int, args: argparse.Namespace, port: int) -> dict[str, str]:
    """The environment of process ``index``: this one's, minus other launchers' variables, plus the ``JAX_*`` ones."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_", "JAX_COORDINATOR", "JAX_NUM_PROCESSES",
                                "JAX_PROCESS_ID", "JAX_LOCAL_DEVICE_IDS"))
           and k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TPU_WORKER_HOSTNAMES", "FLAXZOO_DISTRIBUTED")}
    env.update({"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": str(args.processes),
                "JAX_PROCESS_ID": str(index), "PYTHONUNBUFFERED": "1"})
    if args.platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        env["JAX_NUM_CPU_DEVICES"] = str(args.devices_per_process or 1)
    elif args.platform == "gpu" and args.devices_per_process:
        k = args.devices_per_process
        env["JAX_LOCAL_DEVICE_IDS"] = ",".join(str(d) for d in range(index * k, (index + 1) * k))
    return env


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the launcher dies (Linux; elsewhere nothing)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _pump(stream, prefix: str, out) -> None:
    for line in iter(stream.readline, ""):
        out.write(prefix + line)
        out.flush()
    stream.close()


def exit_code(returncode: int) -> int:
    """A child's return code as a shell would report it (killed by signal S: 128 + S)."""
    return 128 - returncode if returncode < 0 else returncode


def describe(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def parse(argv: list[str]) -> argparse.Namespace:
    if "--" in argv:
        split = argv.index("--")
        own, rest = argv[:split], argv[split + 1:]
    else:
        own, rest = argv, []
    parser = argparse.ArgumentParser(prog="python -m flaxzoo.train.launch", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, required=True, help="how many processes (N >= 1)")
    parser.add_argument("--devices-per-process", type=int, default=None, help="devices per process (K >= 1)")
    parser.add_argument("--platform", choices=("cpu", "gpu", "auto"), default="cpu")
    parser.add_argument("--module", default="flaxzoo.train", help="the module each process runs (default: flaxzoo.train)")
    parser.add_argument("--port", type=int, default=None, help="the coordinator's port on 127.0.0.1 (default: free)")
    parser.add_argument("--grace-s", type=float, default=120.0,
                        help="seconds the others get to end after one process fails (default 120)")
    args = parser.parse_args(own)
    if args.processes < 1:
        parser.error(f"--processes={args.processes}: expected at least 1")
    if args.devices_per_process is not None and args.devices_per_process < 1:
        parser.error(f"--devices-per-process={args.devices_per_process}: expected at least 1")
    if args.grace_s < 0:
        parser.error(f"--grace-s={args.grace_s}: expected seconds >= 0")
    if args.platform == "gpu" and args.processes > 1 and args.devices_per_process is None:
        parser.error(f"--platform gpu with --processes={args.processes} needs --devices-per-process (the GPUs each "
                     "process takes), else every process would claim every GPU")
    args.rest = rest
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(list(sys.argv[1:] if argv is None else argv))
    port = args.port or free_port()
    command = [sys.executable, "-m", args.module, *args.rest]
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []

    def forward(signum, frame) -> None:
        del frame
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in _SIGNALS}  # before the first child starts
    for i in range(args.processes):
        proc = subprocess.Popen(command, env=process_environment(i, args, port), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, bufsize=1, start_new_session=True,
                                preexec_fn=_die_with_parent)
        procs.append(proc)
    for i, proc in enumerate(procs):
        for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
            thread = threading.Thread(target=_pump, args=(stream, f"[p{i}] ", out), daemon=True)
            thread.start()
            pumps.append(thread)
    first: tuple[int, int] | None = None  # (process, return code) of the first failure
    deadline = None
    try:
        while any(p.poll() is None for p in procs):
            for i, proc in enumerate(procs):
                code = proc.poll()
                if code not in (None, 0) and first is None:
                    first = (i, code)
                    deadline = time.monotonic() + args.grace_s
                    print(f"[launch] process {i} ended first with {describe(code)}; waiting up to {args.grace_s:.0f} "
                          "s for the others", file=sys.stderr, flush=True)
            if deadline is not None and time.monotonic() > deadline:
                for i, proc in enumerate(procs):
                    if proc.poll() is None:
                        print(f"[launch] process {i} still running {args.grace_s:.0f} s later: killed",
                              file=sys.stderr, flush=True)
                        proc.kill()
                break
            time.sleep(0.1)
        for proc in procs:
            proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for thread in pumps:
        thread.join(timeout=5)
    if first is None:
        failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
        first = failed[0] if failed else None
    if first is None:
        return 0
    if all(p.returncode == exit_codes.PREEMPTED for p in procs):
        print(f"[launch] stopped: every process saved its checkpoint and exited {exit_codes.PREEMPTED} (preempted); "
              "run the same command again to resume", file=sys.stderr, flush=True)
        return exit_codes.PREEMPTED
    summary = ", ".join(f"process {i}: {describe(p.returncode)}" for i, p in enumerate(procs))
    print(f"[launch] failed ({summary})", file=sys.stderr, flush=True)
    return exit_code(first[1])


if __name__ == "__main__":
    sys.exit(main())
