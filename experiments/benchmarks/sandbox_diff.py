"""The verifier's tamper check: a sandbox's changes read from its overlay layers
(t1jax/sandbox/overlay.py) against the daemon's `docker diff` (the baseline, same run, same
containers). Prints wall time and machine-wide CPU per call, their ratio, and whether the two
lists agree.

  .venv/bin/python experiments/benchmarks/sandbox_diff.py [--n 20]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path


from t1jax.sandbox import overlay  # noqa: E402
from t1jax.sandbox.docker import DockerSandbox  # noqa: E402
from t1jax.sandbox.docker_backend import DockerBackend  # noqa: E402
from t1jax.tasks.pool import default_pool_dir, load_pool  # noqa: E402

AGENT_WORK = ("mkdir -p /app/out && for i in $(seq 20); do echo $i > /app/out/$i.txt; done; "
              "echo x >> /etc/hosts.allow; rm -rf /usr/share/doc/bash")


def busy_seconds() -> float:
    """CPU time of the whole machine (the daemon's work included), in core-seconds."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def measure(fn, n: int) -> tuple[float, float, object]:
    c0, t0 = busy_seconds(), time.perf_counter()
    for _ in range(n):
        out = fn()
    return (time.perf_counter() - t0) / n, (busy_seconds() - c0) / n, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20, help="calls per method")
    args = parser.parse_args()
    backend = DockerBackend()
    task = next(t for t in load_pool(default_pool_dir()).tasks if t.task_id == "count-log-errors")
    image = backend.build(task)
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}, Docker {backend.client.version()['Version']}; image "
          f"{image} ({backend.client.images.get(image).attrs['Size'] / 2**20:.0f} MiB)")
    with DockerSandbox(image, client=backend.client, run_id="bench-diff") as sb:
        assert sb.exec(AGENT_WORK).exit_code == 0
        if not sb._lowerdirs:
            sys.exit("the daemon's overlay layers are not readable here (run as root beside a "
                     "local overlay2 daemon): sandboxes fall back to `docker diff`")
        kinds = {0: "C", 1: "A", 2: "D"}
        daemon = lambda: sorted(((kinds[c["Kind"]], c["Path"]) for c in sb.container.diff()),  # noqa: E731
                                key=lambda c: c[1])
        layers = lambda: overlay.changes(sb._upperdir, sb._lowerdirs)  # noqa: E731
        measure(daemon, 1), measure(layers, 1)  # warm both
        d_wall, d_cpu, d_out = measure(daemon, args.n)
        l_wall, l_cpu, l_out = measure(layers, args.n)
    print(f"{'method':<24} {'wall ms':>8} {'CPU ms':>8} {'vs docker diff':>15}")
    print(f"{'docker diff (daemon)':<24} {d_wall * 1e3:8.1f} {d_cpu * 1e3:8.1f} {'1.00x':>15}")
    print(f"{'overlay layers (ours)':<24} {l_wall * 1e3:8.1f} {l_cpu * 1e3:8.1f} "
          f"{d_wall / l_wall:14.1f}x")
    print(f"{len(d_out)} changes; the lists agree: {d_out == l_out}")


if __name__ == "__main__":
    main()
