"""Command round trip: our persistent shell vs a fresh `docker exec` per command vs Terminus-2's
fixed 1 s wait after each command. Prints p50/p95 and the ratios, measured in the same run.

  .venv/bin/python experiments/benchmarks/shell_latency.py [--n 200] [--backend docker|bwrap]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time


from t1jax.sandbox import make_backend  # noqa: E402
from t1jax.sandbox.backend import SandboxSpec  # noqa: E402
from t1jax.sandbox.images import LOCAL_BASE_IMAGE  # noqa: E402

TERMINUS_WAIT_S = 1.0


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def time_calls(fn, n: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--n-terminus", type=int, default=5)
    parser.add_argument("--backend", default="docker")
    args = parser.parse_args()
    backend = make_backend(args.backend)
    image = LOCAL_BASE_IMAGE if args.backend == "docker" else backend.base_image()
    print(f"machine: {platform.node()} {platform.machine()} {platform.processor() or ''} "
          f"python {platform.python_version()}; backend {args.backend}")
    rows = []
    with backend.create(SandboxSpec(image=image, workdir="/app")) as sb:
        for cmd in ("true", "ls /"):
            persistent = time_calls(lambda: sb.exec(cmd), args.n)
            if args.backend == "docker":
                fresh = time_calls(lambda: sb.container.exec_run(["/bin/sh", "-c", cmd]), args.n // 4)
            else:
                fresh = None
            terminus = time_calls(lambda: (sb.exec(cmd), time.sleep(TERMINUS_WAIT_S)),
                                  args.n_terminus)
            rows.append((cmd, persistent, fresh, terminus))
    print(f"{'command':8} {'persistent p50/p95 ms':>22} {'fresh exec p50/p95 ms':>22} "
          f"{'1 s wait p50 ms':>16} {'fresh/persist':>14} {'wait/persist':>13}")
    for cmd, persistent, fresh, terminus in rows:
        p50, p95 = percentiles(persistent)
        t50, _ = percentiles(terminus)
        if fresh:  # bwrap has no exec-into-a-running-sandbox to compare against
            f50, f95 = percentiles(fresh)
            fresh_cells = f"{f50:>10.2f} / {f95:<9.2f}", f"{f50 / p50:>13.1f}x"
        else:
            fresh_cells = f"{'n/a':>22}", f"{'n/a':>14}"
        print(f"{cmd:8} {p50:>10.2f} / {p95:<9.2f} {fresh_cells[0]} {t50:>16.0f} "
              f"{fresh_cells[1]} {t50 / p50:>12.0f}x")
    worst = max(percentiles(r[1])[0] for r in rows)
    print(f"target p50 < 20 ms: {'met' if worst < 20 else 'MISSED'} (worst p50 {worst:.2f} ms)")


if __name__ == "__main__":
    main()
