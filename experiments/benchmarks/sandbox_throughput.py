"""Sandbox start+stop time, and full episodes per minute (fresh sandbox, oracle solution,
verification: in the agent's sandbox, or in a second fresh sandbox from a snapshot) with 1, 2,
4 and 8 sandboxes at once. Ratios are against the first row (one sandbox at a time, the first
--where), measured in the same run.

  .venv/bin/python experiments/benchmarks/sandbox_throughput.py [--episodes 16] [--backend docker]
      [--daemon-diff] [--per-file-reads] [--where agent,snapshot]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time


from t1jax.sandbox import make_backend  # noqa: E402
from t1jax.sandbox.backend import SandboxSpec  # noqa: E402
from t1jax.rollout.fan_out import fan_out  # noqa: E402
from t1jax.rollout.trial import TrialSite  # noqa: E402
from t1jax.tasks.pool import default_pool_dir, load_pool  # noqa: E402
from t1jax.curation.validate import run_episode  # noqa: E402
from t1jax.verify.reward import pool_scale  # noqa: E402
from t1jax.verify.verifier import VerifierSettings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=16, help="episodes per concurrency level")
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--backend", default="docker")
    parser.add_argument("--where", default="agent",
                        help="comma-separated verifier places (verifier.where): agent, snapshot")
    parser.add_argument("--daemon-diff", action="store_true",
                        help="the tamper check asks the daemon (`docker diff`) instead of "
                        "reading the overlay layers: the baseline of sandbox/overlay.py")
    parser.add_argument("--per-file-reads", action="store_true",
                        help="the verifier reads its result files with one archive call each "
                        "instead of one for the directory: the baseline of get_files")
    args = parser.parse_args()
    if args.per_file_reads:
        from t1jax.sandbox.docker import DockerSandbox
        from t1jax.sandbox.shell_sandbox import ShellSandbox
        DockerSandbox.get_files = ShellSandbox.get_files
    if args.daemon_diff:
        from t1jax.sandbox import overlay
        overlay.changes = lambda upper, lowers: None  # None: DockerSandbox asks the daemon
    backend = make_backend(args.backend)
    tasks = load_pool(default_pool_dir()).tasks
    scale = pool_scale(tasks)
    site = TrialSite(backend, run_id="bench", scale=scale)
    images = site.images
    # a backend that cannot build a task (bwrap's Dockerfile subset) leaves it out
    unbuilt = [f"{tid} ({why[:160]})" for tid, why in images.build_all(tasks).items()]
    tasks = [t for t in tasks if t.task_id in images.built]
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}; backend {args.backend}; {len(tasks)} tasks"
          + (f"; {len(unbuilt)} not buildable here, left out: {'; '.join(unbuilt)}"
             if unbuilt else ""))

    image = images.built[tasks[0].task_id]
    times = []
    for _ in range(args.starts):
        t = time.perf_counter()
        with backend.create(SandboxSpec(image=image, workdir="/app")) as sb:
            sb.exec("true")
        times.append(time.perf_counter() - t)
    print(f"sandbox start + first command + stop: p50 {statistics.median(times) * 1000:.0f} ms "
          f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}; n={len(times)})")

    base_rate = None
    print(f"{'where':>8} {'concurrent':>10} {'episodes':>9} {'wall s':>8} {'episodes/min':>13} "
          f"{'vs row 1':>8} {'all solved':>10}")
    for level in (int(c) for c in args.concurrency.split(",")):
        for where in args.where.split(","):
            jobs = [tasks[i % len(tasks)] for i in range(args.episodes)]
            t = time.perf_counter()
            results = fan_out(jobs, lambda task: run_episode(
                task, "oracle", site, VerifierSettings(where=where)), workers=level)
            wall = time.perf_counter() - t
            rate = len(jobs) / wall * 60
            base_rate = base_rate or rate
            solved = all(r.report is not None and r.report.solved for r in results)
            print(f"{where:>8} {level:>10} {len(jobs):>9} {wall:>8.1f} {rate:>13.1f} "
                  f"{rate / base_rate:>7.2f}x {str(solved):>10}")


if __name__ == "__main__":
    main()
