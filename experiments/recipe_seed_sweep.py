"""Is the recipe's gain reliable across seeds? The whole main job rerun with other config.seed.

  .venv/bin/python experiments/recipe_seed_sweep.py --seeds 0,1,2 --existing 0=runs/tiny_cpu \
      [--out runs/recipe_seeds] [--config configs/tiny_cpu.py] [--dry-run | --summary-only] \
      [-- --config.x=y ...]

Each seed is experiments/run.py --config CONFIG --workdir OUT/seed_<s> --config.seed=<s>: a new
pool and train / validation / test split, its tokenizer, the SFT data order, SFT, Critic
Warm-Up, PPO and the evaluations' random numbers all derive from config.seed, so the seeds
differ in everything experiments/probes/ppo_seed_sweep.py holds fixed. Rerunning the sweep resumes
each workdir; a failed seed does not stop the others. --existing S=WORKDIR (repeatable) counts
a finished run as seed S without running it (the main run as seed 0); flags after -- go to
every run and must be those the existing runs were made with.

It prints, and writes to OUT/summary.md (the numbers in OUT/summary.json, the workdirs in
OUT/runs.json, which experiments/ablation_sweep.py --base reads): per seed, the SFT and PPO
resolved rates on that seed's own test split, PPO - SFT paired by task (resolved rate and
dense reward: mean, SE and bootstrap 95% interval over tasks; t1jax.report.paired), the same
on its validation split, the critic's explained variance at PPO's first step and PPO's mean
clip fraction; and pooled over the seeds by seed (t1jax.report.paired.pooled_over_strata: the
seeds' splits differ, so no task pairs across seeds). --summary-only reads what is there.
About 50-60 minutes per seed on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from t1jax.metrics_log import read_jsonl  # noqa: E402
from t1jax.report.paired import (paired_difference, per_task, pooled_over_strata,  # noqa: E402
                                 task_differences)
from t1jax.rollout.evaluate import read_trials  # noqa: E402

KEYS = ("resolved", "reward")
EV = "critic/explained_variance"
CLIP_KEYS = ("actor/clip_frac_after_first", "actor/clip_frac")  # the first update's ratio is 1


# -- command lines ----------------------------------------------------------------------------

def parse_seeds(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def parse_existing(items: list[str] | None) -> dict[int, Path]:
    """--existing S=WORKDIR (repeatable, or comma-separated) as {seed: resolved workdir}."""
    out = {}
    for item in ",".join(items or []).split(","):
        if item.strip():
            seed, sep, path = item.partition("=")
            if not sep or not path:
                raise ValueError(f"--existing {item!r}: expected SEED=WORKDIR")
            out[int(seed)] = Path(path).resolve()
    return out


def seed_command(config: str, workdir: Path, seed: int, extra: list[str]) -> list[str]:
    """The main job of one seed: every seed-derived choice (pool, SFT order, sampling) follows."""
    return [sys.executable, str(ROOT / "experiments" / "run.py"), "--config", config,
            "--workdir", str(workdir), f"--config.seed={seed}", *extra]


def plan(seeds: list[int], out: Path, existing: dict[int, Path], config: str,
         extra: list[str]) -> dict[int, tuple[Path, list[str] | None]]:
    """{seed: (workdir, command)}: the --existing seeds with no command (read, never rerun),
    the others in OUT/seed_<s>; seeds in order, --existing ones included."""
    return {s: (existing[s], None) if s in existing else
            (out / f"seed_{s}", seed_command(config, out / f"seed_{s}", s, extra))
            for s in sorted(set(seeds) | set(existing))}


def seed_mismatch(workdir: Path, seed: int) -> str | None:
    """Why `workdir` cannot stand for `seed` (its config.json names another), else None."""
    path = workdir / "config.json"
    if path.is_file():
        theirs = json.loads(path.read_text()).get("seed")
        if theirs is not None and theirs != seed:
            return f"{workdir} was run with config.seed={theirs}, not {seed}"
    return None


def run_commands(commands: list[list[str]]) -> list[list[str]]:
    """Runs each in turn from the repository root; a failure is reported, not fatal (hours of
    other runs would otherwise wait on it). Returns the failed commands."""
    failed = []
    for cmd in commands:
        print("$", shlex.join(cmd), flush=True)
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            print(f"failed: {shlex.join(cmd)}", flush=True)
            failed.append(cmd)
    return failed


# -- reading a workdir ------------------------------------------------------------------------

def trials(workdir: Path, label: str, split: str = "test") -> list[dict] | None:
    """A finished evaluation's trials (eval/<label>, or eval/<split>/<label>), None if absent."""
    folder = workdir / "eval" / label if split == "test" else workdir / "eval" / split / label
    path = folder / "trials.jsonl"
    return read_trials(path) if path.is_file() else None


