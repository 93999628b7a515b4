"""Wall time of a slice of the test suite, run the old way and the ways scripts/test.sh runs it.

The slice (default: compile-heavy files that rebuild the same tiny models and steps) runs as
  serial, no cache     one process, no persistent compilation cache (the suite until 2026-12-03);
  serial, cold cache   one process, an empty JAX persistent compilation cache: programs compiled
                       by one test are reused by the next test (and job) that builds them again;
  serial, warm cache   the same again on the cache the previous run left (a second run on the
                       same machine);
  2 workers, cold      pytest-xdist, one file per worker at a time (scripts/test.sh), empty cache.
Each arm is a fresh pytest process over the same files; printed: wall seconds, passed count, and
the speed-up against the baseline measured in this run.

  .venv/bin/python experiments/benchmarks/suite_speed.py [--files tests/model/test_r3.py ...]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FILES = ["tests/rl/test_trainer.py", "tests/rollout/test_jax_engine.py", "tests/model/test_r3.py",
                 "tests/rollout/test_tito.py", "tests/rollout/test_long_context.py"]


def run(files, workers: int, cache: str | None) -> tuple[float, str]:
    env = dict(os.environ, T1JAX_JAX_CACHE=cache or "",
               T1JAX_TEST_TIMES_DIR=tempfile.mkdtemp(prefix="suite-times-"))
    parallel = ["-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder"] \
        if workers > 1 else []
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *parallel, *files], cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
    if proc.returncode != 0:
        sys.exit(f"pytest failed ({proc.returncode}): {tail}")
    summary = re.search(r"(\d+ passed.*?) in ", tail)
    return seconds, summary[1] if summary else tail


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="+", default=DEFAULT_FILES)
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; files: "
          f"{' '.join(args.files)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="jax-cache-") as root:
        arms = [("serial, no cache", 1, None), ("serial, cold cache", 1, f"{root}/a"),
                ("serial, warm cache", 1, f"{root}/a"), ("2 workers, cold cache", 2, f"{root}/b")]
        base = None
        print("| arm | wall s | tests | speed-up vs serial, no cache |\n|---|---|---|---|")
        for name, workers, cache in arms:
            seconds, summary = run(args.files, workers, cache)
            base = base or seconds
            print(f"| {name} | {seconds:.1f} | {summary} | {base / seconds:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
