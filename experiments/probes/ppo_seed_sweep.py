"""Is PPO's gain over SFT reliable? The PPO phase rerun from one SFT checkpoint with other seeds.

  .venv/bin/python experiments/probes/ppo_seed_sweep.py --source runs/tiny_cpu --seeds 1,2,3 \
      [--out runs/ppo_seeds] [--config configs/tiny_cpu.py] [-- --config.rl.actor_lr=1e-4 ...]

Each seed is the main job with --config.reuse=SOURCE (its pool, SFT actor, warm critic and base /
SFT evaluations linked, not redone) and --config.rollouts.sampling_seed=SEED, so only the PPO
rollouts and the PPO evaluation differ; every run resumes if the sweep is rerun. It prints, per
seed, PPO - SFT on the held-out tasks paired by task (t1jax.report.paired: the mean per-task
difference, its standard error and a bootstrap 95% interval over tasks), and pooled over the
seeds (each task's difference averaged over the seeds, then the same interval), and writes the
table to OUT/summary.md. About 13 minutes per seed on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from t1jax.report.paired import paired_difference, task_differences  # noqa: E402
from t1jax.rollout.evaluate import read_trials  # noqa: E402


def run_seed(source: Path, out: Path, seed: int, config: str, extra: list[str]) -> Path:
    workdir = out / f"seed_{seed}"
    cmd = [sys.executable, str(ROOT / "experiments" / "run.py"), "--config", config,
           "--workdir", str(workdir), f"--config.reuse={source}",
           f"--config.rollouts.sampling_seed={seed}", *extra]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return workdir


def gains(workdirs: dict[int, Path], key: str = "resolved") -> dict:
    """{seed: paired difference PPO - SFT} and "pooled": each task's difference averaged over
    the seeds, then paired against zero (the same interval over tasks). Per-task pooling is
    right here because every seed evaluates the source's one test split (and pairs with its one
    SFT evaluation): a task's seeds are repeated draws of the same task. Sweeps whose seeds
    draw their own splits pool by seed instead (t1jax.report.paired.pooled_over_strata)."""
    out, per_seed = {}, {}
    for seed, wd in workdirs.items():
        sft = read_trials(wd / "eval" / "sft" / "trials.jsonl")
        ppo = read_trials(wd / "eval" / "ppo" / "trials.jsonl")
        out[seed] = paired_difference(sft, ppo, key)
        per_seed[seed] = task_differences(sft, ppo, key)
    tasks = sorted(set.intersection(*(set(d) for d in per_seed.values()))) if per_seed else []
    mean = {t: sum(d[t] for d in per_seed.values()) / len(per_seed) for t in tasks}
    zero = [{"task_id": t, "status": "done", "reward": 0.0} for t in tasks]
    pooled = [{"task_id": t, "status": "done", "reward": mean[t]} for t in tasks]
    out["pooled"] = paired_difference(zero, pooled, "reward")  # a plain per-task value
    return out


def table(results: dict, key: str) -> str:
    pts = (lambda x: f"{100 * x:+.1f} pts") if key == "resolved" else (lambda x: f"{x:+.3f}")
    lines = [f"| seed | PPO - SFT, {key} (paired by task) | SE | 95% interval | tasks |",
             "|---|---|---|---|---|"]
    for seed, r in results.items():
        lines.append(f"| {seed} | {pts(r['mean'])} | {pts(r['se'])[1:]} | {pts(r['low'])} .. "
                     f"{pts(r['high'])} | {r['tasks']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, help="a finished main-job workdir")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--out", default="runs/ppo_seeds")
    parser.add_argument("--config", default=str(ROOT / "configs" / "tiny_cpu.py"))
    parser.add_argument("extra", nargs="*", help="more --config.x=y flags, after --")
    args = parser.parse_args(argv)
    source, out = Path(args.source).resolve(), Path(args.out).resolve()
    if not (source / "sft" / "DONE").is_file():
        parser.error(f"--source {source}: no finished SFT phase (run bash scripts/main.sh)")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if len(seeds) < 1:
        parser.error("--seeds names no seed")
    workdirs = {s: run_seed(source, out, s, args.config, args.extra) for s in seeds}
    text = [f"# PPO seed sweep from `{source}`", ""]
    for key in ("resolved", "reward"):
        results = gains(workdirs, key)
        text += [table(results, key), ""]
    text.append("pooled: each task's PPO - SFT difference averaged over the seeds, then its "
                "mean, standard error and bootstrap interval over tasks.")
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text("\n".join(text) + "\n")
    (out / "runs.json").write_text(json.dumps({s: str(w) for s, w in workdirs.items()}) + "\n")
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
