"""Ablations over recipe seeds: each arm's PPO against the main run's, paired by task per seed.

  .venv/bin/python experiments/ablation_sweep.py --arms binary_reward,cold_critic,shuffled_reward \
      --seeds 0,1,2 --base runs/recipe_seeds [--existing 0=runs/tiny_cpu] \
      [--out runs/ablation_seeds] [--dry-run | --summary-only] [-- --config.x=y ...]

An arm is a configs/ablations.py variant (any name in its VARIANTS). Each (arm, seed) is
experiments/run.py --config configs/ablations.py:<arm> --workdir OUT/<arm>/seed_<s>
--config.seed=<s> --config.reuse=<the seed's main workdir>: the pool, SFT, Critic Warm-Up and
the base / SFT evaluations are linked from the main run of that seed, so only what the arm
changes (PPO, or Warm-Up and PPO) and the PPO evaluation run, with the main run's split and
random numbers. The seed's main workdir is --existing S=WORKDIR, else the one
experiments/recipe_seed_sweep.py recorded for S in BASE/runs.json, else BASE/seed_<s>; a seed
whose main run has no finished SFT is skipped. Flags after -- go to every run and must be those
the main runs were made with (else nothing is linked and SFT is trained again). Runs go seed
by seed (every arm of one seed, then the next), resume when the sweep is rerun, and a failed
run does not stop the others.

It prints, and writes to OUT/summary.md (numbers in OUT/summary.json): per arm and seed, arm
PPO - main PPO and arm PPO - SFT on test paired by task (resolved rate and dense reward; mean,
SE, bootstrap 95% interval), the critic's explained variance at PPO's first step and PPO's
clip fraction, pooled over seeds by seed (t1jax.report.paired.pooled_over_strata); and
OUT/ev_curves.png, the critic's explained variance over Warm-Up (steps <= 0) and PPO steps per
arm and the main run: the mean over seeds with the seeds' min-max band. About 12-15 minutes
per arm run on 2 cores (cold critics skip the ~2-minute Warm-Up).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from experiments.recipe_seed_sweep import (  # noqa: E402
    EV, KEYS, compare, fmt_diff, fmt_num, fmt_rate, paired, parse_existing, parse_seeds, pool,
    rate, run_commands, seed_mismatch, strip, training, trials, write_summary)

from t1jax.metrics_log import read_jsonl  # noqa: E402
from t1jax.report.plots import series  # noqa: E402

MAIN = "main"  # the reference arm: the seed's main run


# -- command lines ----------------------------------------------------------------------------

def main_workdirs(base: Path | None, seeds: list[int],
                  existing: dict[int, Path]) -> dict[int, Path]:
    """{seed: its main run}: --existing first, then BASE/runs.json (the seed sweep's record,
    which holds its own --existing), then BASE/seed_<s>."""
    recorded = {}
    if base is not None and (base / "runs.json").is_file():
        recorded = {int(s): Path(p) for s, p in json.loads((base / "runs.json").read_text()).items()}
    out = {}
    for s in sorted(set(seeds) | set(existing)):
        if s in existing:
            out[s] = existing[s]
        elif s in recorded:
            out[s] = recorded[s]
        elif base is not None:
            out[s] = base / f"seed_{s}"
    return out


def arm_command(arm: str, workdir: Path, seed: int, main: Path, extra: list[str]) -> list[str]:
    """One arm on one seed: the variant, with the seed's main run's unchanged phases linked."""
    return [sys.executable, str(ROOT / "experiments" / "run.py"),
            "--config", f"{ROOT / 'configs' / 'ablations.py'}:{arm}", "--workdir", str(workdir),
            f"--config.seed={seed}", f"--config.reuse={main}", *extra]


def plan(arms: list[str], mains: dict[int, Path], out: Path,
         extra: list[str]) -> list[tuple[str, int, Path, list[str]]]:
    """(arm, seed, workdir, command), seed by seed: one pass over the seeds' first gives every
    arm a first seed early."""
    return [(arm, s, out / arm / f"seed_{s}",
             arm_command(arm, out / arm / f"seed_{s}", s, main, extra))
            for s, main in sorted(mains.items()) for arm in arms]


# -- the summary ------------------------------------------------------------------------------

def same_split(arm_wd: Path, main_wd: Path) -> bool:
    """The arm evaluated the main run's split (its pool linked from it); a missing pool on
    either side is not held against it."""
    a, b = arm_wd / "pool", main_wd / "pool"
    return not (a.exists() and b.exists()) or a.resolve() == b.resolve()


def arm_result(arm_wd: Path, main_wd: Path) -> dict:
    """One (arm, seed): arm PPO - main PPO and arm PPO - SFT on test, paired by task."""
    arm_ppo, main_ppo = trials(arm_wd, "ppo"), trials(main_wd, "ppo")
    sft = trials(arm_wd, "sft") or trials(main_wd, "sft")  # linked: the same evaluation
    return {"workdir": str(arm_wd), "same_split": same_split(arm_wd, main_wd),
            "rates": {"main_ppo": {k: rate(main_ppo, k) for k in KEYS},
                      "arm_ppo": {k: rate(arm_ppo, k) for k in KEYS}},
            "vs_main": compare(main_ppo, arm_ppo), "vs_sft": compare(sft, arm_ppo),
            **training(arm_wd)}


def main_result(main_wd: Path) -> dict:
    """The reference row: the main run's PPO - SFT."""
    return {"workdir": str(main_wd), "same_split": True,
            "vs_sft": compare(trials(main_wd, "sft"), trials(main_wd, "ppo")),
            **training(main_wd)}