def rate(rows: list[dict] | None, key: str) -> float | None:
    """The report's rate: the mean over tasks of each task's mean over attempts."""
    values = list(per_task(rows, key).values()) if rows else []
    return sum(values) / len(values) if values else None


def compare(before: list[dict] | None, after: list[dict] | None) -> dict | None:
    """after - before paired by task, per key: {key: {"paired": ..., "diffs": {task: d}}}."""
    if before is None or after is None:
        return None
    return {k: {"paired": paired_difference(before, after, k),
                "diffs": task_differences(before, after, k)} for k in KEYS}


def training(workdir: Path) -> dict:
    """From ppo/metrics.jsonl: the critic's explained variance at PPO's first step (what the
    warm-up handed over) and the mean clip fraction (after the first update where logged)."""
    rows = read_jsonl(workdir / "ppo" / "metrics.jsonl")
    ev = rows[0].get(EV) if rows else None
    out = {"ev_start": ev, "clip_frac": None, "clip_key": None}
    for key in CLIP_KEYS:
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        if values:
            out.update(clip_frac=sum(values) / len(values), clip_key=key)
            break
    return out


def seed_result(workdir: Path) -> dict:
    """One seed's numbers: rates, PPO - SFT on test and validation, the training readings."""
    sft, ppo = trials(workdir, "sft"), trials(workdir, "ppo")
    return {"workdir": str(workdir),
            "rates": {label: {k: rate(rows, k) for k in KEYS}
                      for label, rows in (("sft", sft), ("ppo", ppo))},
            "test": compare(sft, ppo),
            "validation": compare(trials(workdir, "sft", "validation"),
                                  trials(workdir, "ppo", "validation")),
            **training(workdir)}


def pool(results: list[dict | None]) -> dict | None:
    """compare() results of several seeds pooled by seed (pooled_over_strata), per key; the
    seeds without the comparison are left out."""
    have = [r for r in results if r is not None]
    if not have:
        return None
    return {k: pooled_over_strata([r[k]["diffs"] for r in have]) for k in KEYS}


def mean_of(values) -> float | None:
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(values) / len(values) if values else None


# -- the summary ------------------------------------------------------------------------------

def fmt_diff(r: dict | None, key: str) -> str:
    """+11.1 pts (SE 4.4; +2.1 .. +20.1) for resolved, +0.050 (SE 0.020; ...) for reward."""
    if r is None or not math.isfinite(r["mean"]):
        return "—"
    f = (lambda x: f"{100 * x:+.1f}") if key == "resolved" else (lambda x: f"{x:+.3f}")
    unit = " pts" if key == "resolved" else ""
    if not math.isfinite(r["se"]):
        return f"{f(r['mean'])}{unit} (< 2 tasks)"
    return f"{f(r['mean'])}{unit} (SE {f(r['se'])[1:]}; {f(r['low'])} .. {f(r['high'])})"


