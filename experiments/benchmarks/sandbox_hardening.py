"""What hardening costs: plain runc (Docker's defaults, no limits) vs our hardened runc vs
hardened gVisor (runsc), on the command round trip, a sandbox's start, and a whole episode
(start, 20 commands of a typical task, snapshot, a verifier sandbox from the snapshot, close).
Ratios are against plain runc measured in the same run, on the daemon DOCKER_HOST names.

  .venv/bin/python experiments/benchmarks/sandbox_hardening.py [--n 100] [--episodes 5]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time


from t1jax.sandbox.base import Limits  # noqa: E402
from t1jax.sandbox.docker import DockerSandbox, daemon_facts, docker_client  # noqa: E402
from t1jax.sandbox.images import LOCAL_BASE_IMAGE  # noqa: E402

HARDENING = ("cap_drop", "cap_add", "security_opt", "pids_limit", "mem_limit", "memswap_limit",
             "nano_cpus", "ulimits", "init", "shm_size")
COMMANDS = ("true", "ls -la /usr/bin", "python3 -c pass", "head -c 1000000 /dev/urandom > /app/x")
EPISODE = [  # a small task, the way an agent works through one
    "mkdir -p /app/src && cd /app/src", "printf 'a 1\\nb 2\\nc 3\\n' > data.txt", "cat data.txt",
    "wc -l data.txt", "grep -n b data.txt", "sed -i 's/b/B/' data.txt", "sort -k2 -nr data.txt",
    "printf '#include <stdio.h>\\nint main(){puts(\"hi\");}\\n' > hi.c", "gcc -O0 -o hi hi.c",
    "./hi", "python3 -c 'import json; print(json.dumps({\"n\": 3}))' > out.json", "cat out.json",
    "ls -la", "find /app -type f | head", "tar czf /tmp/src.tgz -C /app src", "ls -la /tmp",
    "python3 -c 'print(sum(range(10**6)))'", "git init -q /app/repo && cd /app/repo && "
    "git -c user.email=a@b -c user.name=a commit -q --allow-empty -m init", "git log --oneline",
    "cd /app && du -sh src",
]


class PlainSandbox(DockerSandbox):
    """Docker's defaults: no dropped capabilities, no limits, no init, no storage cap (network
    still off: this machine's daemon has no bridge)."""

    def create_options(self) -> dict:
        options = super().create_options()
        return {k: v for k, v in options.items() if k not in HARDENING} | {"storage_opt": None}


class NoCpuCapSandbox(DockerSandbox):
    """Hardened, but with no CPU quota: separates the quota's cost from the rest."""

    def create_options(self) -> dict:
        return {k: v for k, v in super().create_options().items() if k != "nano_cpus"}


class NoStorageCapSandbox(DockerSandbox):
    """Hardened, but with no kernel storage cap (btrfs qgroup); the watchdog still runs."""

    def create_options(self) -> dict:
        return super().create_options() | {"storage_opt": None}


ARMS = {"runc plain": (PlainSandbox, None), "runc hardened": (DockerSandbox, "runc"),
        "runc hardened, no CPU quota": (NoCpuCapSandbox, "runc"),
        "runc hardened, no storage cap": (NoStorageCapSandbox, "runc"),
        "runsc hardened": (DockerSandbox, "runsc")}


def make(arm: str, client, image: str = LOCAL_BASE_IMAGE):
    cls, runtime = ARMS[arm]
    return cls(image, limits=Limits(), client=client, run_id="bench-hardening", runtime=runtime)


def round_trips(arm, client, n: int) -> dict[str, float]:
    out = {}
    with make(arm, client) as sb:
        for cmd in COMMANDS:
            sb.exec(cmd)
            times = []
            for _ in range(n):
                t = time.perf_counter()
                result = sb.exec(cmd)
                times.append((time.perf_counter() - t) * 1000)
                assert result.exit_code == 0, (arm, cmd, result.output)
            out[cmd] = statistics.median(times)
    return out


def episode(arm, client) -> tuple[float, float]:
    """(start to first prompt, whole episode) in seconds."""
    t0 = time.perf_counter()
    sb = make(arm, client).start()
    started = time.perf_counter() - t0
    try:
        for cmd in EPISODE:
            result = sb.exec(cmd)
            assert result.exit_code == 0, (arm, cmd, result.output)
        snapshot = sb.snapshot()
    finally:
        sb.close()
    try:
        with make(arm, client, image=snapshot) as verifier:
            assert verifier.exec("cd /app/src && ./hi").output == "hi\n"
    finally:
        client.images.remove(snapshot, force=True)
    return started, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--episodes", type=int, default=5)
    args = parser.parse_args()
    client = docker_client()
    facts = daemon_facts(client)
    arms = [a for a in ARMS if ARMS[a][1] in (None, *facts["runtimes"])]
    print(f"machine: {platform.node()} {platform.machine()} python {platform.python_version()}; "
          f"storage driver {facts['driver']}; runtimes {', '.join(facts['runtimes'])}")
    trips = {arm: round_trips(arm, client, args.n) for arm in arms}
    runs = {arm: [] for arm in arms}
    for _ in range(args.episodes):  # interleaved, so load drifts hit every arm alike
        for arm in arms:
            runs[arm].append(episode(arm, client))
    base = "runc plain"
    print(f"\ncommand round trip, p50 ms over {args.n} (ratio to {base})")
    print(f"{'arm':32}" + "".join(f"{cmd[:22]:>26}" for cmd in COMMANDS))
    for a in arms:
        print(f"{a:32}" + "".join(f"{trips[a][c]:>17.2f} ({trips[a][c] / trips[base][c]:5.2f}x)"
                                  for c in COMMANDS))
    print(f"\nstart to shell, and a whole episode ({len(EPISODE)} commands + snapshot + verifier "
          f"sandbox), median s over {args.episodes} (ratio to {base})")
    meds = {a: [statistics.median(r[i] for r in runs[a]) for i in (0, 1)] for a in arms}
    for a in arms:
        print(f"{a:32}" + "".join(f"{meds[a][i]:>17.3f} ({meds[a][i] / meds[base][i]:5.2f}x)"
                                  for i in (0, 1)))

if __name__ == "__main__":
    main()
