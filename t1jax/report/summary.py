"""What a run leaves for people to look at: plots, a Markdown summary and a trajectory viewer.

``write_report(workdir)`` reads what a training run wrote (``sft/``, ``warmup/``, ``ppo/``
metrics and ``eval/<label>/`` results) and writes ``<workdir>/report/``:

- ``plots/*.png``: PPO reward, explained variance (warm-up and PPO), train-inference log-prob gap,
  routing disagreement, turns and sequence length, the SFT loss, and the T1 table (base vs sft vs
  ppo) as a bar chart (t1jax.report.plots);
- ``summary.md``: the headline eval table, per-category and failure-mode tables, the first and
  last values of the training curves, the plots, and what is missing;
- ``trajectories.html``: every eval trial in one self-contained page (t1jax.report.viewer).

A run killed half-way still gets a report of what exists; the summary lists what is missing.

CLI: ``python -m t1jax.report WORKDIR [--out DIR]``.
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import math
import re
from pathlib import Path

from t1jax.metrics_log import format_value as _fmt, read_jsonl, read_metrics
from t1jax.report.plots import series, write_plots
from t1jax.report.viewer import VIEWER_FILE, write_viewer
from t1jax.rollout.eval_summary import excluded, scored

STAGES = ("sft", "warmup", "ppo")
REPORT_DIR = "report"
PLOTS_DIR = "plots"
SUMMARY_FILE = "summary.md"

# Curves summarized (first/last/min/max) per stage in summary.md, when present.
CURVE_KEYS = {
    "sft": ("sft/nll", "sft/token_accuracy"),
    "warmup": ("critic/explained_variance", "critic/value_loss", "critic/returns_mean"),
    "ppo": ("reward/mean", "reward/resolved", "critic/explained_variance", "critic/value_loss",
            "mismatch/logprob_gap", "mismatch/logprob_gap_max", "mismatch/k3_kl",
            "mismatch/routing_disagreement", "rollout/route_drift",
            "rollout/logprobs_full_vocab", "staleness/logprob_gap",
            "staleness/version_lag_mean", "update/kl", "update/logp_delta_pos",
            "update/logp_delta_neg", "policy/entropy", "actor/clip_frac_after_first",
            "actor/clip_frac", "actor/approx_kl", "turns/mean",
            "turns/max", "length/mean", "length/max", "chunks/mean", "chunks/compactions",
            "perf/tokens_per_s"),
}


# --- reading ---------------------------------------------------------------------------------

def label_order(label: str):
    """Sort key for eval labels: base, sft, periodic step_N by N, ppo, then the rest by name."""
    match = re.fullmatch(r"step_(\d+)", label)
    if label == "base":
        return (0, 0, label)
    if label == "sft":
        return (1, 0, label)
    if match:
        return (2, int(match.group(1)), label)
    if label == "ppo":
        return (3, 0, label)
    return (4, 0, label)


def _summary_from_trials(label: str, trials: list[dict]) -> dict:
    """The headline numbers recomputed from trials.jsonl (summary.json is written last, so a
    killed eval has trials but no summary)."""
    finished = [t for t in trials if t.get("status", "done") == "done"]
    done = [t for t in finished if scored(t)]  # infrastructure failures excluded
    def mean(values):
        values = [float(v) for v in values if isinstance(v, (int, float))]
        return sum(values) / len(values) if values else None
    by_category: dict = {}
    for t in done:
        by_category.setdefault(t.get("category") or "-", []).append(t)
    failure_modes: dict = {}
    for t in finished:
        if t.get("failure_mode"):
            failure_modes[t["failure_mode"]] = failure_modes.get(t["failure_mode"], 0) + 1
    return {
        "label": label, "trials": len(done),
        "tasks": len({t.get("task_id") for t in trials}),
        "resolved_rate": mean(bool(t.get("resolved")) for t in done),
        "avg_reward": mean(t.get("reward") for t in done),
        "turns_mean": mean(t.get("turns") for t in done),
        "tokens_mean": mean(t.get("tokens") for t in done),
        "by_category": {c: {"resolved_rate": mean(bool(t.get("resolved")) for t in ts),
                            "avg_reward": mean(t.get("reward") for t in ts), "trials": len(ts)}
                        for c, ts in by_category.items()},
        "failure_modes": failure_modes,
        "skipped": [{"task_id": t.get("task_id"), "reason": t.get("skip_reason")}
                    for t in trials if t.get("status") == "skipped"],
        "excluded": excluded(finished),
        "_from_trials": True,
    }


def load_run(workdir) -> dict:
    """Everything the report reads: ``{"metrics": {stage: rows}, "evals": {label: {"summary",
    "trials"}}, "validation": the same for eval/validation/, "missing": [str]}``."""
    workdir = Path(workdir)
    missing = []
    metrics = {}
    for stage in STAGES:
        rows = read_metrics(workdir / stage)
        metrics[stage] = rows
        if not (workdir / stage / "metrics.jsonl").exists():
            missing.append(f"`{stage}/metrics.jsonl` does not exist (stage not run, or "
                           "run elsewhere)")
        elif not rows:
            missing.append(f"`{stage}/metrics.jsonl` has no rows (stage killed before its "
                           "first step?)")
    eval_root = workdir / "eval"
    evals = _load_evals(eval_root, "eval", missing)
    validation = _load_evals(eval_root / "validation", "eval/validation", missing)
    if not eval_root.is_dir():
        missing.append("`eval/` does not exist: no evaluation results")
    else:
        for label in ("base", "sft", "ppo"):
            if label not in evals:
                missing.append(f"no eval of `{label}` (`eval/{label}/summary.json`)")
    return {"metrics": metrics, "evals": evals, "validation": validation, "missing": missing}


def _load_evals(root: Path, shown: str, missing: list) -> dict:
    """{label: {"summary", "trials"}} of the evaluations under `root` (one folder per label;
    the test split's `eval/` also holds the `validation/` split's folder, which is not a label)."""
    evals = {}
    labels = sorted((p.name for p in root.iterdir() if p.is_dir() and p.name != "validation"),
                    key=label_order) if root.is_dir() else []
    for label in labels:
        summary_path = root / label / "summary.json"
        trials = read_jsonl(root / label / "trials.jsonl")
        summary = None
        if summary_path.exists():
            try:
                summary = json.loads(summary_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                missing.append(f"`{shown}/{label}/summary.json` is not valid JSON ({err}); "
                               "numbers recomputed from trials.jsonl")
        elif trials:
            missing.append(f"`{shown}/{label}/summary.json` is missing (eval killed before the "
                           "end?); numbers recomputed from its trials.jsonl")
        if summary is None and trials:
            summary = _summary_from_trials(label, trials)
        if summary is None:
            missing.append(f"`{shown}/{label}/` has neither summary.json nor trials")
            continue
        if not trials:
            missing.append(f"`{shown}/{label}/trials.jsonl` is missing or empty: no trajectories "
                           "for this label")
        evals[label] = {"summary": summary, "trials": trials}
    return evals


# --- summary.md ------------------------------------------------------------------------------

def _md(text) -> str:
    """A table cell: no pipes or newlines, no HTML."""
    return html.escape(str(text)).replace("|", "\\|").replace("\n", " ")


def _pass_at_k(summary: dict) -> str:
    pass_at = summary.get("pass_at_k") or {}
    if not isinstance(pass_at, dict) or not pass_at:
        return "–"
    items = sorted(pass_at.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0)
    return ", ".join(f"@{k} {_fmt(v, 'pct')}" for k, v in items)


PLOT_TITLES = {
    "eval": "Evaluation per checkpoint", "eval_progress": "Periodic evaluation during PPO",
    "ppo_reward": "PPO reward", "explained_variance": "Critic explained variance",
    "logprob_gap": "Log-prob gap", "routing_disagreement": "Routing disagreement",
    "turns_length": "Turns, sequence length and context chunks", "sft_loss": "SFT loss",
    "update_movement": "How far each PPO step moved the policy",
    "family_reward": "Training reward per task family",
}


def _paired_pairs(evals: dict) -> list[tuple[str, str]]:
    """(before, after) label pairs to compare: SFT over base, every PPO checkpoint over SFT."""
    pairs = [("base", "sft")] if {"base", "sft"} <= set(evals) else []
    if "sft" in evals:
        pairs += [("sft", l) for l in evals if l == "ppo" or re.fullmatch(r"step_\d+", l)]
    return pairs


def _paired_table(evals: dict) -> list[str]:
    """Differences paired by task, with their noise (t1jax.report.paired)."""
    from t1jax.report.paired import paired_difference
    rows = []
    for before, after in _paired_pairs(evals):
        a, b = evals[before]["trials"], evals[after]["trials"]
        res, rew = paired_difference(a, b, "resolved"), paired_difference(a, b, "reward")
        if not res["tasks"]:
            continue
        pts = lambda x: f"{100 * x:+.1f}"  # noqa: E731
        rows.append(f"| {_md(after)} − {_md(before)} | {pts(res['mean'])} pts (SE "
                    f"{100 * res['se']:.1f}; {pts(res['low'])} .. {pts(res['high'])}) | "
                    f"{rew['mean']:+.3f} (SE {rew['se']:.3f}; {rew['low']:+.3f} .. "
                    f"{rew['high']:+.3f}) | {res['tasks']} |")
    if not rows:
        return []
    return ["### Differences, paired by task (mean per-task difference, its standard error, "
            "bootstrap 95% interval over tasks)", "",
            "| comparison | resolved rate | avg dense reward | tasks |", "|---|---|---|---|",
            *rows, ""]


def _eval_table(evals: dict) -> list[str]:
    out = ["| label | resolved rate | avg dense reward | goal progress | pass@k | turns | "
           "tokens | chunks | trials |", "|---|---|---|---|---|---|---|---|---|"]
    for label, data in evals.items():
        s = data["summary"]
        note = " (from trials.jsonl)" if s.get("_from_trials") else ""
        out.append(f"| {_md(label)}{note} | {_fmt(s.get('resolved_rate'), 'pct')} | "
                   f"{_fmt(s.get('avg_reward'))} | {_fmt(s.get('goal_progress'), 'pct')} | "
                   f"{_pass_at_k(s)} | "
                   f"{_fmt(s.get('turns_mean'))} | {_fmt(s.get('tokens_mean'), 'int')} | "
                   f"{_fmt(s.get('chunks_mean', 1.0))} | {_fmt(s.get('trials'), 'int')} |")
    return out + [""]


def _critic_health(workdir: Path, ppo_rows: list[dict]) -> list[str]:
    """Whether Critic Warm-Up ended healthy (its DONE record) and the critic's explained
    variance on PPO's first batch: the number the warm-up exists to make positive."""
    lines = []
    marker = workdir / "warmup" / "DONE"
    info = json.loads(marker.read_text() or "{}") if marker.is_file() else {}
    if "healthy" in info:
        window = info.get("ev_window_mean")
        lines.append(f"- Critic Warm-Up: {info.get('steps')} steps, "
                     + ("healthy" if info["healthy"] else "**reached its cap unhealthy**")
                     + f" (explained variance over its last steps: {_fmt(window)})")
    first = next((r.get("critic/explained_variance") for r in ppo_rows[:1]), None)
    if first is not None:
        lines.append(f"- Critic explained variance at the start of PPO (step 1, before its "
                     f"update): {_fmt(first)}")
    return lines + [""] if lines else []


