"""Runs one multi-process JAX job on this machine: N processes of experiments/run.py over a
coordinator on 127.0.0.1, each with its own CPU devices, as N hosts of a pod would run it.

  .venv/bin/python experiments/launch_local.py --processes 2 --devices 2 -- \\
      --config configs/tiny_cpu.py --workdir runs/tiny_cpu_2proc [--config.x=y ...]

What a cluster does for every host, done here for N local processes: the JAX_* variables that
t1jax/distributed.py reads, and XLA's host device count. Each process's output lines are
prefixed with [p<i>]. The first process to fail ends the job: the others are killed (a
SIGKILLed host must not leave the rest waiting on a collective), and its exit code is returned.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SLURM_PORTS = 65535 - 2**12 + 1  # JAX's SLURM detection: port = this + SLURM_JOB_ID % 4096


def slurm_job_id() -> int:
    """A SLURM_JOB_ID whose coordinator port (JAX derives it from the id) is free here."""
    for _ in range(100):
        port = free_port_in(SLURM_PORTS, 65535)
        if port is not None:
            return 4096 * 1000 + port - SLURM_PORTS
    raise RuntimeError(f"no free port in {SLURM_PORTS}..65535 for a SLURM coordinator")


def free_port_in(low: int, high: int) -> int | None:
    import random
    port = random.randint(low, high)
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return None
    return port


def process_env(i: int, n: int, devices: int, port: int, base=None,
                cluster: str = "jax") -> dict:
    """Process i's environment: cluster "jax" sets t1jax's JAX_* variables; "slurm" sets what
    `srun` sets on a node (the job run with T1JAX_DISTRIBUTED=auto, JAX's own detection; the
    SLURM_JOB_ID is `port`), as one node of 127.0.0.1."""
    env = dict(os.environ if base is None else base)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env.update(JAX_PLATFORMS="cpu",
               XLA_FLAGS=" ".join(flags + [f"--xla_force_host_platform_device_count={devices}"]))
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        env.pop(name, None)
    if cluster == "slurm":
        env.update(T1JAX_DISTRIBUTED="auto", SLURM_JOB_ID=str(port),
                   SLURM_STEP_NODELIST="127.0.0.1", SLURM_STEP_NUM_NODES="1",
                   SLURM_NTASKS=str(n), SLURM_PROCID=str(i), SLURM_LOCALID=str(i))
    elif cluster == "jax":
        env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(n),
                   JAX_PROCESS_ID=str(i))
    else:
        raise ValueError(f"cluster must be jax or slurm, got {cluster!r}")
    return env


def _relay(proc: subprocess.Popen, prefix: str) -> None:
    for line in proc.stdout:
        sys.stdout.write(f"{prefix} {line}")
        sys.stdout.flush()


def launch(run_args: list[str], processes: int, devices: int, *, script=None,
           poll_s: float = 0.2, env_of: dict | None = None,
           timeout_s: float | None = None, cluster: str = "jax") -> int:
    """Starts the processes, relays their output, and returns 0 when all exit 0, else the
    first failure's exit code (the others killed). env_of: {process: {name: value}} set for
    that process only (the chaos tests preempt one host with T1JAX_KILL_AT). timeout_s: past
    it, every process prints its threads' stacks (SIGUSR1: experiments/run.py registers
    faulthandler for it), then all are killed and 124 is returned: a hung job says where.
    cluster: "jax" (t1jax's JAX_* variables) or "slurm" (what srun sets; process_env)."""
    script = script or str(ROOT / "experiments" / "run.py")
    port = slurm_job_id() if cluster == "slurm" else free_port()
    procs = [subprocess.Popen([sys.executable, script, *run_args],
                              env={**process_env(i, processes, devices, port,
                                                 cluster=cluster),
                                   **(env_of or {}).get(i, {})},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
             for i in range(processes)]
    relays = [threading.Thread(target=_relay, args=(p, f"[p{i}]"), daemon=True)
              for i, p in enumerate(procs)]
    for t in relays:
        t.start()
    start = time.monotonic()
    try:
        while True:
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                print(f"[launch] still running after {timeout_s:.0f} s: each process's stacks "
                      "follow, then all are killed", file=sys.stderr, flush=True)
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGUSR1)
                time.sleep(3)
                _kill(procs)
                return 124
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i, code = failed[0]
                print(f"[launch] process {i} exited with {code}: stopping the others",
                      file=sys.stderr, flush=True)
                _kill(procs)
                return code if code > 0 else 128 - code
            if all(c == 0 for c in codes):
                return 0
            time.sleep(poll_s)
    except KeyboardInterrupt:
        _kill(procs)
        return 130
    finally:
        for t in relays:
            t.join(timeout=5)


def _kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=2, help="CPU devices per process")
    parser.add_argument("--cluster", choices=("jax", "slurm"), default="jax",
                        help="jax: JAX_COORDINATOR_ADDRESS/NUM_PROCESSES/PROCESS_ID; slurm: "
                        "the variables srun sets, joined by JAX's own detection")
    parser.add_argument("run_args", nargs=argparse.REMAINDER,
                        help="after --: the arguments of experiments/run.py")
    args = parser.parse_args()
    run_args = args.run_args[1:] if args.run_args[:1] == ["--"] else args.run_args
    if args.processes < 1 or args.devices < 1:
        parser.error("--processes and --devices must be >= 1")
    if not run_args:
        parser.error("give experiments/run.py's arguments after --")
    return launch(run_args, args.processes, args.devices, cluster=args.cluster)


if __name__ == "__main__":
    sys.exit(main())