def summarize(arms: list[str], mains: dict[int, Path], out: Path) -> tuple[str, dict]:
    """The summary's Markdown and numbers from the arms' and main runs' workdirs as they are."""
    results = {MAIN: {s: main_result(wd) for s, wd in mains.items()}}
    for arm in arms:
        results[arm] = {s: arm_result(out / arm / f"seed_{s}", wd) for s, wd in mains.items()}

    def usable(r: dict, what: str) -> bool:
        return r.get(what) is not None and r["same_split"]

    pooled = {name: {what: pool([r[what] for r in per_seed.values() if usable(r, what)])
                     for what in ("vs_main", "vs_sft")}
              for name, per_seed in results.items()}
    lines = ["# Ablation sweep", "",
             "Each arm reuses its seed's main run (pool, SFT, Warm-Up, base / SFT evaluations) "
             "and changes one thing; differences are paired by task on the seed's test split.",
             "", "| arm | seeds | arm PPO − main PPO, resolved | arm PPO − main PPO, dense "
             "reward | arm PPO − SFT, resolved | arm PPO − SFT, dense reward |",
             "|---|---|---|---|---|---|"]
    for name, p in pooled.items():
        n = max((p[w]["resolved"]["strata"] for w in p if p[w]), default=0)
        vm, vs = p["vs_main"] or {}, p["vs_sft"] or {}
        lines.append(f"| {name} | {n} | {fmt_diff(vm.get('resolved'), 'resolved')} | "
                     f"{fmt_diff(vm.get('reward'), 'reward')} | "
                     f"{fmt_diff(vs.get('resolved'), 'resolved')} | "
                     f"{fmt_diff(vs.get('reward'), 'reward')} |")
    for arm in arms:
        lines += ["", f"## {arm}", "",
                  "| seed | tasks | main PPO resolved | arm PPO resolved | arm − main, resolved "
                  "| arm − main, dense reward | arm − SFT, resolved | critic explained "
                  "variance at PPO step 1 | PPO clip fraction |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for s, r in results[arm].items():
            if r["vs_main"] is None:
                lines.append(f"| {s} | not finished: no eval/ppo trials in {r['workdir']} "
                             f"or its main run | | | | | | | |")
                continue
            flag = "" if r["same_split"] else " (not the main run's pool: left out of the pool)"
            lines.append(f"| {s}{flag} | {paired(r['vs_main'], 'resolved')['tasks']} | "
                         f"{fmt_rate(r['rates']['main_ppo']['resolved'])} | "
                         f"{fmt_rate(r['rates']['arm_ppo']['resolved'])} | "
                         f"{fmt_diff(paired(r['vs_main'], 'resolved'), 'resolved')} | "
                         f"{fmt_diff(paired(r['vs_main'], 'reward'), 'reward')} | "
                         f"{fmt_diff(paired(r['vs_sft'], 'resolved'), 'resolved')} | "
                         f"{fmt_num(r['ev_start'])} | {fmt_num(r['clip_frac'])} |")
    lines += ["", "pooled: each seed is one stratum (t1jax.report.paired.pooled_over_strata): "
              "the mean of the seeds' means, SE = sqrt(sum of the seeds' SE²) / seeds, and a "
              "bootstrap 95% interval resampling tasks within each seed. Within a seed the arm "
              "and the main run share the split and the evaluation's random numbers."]
    plot = ev_plot({MAIN: list(mains.values()),
                    **{arm: [out / arm / f"seed_{s}" for s in mains] for arm in arms}},
                   out / "ev_curves.png")
    if plot is not None:
        lines += ["", f"![critic explained variance]({plot.name})"]
    data = {"mains": {str(s): str(p) for s, p in mains.items()},
            "arms": {name: {str(s): strip_arm(r) for s, r in per_seed.items()}
                     for name, per_seed in results.items()},
            "pooled": pooled}
    return "\n".join(lines) + "\n", data


def strip_arm(result: dict) -> dict:
    """An (arm, seed) result for summary.json: paired numbers, no per-task differences."""
    out = dict(result)
    for what in ("vs_main", "vs_sft"):
        if out.get(what) is not None:
            out[what] = strip({"test": out[what]})["test"]
    return out


# -- the explained-variance curves ------------------------------------------------------------

def warmup_skipped(workdir: Path) -> bool:
    """The run trained no Warm-Up (warmup.steps <= 0 in its config.json, e.g. cold_critic)."""
    path = workdir / "config.json"
    if not path.is_file():
        return False
    return (json.loads(path.read_text()).get("warmup") or {}).get("steps", 1) <= 0


def ev_curve(workdir: Path) -> dict[int, float]:
    """{x: explained variance}: Warm-Up step k at k - W (W its last step, so 0 ends the
    warm-up) and PPO step k at k, so PPO's steps line up across arms with and without one."""
    warm = [] if warmup_skipped(workdir) else read_jsonl(workdir / "warmup" / "metrics.jsonl")
    ws, wv = series(warm, EV)
    ps, pv = series(read_jsonl(workdir / "ppo" / "metrics.jsonl"), EV)
    last = max(ws, default=0)
    return {**{s - last: v for s, v in zip(ws, wv)}, **dict(zip(ps, pv))}


def band(curves: list[dict[int, float]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """(x, mean, min, max) over the curves at each x any of them has (NaN values skipped)."""
    xs = sorted({x for c in curves for x in c})
    mean, low, high = [], [], []
    for x in xs:
        values = [c[x] for c in curves if x in c and math.isfinite(c[x])]
        mean.append(sum(values) / len(values) if values else math.nan)
        low.append(min(values) if values else math.nan)
        high.append(max(values) if values else math.nan)
    return xs, mean, low, high


def ev_plot(runs: dict[str, list[Path]], path: Path) -> Path | None:
    """OUT/ev_curves.png: per arm, the mean over its seeds and their min-max band; None when
    no run logged an explained variance yet."""
    curves = {name: [c for c in map(ev_curve, wds) if c] for name, wds in runs.items()}
    curves = {name: cs for name, cs in curves.items() if cs}
    if not curves:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(8, 4.5))
    lowest = 0.0
    for name, cs in curves.items():
        xs, mean, low, high = band(cs)
        line, = ax.plot(xs, mean, label=f"{name} ({len(cs)} seed{'s' * (len(cs) > 1)})")
        ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        lowest = min([lowest] + [v for v in low if math.isfinite(v)])
    ax.axvline(0.5, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("step (Critic Warm-Up <= 0 < PPO)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    # a fresh value head can start far below -1 (worse than predicting the mean return) and
    # would flatten every other curve: the axis stops at -1, and says so
    ax.set_ylabel("critic explained variance" + (" (cut at -1)" if lowest < -1 else ""))
    if lowest < -1:
        ax.set_ylim(bottom=-1.05)
    ax.set_title("Critic explained variance: mean over seeds, band min-max")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", required=True, help="comma-separated configs/ablations.py "
                        "variants, e.g. binary_reward,cold_critic,shuffled_reward")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--base", default="runs/recipe_seeds",
                        help="experiments/recipe_seed_sweep.py's OUT: the seeds' main runs")
    parser.add_argument("--existing", action="append", metavar="SEED=WORKDIR",
                        help="the main run of SEED (over --base); repeatable")
    parser.add_argument("--out", default="runs/ablation_seeds")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--summary-only", action="store_true",
                        help="run nothing: summarize the workdirs as they are")
    parser.add_argument("extra", nargs="*", help="more --config.x=y flags, after --")
    args = parser.parse_args(argv)
    from configs.ablations import VARIANTS
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not arms or (unknown := sorted(set(arms) - set(VARIANTS))):
        parser.error(f"--arms: unknown {unknown if arms else 'none given'}; "
                     f"variants: {sorted(VARIANTS)}")
    try:
        existing = parse_existing(args.existing)
    except ValueError as err:
        parser.error(str(err))
    out = Path(args.out).resolve()
    mains = main_workdirs(Path(args.base).resolve(), parse_seeds(args.seeds), existing)
    for seed, wd in mains.items():
        if why := seed_mismatch(wd, seed):
            parser.error(why)
    runs = plan(arms, mains, out, args.extra)
    if args.dry_run:
        for *_, cmd in runs:
            print(shlex.join(cmd))
        return 0
    failed = []
    if not args.summary_only:
        ready = [cmd for _, s, _, cmd in runs if (mains[s] / "sft" / "DONE").is_file()]
        for s in sorted({s for _, s, _, _ in runs if not (mains[s] / "sft" / "DONE").is_file()}):
            print(f"seed {s}: skipped, {mains[s]} has no finished SFT (run "
                  f"experiments/recipe_seed_sweep.py first)", flush=True)
        failed = run_commands(ready)
    text, data = summarize(arms, mains, out)
    write_summary(out, text, data)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
