"""The main job as 1 process and as N processes on this machine: each phase's wall time, their
ratio, and whether the N-process run wrote what the 1-process run wrote.

  .venv/bin/python experiments/benchmarks/multiprocess_recipe.py \
      [--processes 2] [--out /tmp/mp_recipe] [--full] [-- --config.x=y ...]

Runs configs/tiny_cpu.py at the tests' toy size (--full: the main job's own size, about an
hour per run on 2 cores) twice into OUT/one and OUT/n (deleted first): as one process with one
CPU device, then through experiments/launch_local.py as N processes with one device each over a
data=N mesh. The 1-process run is the baseline of the printed ratio. On a 2-core machine N
processes cannot be faster (they share the cores, and process 0 alone plays the oracle, the
SFT data and the evaluations): the point is what it costs to run the same program as a pod
would, and that it gives the same results (the last lines: which files are equal).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from experiments.benchmarks.ppo_step import machine_lines  # noqa: E402

TOY = ["--config.pool.families=write,mkdir", "--config.pool.train_per_family=3",
       "--config.pool.heldout_per_family=2", "--config.pool.validation_per_family=1",
       "--config.sft.steps=3", "--config.warmup.steps=1", "--config.ppo.steps=1",
       "--config.eval.attempts=1", "--config.rollouts.batch_size=2"]


def phase_times(workdir: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in (workdir / "timings.jsonl").read_text().splitlines():
        row = json.loads(line)
        out[row["phase"]] = out.get(row["phase"], 0.0) + row["seconds"]
    return out


def trials(folder: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (folder / "trials.jsonl").read_text().splitlines()]
    return sorted((r["task_id"], r["attempt"], r["reward"], r["turns"], r["sampled_tokens"])
                  for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("/tmp/mp_recipe_bench"))
    parser.add_argument("--full", action="store_true", help="the main job's size, not toy")
    parser.add_argument("extra", nargs="*", help="flags after -- go to both runs")
    args = parser.parse_args()
    from experiments import launch_local
    n = args.processes
    size = [] if args.full else TOY
    base = ["--config", str(ROOT / "configs" / "tiny_cpu.py"), *size, *args.extra]
    one, many = args.out / "one", args.out / f"p{n}"
    for folder in (one, many):
        shutil.rmtree(folder, ignore_errors=True)
    for line in machine_lines():
        print(line)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    t0 = time.monotonic()
    subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), *base, "--workdir",
                    str(one)], env=env, check=True, stdout=subprocess.DEVNULL)
    wall_one = time.monotonic() - t0
    t0 = time.monotonic()
    with open(args.out / "launch.log", "w") as log:
        stdout, sys.stdout = sys.stdout, log
        try:
            code = launch_local.launch([*base, "--workdir", str(many),
                                        f"--config.mesh.data={n}"], n, 1)
        finally:
            sys.stdout = stdout
    wall_many = time.monotonic() - t0
    if code:
        raise SystemExit(f"the {n}-process run failed ({code}): see {args.out / 'launch.log'}")
    a, b = phase_times(one), phase_times(many)
    print(f"\n| phase | 1 process (s) | {n} processes (s) | ratio |\n|---|---|---|---|")
    for phase in a:
        print(f"| {phase} | {a[phase]:.1f} | {b.get(phase, float('nan')):.1f} | "
              f"{b.get(phase, float('nan')) / max(a[phase], 1e-9):.2f}x |")
    print(f"| whole command (with start-up) | {wall_one:.1f} | {wall_many:.1f} | "
          f"{wall_many / wall_one:.2f}x |")
    print()
    for name in ("pool/split.json", "tokenizer.json"):
        print(f"{name}: {'equal' if (one / name).read_bytes() == (many / name).read_bytes() else 'DIFFERENT'}")
    evals = sorted(str(p.parent.relative_to(one / "eval")) for p in
                   (one / "eval").rglob("summary.json"))
    for label in evals:
        same = trials(one / "eval" / label) == trials(many / "eval" / label)
        print(f"eval {label}: trials {'equal' if same else 'differ'} (task, attempt, reward, "
              f"turns, sampled tokens)")


if __name__ == "__main__":
    main()
