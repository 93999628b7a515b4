"""The main job's evaluation on the Docker and the bubblewrap sandbox backends: trials per
second, where the machine's CPU goes, and whether the two give the same outcomes.

  .venv/bin/python experiments/benchmarks/eval_backends.py --run runs/tiny_cpu \
      [--label sft] [--backends docker,bwrap] [--tasks 48]

Evaluates a finished main-job run's SFT (or PPO) checkpoint on its test split exactly as the
recipe does (configs/tiny_cpu.py: 3 attempts, one seed, 6 sandboxes at once, the embedded
engine), once per backend, into a temporary folder (the run is only read). Docker, the first
backend listed, is the baseline of the printed ratio. Per backend: wall time, trials per
second, the machine's busy CPU-seconds (from /proc/stat) split into this process with its
children (the engine, the agent loop, bwrap's sandboxes) and the rest (the Docker daemon,
containerd, runc, the containers' processes); then how many trials differ in outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path


from configs import tiny_cpu  # noqa: E402
from experiments.benchmarks.ppo_step import machine_lines  # noqa: E402
from t1jax.jobs import build  # noqa: E402
from t1jax.jobs.recipe import Recipe  # noqa: E402
from t1jax.rollout.fan_out import Images  # noqa: E402


def busy_cpu_s() -> float:
    """CPU-seconds the whole machine has been busy (all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU-seconds of this process and its waited-for children."""
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def evaluate_on(run: Path, label: str, backend: str, tasks: int) -> dict:
    config = tiny_cpu.get_config()
    config.sandbox.backend = backend
    work = Path(tempfile.mkdtemp(prefix=f"t1jax-eval-{backend}-"))
    try:  # the run's tokenizer, train split (the reward scale) and first test tasks, read only
        (work / "tokenizer.json").symlink_to((run / "tokenizer.json").resolve())
        (work / "pool" / "heldout").mkdir(parents=True)
        (work / "pool" / "train").symlink_to((run / "pool" / "train").resolve())
        for task_dir in sorted(p for p in (run / "pool" / "heldout").iterdir()
                               if p.is_dir())[:tasks]:
            (work / "pool" / "heldout" / task_dir.name).symlink_to(task_dir.resolve())
        recipe = Recipe(config, work)
        policy = build.restored_actor(build.policy(config), run / label / "checkpoints")
        # image builds are not what is measured
        if failed := Images(recipe.stack().backend, recipe.images).build_all(
                recipe.split("heldout")):
            raise SystemExit(f"backend {backend} cannot build every task: {failed}")
        busy, own, t = busy_cpu_s(), own_cpu_s(), time.perf_counter()
        summary = recipe.evaluate(label, policy)
        wall, busy, own = time.perf_counter() - t, busy_cpu_s() - busy, own_cpu_s() - own
        trials = [json.loads(line) for line in open(recipe.eval_dir(label) / "trials.jsonl")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"backend": backend, "wall": wall, "trials": len(trials), "busy": busy, "own": own,
            "resolved": summary["resolved_rate"],
            "outcomes": {(r["task_id"], r["attempt"]): (r["resolved"], r["reward"])
                         for r in trials}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True, help="a finished main-job workdir")
    parser.add_argument("--label", default="sft", choices=("sft", "ppo"))
    parser.add_argument("--backends", default="docker,bwrap")
    parser.add_argument("--tasks", type=int, default=48, help="first N test tasks")
    args = parser.parse_args()
    for line in machine_lines():
        print(line)
    run = Path(args.run)
    results = [evaluate_on(run, args.label, b, args.tasks) for b in args.backends.split(",")]
    base = results[0]
    print(f"\n{args.label} of {run} on {base['trials']} test trials (3 attempts each)")
    print("backend | resolved | wall s | trials/s | vs " + base["backend"] + " | busy CPU-s | "
          "this process + children | the rest (daemons, containers)")
    for r in results:
        print(f"  {r['backend']} | {100 * r['resolved']:.1f}% | {r['wall']:.1f} | "
              f"{r['trials'] / r['wall']:.2f} | {base['wall'] / r['wall']:.2f}x | "
              f"{r['busy']:.0f} | {r['own']:.0f} | {max(r['busy'] - r['own'], 0):.0f}")
    for r in results[1:]:
        differ = [k for k, v in r["outcomes"].items() if base["outcomes"].get(k) != v]
        print(f"trials whose (resolved, reward) differ, {r['backend']} vs {base['backend']}: "
              f"{len(differ)} of {r['trials']}" + (f" (e.g. {differ[:3]})" if differ else ""))


if __name__ == "__main__":
    main()