def write_summary(run: dict, plots: dict, report_dir: Path, workdir: Path) -> Path:
    evals, out = run["evals"], []
    out += [f"# Run report: `{_md(workdir)}`", "",
            f"Generated {datetime.datetime.now().isoformat(timespec='seconds')} by "
            "`python -m t1jax.report`. Trajectories: [trajectories.html](trajectories.html) "
            "(open in a browser; self-contained, filter by label, task and outcome).", ""]
    if run["missing"]:
        out += ["## Missing", ""] + [f"- {m}" for m in run["missing"]] + [""]

    timings = workdir / "timings.jsonl"
    if timings.is_file():  # the recipe's phases (a resumed phase adds a row)
        per_phase: dict = {}
        for row in read_jsonl(timings):
            per_phase[row["phase"]] = per_phase.get(row["phase"], 0.0) + float(row["seconds"])
        out += ["## Wall time", "", "| " + " | ".join(per_phase) + " | total |",
                "|---" * (len(per_phase) + 1) + "|",
                "| " + " | ".join(f"{v / 60:.1f} min" for v in per_phase.values())
                + f" | {sum(per_phase.values()) / 60:.1f} min |", ""]

    validation = run.get("validation") or {}
    out += ["## Evaluation" + (" (test split: held-out tasks that only the final evaluations "
                               "read; settings are chosen on the validation split)"
                               if validation else ""), ""]
    if evals:
        out += _eval_table(evals)
        out += _paired_table(evals)
        for group, title in (("by_category", "Per category"), ("by_difficulty", "Per difficulty")):
            keys = sorted({k for d in evals.values() for k in (d["summary"].get(group) or {})})
            if not keys:
                continue
            out += [f"### {title} (resolved rate / avg dense reward / trials)", "",
                    "| " + group.split("_", 1)[1] + " | " + " | ".join(_md(l) for l in evals)
                    + " |", "|---" * (len(evals) + 1) + "|"]
            for key in keys:
                cells = []
                for data in evals.values():
                    cell = (data["summary"].get(group) or {}).get(key)
                    cells.append("–" if not isinstance(cell, dict) else
                                 f"{_fmt(cell.get('resolved_rate'), 'pct')} / "
                                 f"{_fmt(cell.get('avg_reward'))} / "
                                 f"{_fmt(cell.get('trials'), 'int')}")
                out.append(f"| {_md(key)} | " + " | ".join(cells) + " |")
            out.append("")
        modes = sorted({m for d in evals.values() for m in (d["summary"].get("failure_modes") or {})})
        if modes:
            out += ["### Failure modes (trials)", "",
                    "| failure mode | " + " | ".join(_md(l) for l in evals) + " |",
                    "|---" * (len(evals) + 1) + "|"]
            for mode in modes:
                out.append(f"| {_md(mode)} | " + " | ".join(
                    _fmt((d["summary"].get("failure_modes") or {}).get(mode, 0), "int")
                    for d in evals.values()) + " |")
            out.append("")
        skipped = [(l, s) for l, d in evals.items() for s in (d["summary"].get("skipped") or [])]
        if skipped:
            out += ["### Skipped tasks", ""] + [
                f"- {_md(l)}: `{_md(s.get('task_id'))}`: {_md(s.get('reason'))}"
                for l, s in skipped[:50]]
            if len(skipped) > 50:
                out.append(f"- … and {len(skipped) - 50} more")
            out.append("")
        left_out = [(l, x) for l, d in evals.items() for x in (d["summary"].get("excluded") or [])]
        if left_out:
            out += ["### Excluded trials (infrastructure failures, not in the rates)", ""] + [
                f"- {_md(l)}: `{_md(x.get('task_id'))}` attempt {x.get('attempt')}: "
                f"{_md(str(x.get('why'))[-300:])}" for l, x in left_out[:50]]
            if len(left_out) > 50:
                out.append(f"- … and {len(left_out) - 50} more")
            out.append("")
    else:
        out += ["No evaluation results.", ""]
    if validation:
        out += ["## Validation split (settings are chosen here; PPO's periodic evaluations)", ""]
        out += _eval_table(validation) + _paired_table(validation)
    for name in ("eval", "eval_progress"):
        if name in plots:
            out += [f"![{PLOT_TITLES[name]}]({PLOTS_DIR}/{plots[name].name})", ""]

    out += ["## Training curves", ""] + _critic_health(workdir, run["metrics"]["ppo"])
    for stage in STAGES:
        rows = run["metrics"][stage]
        if not rows:
            out += [f"### {stage}: no metrics", ""]
            continue
        out += [f"### {stage}: {len(rows)} steps (step {rows[0].get('step')} to "
                f"{rows[-1].get('step')})", "", "| metric | first | last | min | max |",
                "|---|---|---|---|---|"]
        for key in CURVE_KEYS[stage]:
            _, values = series(rows, key)
            finite = [v for v in values if not math.isnan(v)]
            if not finite:
                continue
            out.append(f"| {key} | {_fmt(finite[0])} | {_fmt(finite[-1])} | "
                       f"{_fmt(min(finite))} | {_fmt(max(finite))} |")
        out.append("")
    for name, path in plots.items():
        if name not in ("eval", "eval_progress"):
            out += [f"![{PLOT_TITLES.get(name, name)}]({PLOTS_DIR}/{path.name})", ""]
    path = report_dir / SUMMARY_FILE
    path.write_text("\n".join(out), encoding="utf-8")
    return path