def fmt_rate(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def fmt_num(x) -> str:
    return "—" if not isinstance(x, (int, float)) or not math.isfinite(x) else f"{x:.3f}"


def paired(comparison: dict | None, key: str) -> dict | None:
    return None if comparison is None else comparison[key]["paired"]


def summarize(workdirs: dict[int, Path]) -> tuple[str, dict]:
    """The summary's Markdown and its numbers, for the seeds' workdirs (unfinished ones shown
    as such and left out of the pool)."""
    results = {s: seed_result(wd) for s, wd in workdirs.items()}
    done = {s: r for s, r in results.items() if r["test"] is not None}
    pooled = {split: pool([r[split] for r in done.values()]) for split in ("test", "validation")}
    n = len(done)
    lines = ["# Recipe seed sweep", "",
             "Each seed is the whole recipe (pool and split, SFT, Warm-Up, PPO, evaluation) "
             "with its own config.seed; PPO - SFT is paired by task on the seed's own split.", "",
             "## Test split", "",
             "| seed | tasks | SFT resolved | PPO resolved | PPO − SFT, resolved | "
             "PPO − SFT, dense reward |", "|---|---|---|---|---|---|"]
    for s, r in results.items():
        if r["test"] is None:
            lines.append(f"| {s} | not finished: no eval/sft and eval/ppo trials in "
                         f"{r['workdir']} | | | | |")
            continue
        lines.append(f"| {s} | {paired(r['test'], 'resolved')['tasks']} | "
                     f"{fmt_rate(r['rates']['sft']['resolved'])} | "
                     f"{fmt_rate(r['rates']['ppo']['resolved'])} | "
                     f"{fmt_diff(paired(r['test'], 'resolved'), 'resolved')} | "
                     f"{fmt_diff(paired(r['test'], 'reward'), 'reward')} |")
    if pooled["test"]:
        p = pooled["test"]
        lines.append(f"| pooled ({n} seeds) | {p['resolved']['tasks']} | "
                     f"{fmt_rate(mean_of(r['rates']['sft']['resolved'] for r in done.values()))} | "
                     f"{fmt_rate(mean_of(r['rates']['ppo']['resolved'] for r in done.values()))} | "
                     f"{fmt_diff(p['resolved'], 'resolved')} | {fmt_diff(p['reward'], 'reward')} |")
    lines += ["", "## Validation split and training", "",
              "| seed | validation PPO − SFT, resolved | validation PPO − SFT, dense reward | "
              "critic explained variance at PPO step 1 | PPO clip fraction (mean) |",
              "|---|---|---|---|---|"]
    for s, r in done.items():
        lines.append(f"| {s} | {fmt_diff(paired(r['validation'], 'resolved'), 'resolved')} | "
                     f"{fmt_diff(paired(r['validation'], 'reward'), 'reward')} | "
                     f"{fmt_num(r['ev_start'])} | {fmt_num(r['clip_frac'])} |")
    if done:
        v = pooled["validation"] or {}
        lines.append(f"| pooled ({n} seeds) | {fmt_diff(v.get('resolved'), 'resolved')} | "
                     f"{fmt_diff(v.get('reward'), 'reward')} | "
                     f"{fmt_num(mean_of(r['ev_start'] for r in done.values()))} | "
                     f"{fmt_num(mean_of(r['clip_frac'] for r in done.values()))} |")
    lines += ["", POOLING_NOTE]
    if pooled["test"] and n > 1:
        se = pooled["test"]["resolved"]["seed_se"]
        lines += ["", f"The spread of the seeds' test means, resolved (SE over seeds, {n - 1} "
                  f"degree{'s' * (n > 2)} of freedom; it also holds training randomness, which "
                  f"the pooled SE does not): {100 * se:.1f} pts."]
    keys = sorted({r["clip_key"] for r in done.values() if r["clip_key"]})
    if keys:
        lines += ["", f"Clip fraction: the mean over PPO steps of {', '.join(keys)}."]
    data = {"seeds": {str(s): strip(r) for s, r in results.items()}, "pooled": pooled}
    return "\n".join(lines) + "\n", data


POOLING_NOTE = ("pooled: each seed is one stratum (the seeds' splits differ, so no task pairs "
                "across seeds): the mean of the seeds' means, SE = sqrt(sum of the seeds' "
                "SE²) / seeds, and a bootstrap 95% interval resampling tasks within each seed "
                "(t1jax.report.paired.pooled_over_strata). Rates in the pooled row: the mean "
                "over seeds.")


def strip(result: dict) -> dict:
    """A result for summary.json: the paired numbers without the per-task differences."""
    out = dict(result)
    for split in ("test", "validation"):
        if out.get(split) is not None:
            out[split] = {k: v["paired"] for k, v in out[split].items()}
    return out


def write_summary(out: Path, text: str, data: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(data, indent=1, default=str) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated config.seed values")
    parser.add_argument("--existing", action="append", metavar="SEED=WORKDIR",
                        help="a finished run that stands for SEED (not rerun); repeatable")
    parser.add_argument("--out", default="runs/recipe_seeds")
    parser.add_argument("--config", default=str(ROOT / "configs" / "tiny_cpu.py"))
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--summary-only", action="store_true",
                        help="run nothing: summarize the workdirs as they are")
    parser.add_argument("extra", nargs="*", help="more --config.x=y flags, after --")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    try:
        existing = parse_existing(args.existing)
    except ValueError as err:
        parser.error(str(err))
    runs = plan(parse_seeds(args.seeds), out, existing, str(Path(args.config).resolve()),
                args.extra)
    if not runs:
        parser.error("--seeds names no seed")
    for seed, (workdir, _) in runs.items():
        if why := seed_mismatch(workdir, seed):
            parser.error(why)
    commands = [cmd for _, cmd in runs.values() if cmd is not None]
    if args.dry_run:
        for cmd in commands:
            print(shlex.join(cmd))
        return 0
    failed = [] if args.summary_only else run_commands(commands)
    workdirs = {s: wd for s, (wd, _) in runs.items()}
    text, data = summarize(workdirs)
    write_summary(out, text, data)
    (out / "runs.json").write_text(json.dumps({s: str(w) for s, w in workdirs.items()}) + "\n")
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
