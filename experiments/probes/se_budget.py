"""How large must the test split be? The PPO - SFT difference's noise split into attempt
sampling and task-to-task spread, and the standard error other evaluation sizes would give.

    .venv/bin/python experiments/probes/se_budget.py runs/tiny_cpu [more runs ...] \
        [--designs 48x3,96x3,48x8,128x3]

Reads eval/sft and eval/ppo trials.jsonl of each run (runs evaluated with other
eval.sampling_seed draws of the same checkpoints pool their attempts: task t's attempts of run 2
follow run 1's) and prints t1jax.report.paired.variance_components and projected_se per design
(tasks x attempts). Why: issue #27 asks a standard error near 3 points of the test split; this
says whether more tasks or more attempts buy it, and at how many trials (docs/main_job.md)."""

import argparse
import json
from pathlib import Path


from t1jax.report.paired import projected_se, variance_components  # noqa: E402


def pooled_trials(runs: list[Path], label: str) -> list[dict]:
    """Every run's trials of `label`, attempts renumbered so run r's follow run r-1's."""
    out, offset = [], 0
    for run in runs:
        rows = [json.loads(line) for line in open(run / "eval" / label / "trials.jsonl")]
        out += [{**r, "attempt": offset + int(r["attempt"])} for r in rows]
        offset += 1 + max(int(r["attempt"]) for r in rows)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--designs", default="48x3,48x8,96x3,128x3,80x6")
    args = parser.parse_args()
    sft, ppo = pooled_trials(args.runs, "sft"), pooled_trials(args.runs, "ppo")
    for key in ("resolved", "reward"):
        c = variance_components(sft, ppo, key)
        scale, unit = (100, " pts") if key == "resolved" else (1, "")
        print(f"\n{key}: {c['tasks']} tasks x {c['attempts']} paired attempts; variance of one "
              f"attempt's difference within a task {c['within']:.4f}, of the tasks' true "
              f"differences {c['between']:.4f} (estimate {c['between_raw']:.4f})")
        print("tasks x attempts | trials per policy | projected SE of PPO - SFT")
        for design in args.designs.split(","):
            n, k = (int(x) for x in design.split("x"))
            print(f"  {n} x {k} | {n * k} | {scale * projected_se(c, n, k):.{2 if unit else 3}f}{unit}")


if __name__ == "__main__":
    main()