# --- entry points ----------------------------------------------------------------------------

def write_report(workdir, out_dir=None) -> Path:
    """Writes ``<workdir>/report/`` (or ``out_dir``): plots, summary.md, trajectories.html.
    Returns the report directory."""
    workdir = Path(workdir)
    if not workdir.is_dir():
        raise FileNotFoundError(f"run directory {workdir} does not exist")
    report_dir = Path(out_dir) if out_dir is not None else workdir / REPORT_DIR
    report_dir.mkdir(parents=True, exist_ok=True)
    run = load_run(workdir)
    plots = write_plots(run, report_dir / PLOTS_DIR)
    write_summary(run, plots, report_dir, workdir)
    write_viewer(run, report_dir, workdir)
    return report_dir


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m t1jax.report", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("workdir", help="the run directory (holds sft/, warmup/, ppo/, eval/)")
    parser.add_argument("--out", default=None, help="report directory (default WORKDIR/report)")
    args = parser.parse_args(argv)
    try:
        report_dir = write_report(args.workdir, args.out)
    except (FileNotFoundError, ValueError) as err:
        parser.exit(1, f"error: {err}\n")
    print(f"report: {report_dir}\n  {report_dir / SUMMARY_FILE}\n  {report_dir / VIEWER_FILE}")


if __name__ == "__main__":
    main()
