"""What a run leaves for people to look at: plots, a Markdown summary and a trajectory viewer.

``write_report(workdir)`` reads what a training run wrote (``sft/``, ``warmup/``, ``ppo/``
metrics and ``eval/<label>/`` results) and writes ``<workdir>/report/``:

- ``plots/*.png``: PPO reward, explained variance (warm-up and PPO), train-inference log-prob gap,
  routing disagreement, turns and sequence length, the SFT loss, and the T1 table (base vs sft vs
  ppo) as a bar chart;
- ``summary.md``: the headline eval table, per-category and failure-mode tables, the first and
  last values of the training curves, the plots, and what is missing;
- ``trajectories.html``: one self-contained page (no network) with every eval trial: instruction,
  the conversation turn by turn with the trained (loss-masked) tokens highlighted, the commands
  and their shell output, and the verifier's per-assertion results.

A run killed half-way still gets a report of what exists; the summary lists what is missing.
Model output is untrusted: every string goes through ``html.escape`` and the page's only script
is ours (filters), which never turns data into markup.

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

from t1jax.metrics_log import read_jsonl, read_metrics

STAGES = ("sft", "warmup", "ppo")
REPORT_DIR = "report"
PLOTS_DIR = "plots"
VIEWER_FILE = "trajectories.html"
SUMMARY_FILE = "summary.md"

# Curves summarized (first/last/min/max) per stage in summary.md, when present.
CURVE_KEYS = {
    "sft": ("sft/nll", "sft/token_accuracy"),
    "warmup": ("critic/explained_variance", "critic/value_loss", "critic/returns_mean"),
    "ppo": ("reward/mean", "reward/resolved", "critic/explained_variance", "critic/value_loss",
            "mismatch/logprob_gap", "mismatch/logprob_gap_max", "mismatch/k3_kl",
            "mismatch/routing_disagreement", "actor/clip_frac", "actor/approx_kl", "turns/mean",
            "turns/max", "length/mean", "length/max", "perf/tokens_per_s"),
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
    done = [t for t in trials if t.get("status", "done") == "done"]
    def mean(values):
        values = [float(v) for v in values if isinstance(v, (int, float))]
        return sum(values) / len(values) if values else None
    by_category: dict = {}
    for t in done:
        by_category.setdefault(t.get("category") or "-", []).append(t)
    failure_modes: dict = {}
    for t in done:
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
        "_from_trials": True,
    }


def load_run(workdir) -> dict:
    """Everything the report reads: ``{"metrics": {stage: rows}, "evals": {label: {"summary",
    "trials"}}, "missing": [str]}``."""
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
    evals = {}
    eval_root = workdir / "eval"
    labels = sorted((p.name for p in eval_root.iterdir() if p.is_dir()),
                    key=label_order) if eval_root.is_dir() else []
    for label in labels:
        summary_path = eval_root / label / "summary.json"
        trials = read_jsonl(eval_root / label / "trials.jsonl")
        summary = None
        if summary_path.exists():
            try:
                summary = json.loads(summary_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                missing.append(f"`eval/{label}/summary.json` is not valid JSON ({err}); "
                               "numbers recomputed from trials.jsonl")
        elif trials:
            missing.append(f"`eval/{label}/summary.json` is missing (eval killed before the "
                           "end?); numbers recomputed from its trials.jsonl")
        if summary is None and trials:
            summary = _summary_from_trials(label, trials)
        if summary is None:
            missing.append(f"`eval/{label}/` has neither summary.json nor trials")
            continue
        if not trials:
            missing.append(f"`eval/{label}/trials.jsonl` is missing or empty: no trajectories "
                           "for this label")
        evals[label] = {"summary": summary, "trials": trials}
    if not eval_root.is_dir():
        missing.append("`eval/` does not exist: no evaluation results")
    else:
        for label in ("base", "sft", "ppo"):
            if label not in evals:
                missing.append(f"no eval of `{label}` (`eval/{label}/summary.json`)")
    return {"metrics": metrics, "evals": evals, "missing": missing}


# --- numbers ---------------------------------------------------------------------------------

def _num(value):
    """A finite float, or None (metrics write non-finite values as null)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def _series(rows: list[dict], key: str):
    """(steps, values) of one metric, skipping rows without it; None values become NaN."""
    steps, values = [], []
    for row in rows:
        if key in row:
            steps.append(row.get("step", len(steps)))
            value = _num(row[key])
            values.append(math.nan if value is None else value)
    return steps, values


def _fmt(value, kind: str = "num") -> str:
    value = _num(value)
    if value is None:
        return "–"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "int":
        return f"{value:,.0f}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


# --- plots -----------------------------------------------------------------------------------

def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _line_plot(path: Path, title: str, panels: list[tuple[str, str, list[tuple]]]) -> Path | None:
    """One figure of side-by-side panels; each panel is (x label, y label, [(label, x, y)])."""
    panels = [(xl, yl, [c for c in curves if c[1]]) for xl, yl, curves in panels]
    panels = [p for p in panels if p[2]]
    if not panels:
        return None
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.6), squeeze=False)
    for ax, (xlabel, ylabel, curves) in zip(axes[0], panels):
        for label, xs, ys in curves:
            ax.plot(xs, ys, marker="o" if len(xs) <= 30 else None, markersize=3, label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if len(curves) > 1:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _eval_bar_plot(path: Path, evals: dict) -> Path | None:
    labels = [label for label in evals if not re.fullmatch(r"step_\d+", label)] or list(evals)
    if not labels:
        return None
    plt = _pyplot()
    resolved = [_num(evals[l]["summary"].get("resolved_rate")) or 0.0 for l in labels]
    reward = [_num(evals[l]["summary"].get("avg_reward")) or 0.0 for l in labels]
    fig, axes = plt.subplots(1, 2, figsize=(max(7.0, 1.6 * len(labels) * 2), 3.6))
    for ax, values, name, color in ((axes[0], resolved, "resolved rate", "#3b7dd8"),
                                    (axes[1], reward, "average dense reward", "#e08a2c")):
        bars = ax.bar(labels, values, color=color)
        for bar, value in zip(bars, values):
            ax.annotate(f"{value:.3g}", (bar.get_x() + bar.get_width() / 2, value),
                        ha="center", va="bottom", fontsize=8)
        ax.set_title(name)
        ax.set_xlabel("checkpoint")
        ax.set_ylabel(name)
        top = max(values + [0.0])
        ax.set_ylim(0, 1.0 if name == "resolved rate" and top <= 1.0 else top * 1.15 + 1e-9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Evaluation per checkpoint (the T1 table)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _eval_progress_plot(path: Path, evals: dict) -> Path | None:
    """Periodic evals (step_N labels) over PPO steps."""
    points = sorted((int(m.group(1)), evals[l]["summary"]) for l in evals
                    if (m := re.fullmatch(r"step_(\d+)", l)))
    if len(points) < 1:
        return None
    steps = [s for s, _ in points]
    return _line_plot(path, "Periodic evaluation during PPO", [
        ("PPO step", "value", [
            ("resolved rate", steps, [_num(s.get("resolved_rate")) for _, s in points]),
            ("avg dense reward", steps, [_num(s.get("avg_reward")) for _, s in points])])])


def write_plots(run: dict, plots_dir: Path) -> dict[str, Path]:
    """Writes every plot there is data for; returns {name: path}."""
    plots_dir.mkdir(parents=True, exist_ok=True)
    ppo, warm, sft = (run["metrics"][s] for s in ("ppo", "warmup", "sft"))
    S = _series
    specs = {
        "ppo_reward": ("PPO: reward per step", [
            ("PPO step", "reward", [("mean dense reward", *S(ppo, "reward/mean"))]),
            ("PPO step", "fraction resolved", [("resolved", *S(ppo, "reward/resolved"))])]),
        "explained_variance": ("Critic explained variance", [
            ("warm-up step", "explained variance",
             [("critic warm-up", *S(warm, "critic/explained_variance"))]),
            ("PPO step", "explained variance",
             [("PPO", *S(ppo, "critic/explained_variance"))])]),
        "logprob_gap": ("Train-inference log-prob gap |logp_train - logp_rollout|", [
            ("PPO step", "log-prob gap", [("mean", *S(ppo, "mismatch/logprob_gap"))]),
            ("PPO step", "log-prob gap", [("max", *S(ppo, "mismatch/logprob_gap_max"))])]),
        "routing_disagreement": ("R3: routing disagreement (train vs rollout experts)", [
            ("PPO step", "fraction of (token, layer) pairs",
             [("disagreement", *S(ppo, "mismatch/routing_disagreement"))])]),
        "turns_length": ("PPO rollouts: turns and sequence length", [
            ("PPO step", "turns per trial", [("mean", *S(ppo, "turns/mean")),
                                             ("max", *S(ppo, "turns/max"))]),
            ("PPO step", "tokens per trial", [("mean", *S(ppo, "length/mean")),
                                              ("max", *S(ppo, "length/max"))])]),
        "sft_loss": ("SFT loss", [
            ("SFT step", "NLL per trained token", [("sft/nll", *S(sft, "sft/nll"))]),
            ("SFT step", "token accuracy",
             [("sft/token_accuracy", *S(sft, "sft/token_accuracy"))])]),
    }
    written = {}
    for name, (title, panels) in specs.items():
        path = _line_plot(plots_dir / f"{name}.png", title, panels)
        if path:
            written[name] = path
    for name, fn in (("eval", _eval_bar_plot), ("eval_progress", _eval_progress_plot)):
        path = fn(plots_dir / f"{name}.png", run["evals"])
        if path:
            written[name] = path
    return written


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
    "turns_length": "Turns and sequence length", "sft_loss": "SFT loss",
}


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

    out += ["## Evaluation", ""]
    if evals:
        out += ["| label | resolved rate | avg dense reward | goal progress | pass@k | turns | "
                "tokens | trials |", "|---|---|---|---|---|---|---|---|"]
        for label, data in evals.items():
            s = data["summary"]
            note = " (from trials.jsonl)" if s.get("_from_trials") else ""
            out.append(f"| {_md(label)}{note} | {_fmt(s.get('resolved_rate'), 'pct')} | "
                       f"{_fmt(s.get('avg_reward'))} | {_fmt(s.get('goal_progress'), 'pct')} | "
                       f"{_pass_at_k(s)} | "
                       f"{_fmt(s.get('turns_mean'))} | {_fmt(s.get('tokens_mean'), 'int')} | "
                       f"{_fmt(s.get('trials'), 'int')} |")
        out.append("")
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
    else:
        out += ["No evaluation results.", ""]
    for name in ("eval", "eval_progress"):
        if name in plots:
            out += [f"![{PLOT_TITLES[name]}]({PLOTS_DIR}/{plots[name].name})", ""]

    out += ["## Training curves", ""]
    for stage in STAGES:
        rows = run["metrics"][stage]
        if not rows:
            out += [f"### {stage}: no metrics", ""]
            continue
        out += [f"### {stage}: {len(rows)} steps (step {rows[0].get('step')} to "
                f"{rows[-1].get('step')})", "", "| metric | first | last | min | max |",
                "|---|---|---|---|---|"]
        for key in CURVE_KEYS[stage]:
            _, values = _series(rows, key)
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


# --- trajectories.html -----------------------------------------------------------------------

def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d232a;background:#f4f6f8}
header{position:sticky;top:0;z-index:2;background:#fff;border-bottom:1px solid #d5dbe1;padding:10px 16px}
h1{font-size:18px;margin:0 0 6px}
.controls{display:flex;flex-wrap:wrap;gap:10px;align-items:center}
.controls label{font-size:13px;color:#4a5560}
select,input{font:inherit;padding:3px 6px;border:1px solid #b9c2cb;border-radius:4px}
button{font:inherit;padding:3px 10px;border:1px solid #b9c2cb;border-radius:4px;background:#f7f9fa;cursor:pointer}
.legend{display:flex;gap:14px;font-size:12px;color:#4a5560;margin-top:6px;flex-wrap:wrap}
.legend span.sw{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:-2px;margin-right:4px}
main{padding:12px 16px}
details.trial{scroll-margin-top:130px;background:#fff;border:1px solid #d5dbe1;border-radius:6px;margin:0 0 8px}
details.trial>summary{cursor:pointer;padding:7px 10px;display:flex;gap:10px;align-items:center;flex-wrap:wrap;list-style:none}
details.trial>summary::-webkit-details-marker{display:none}
details.trial[open]>summary{border-bottom:1px solid #e3e7eb}
.badge{font-size:12px;padding:1px 8px;border-radius:10px;font-weight:600}
.b-resolved{background:#d9f2df;color:#17692b}.b-unresolved{background:#fbe0df;color:#9b1c1c}.b-skipped{background:#e7e9ec;color:#555}
.lbl{font-weight:600;color:#2a5db0}.task{font-family:ui-monospace,Menlo,Consolas,monospace}
.meta{color:#5a6670;font-size:12px}
.body{padding:8px 12px 12px}
h3{font-size:14px;margin:12px 0 6px}
pre{white-space:pre-wrap;word-break:break-word;font:12px/1.4 ui-monospace,Menlo,Consolas,monospace;margin:0}
.instr{background:#f7f9fa;border:1px solid #e3e7eb;border-radius:4px;padding:8px;max-height:240px;overflow:auto}
.seg{border-radius:4px;padding:6px 8px;margin:4px 0;max-height:420px;overflow:auto}
.seg .who{font-size:11px;font-weight:700;text-transform:uppercase;letter-spacing:.04em;margin-bottom:3px}
.seg.trained{background:#e4f4e8;border-left:4px solid #2f9e4f}
.seg.context{background:#f1f2f4;border-left:4px solid #aab3bc;color:#39424b}
.cmd{background:#1f2428;color:#e6edf3;border-radius:4px;padding:6px 8px;margin:4px 0 4px 18px}
.cmd .c{color:#7ee787}.cmd .x{color:#8b949e;font-size:11px}.cmd .o{color:#c9d1d9;max-height:260px;overflow:auto;margin-top:4px}
.cmd.bad .x{color:#ff7b72}
table.asserts{border-collapse:collapse;width:100%;font-size:12px}
table.asserts td,table.asserts th{border:1px solid #e3e7eb;padding:3px 6px;text-align:left;vertical-align:top}
tr.pass td.st{background:#d9f2df;color:#17692b;font-weight:600}
tr.fail td.st{background:#fbe0df;color:#9b1c1c;font-weight:600}
tr.other td.st{background:#eee;color:#555}
.reward{font-weight:600}
.hidden{display:none}
#count{font-size:13px;color:#4a5560}
"""

_JS = """
(function(){
  var trials = Array.prototype.slice.call(document.querySelectorAll('details.trial'));
  var fl = document.getElementById('f-label'), ft = document.getElementById('f-task'),
      fo = document.getElementById('f-outcome'), count = document.getElementById('count');
  function apply(){
    var l = fl.value, t = ft.value.trim().toLowerCase(), o = fo.value, shown = 0;
    for (var i = 0; i < trials.length; i++) {
      var d = trials[i].dataset;
      var ok = (!l || d.label === l) && (!t || d.task.toLowerCase().indexOf(t) >= 0) &&
               (!o || d.outcome === o);
      trials[i].classList.toggle('hidden', !ok);
      if (ok) shown++;
    }
    count.textContent = 'showing ' + shown + ' of ' + trials.length + ' trials';
  }
  fl.addEventListener('change', apply); fo.addEventListener('change', apply);
  ft.addEventListener('input', apply);
  document.getElementById('expand').addEventListener('click', function(){
    trials.forEach(function(x){ if (!x.classList.contains('hidden')) x.open = true; }); });
  document.getElementById('collapse').addEventListener('click', function(){
    trials.forEach(function(x){ x.open = false; }); });
  var query = new URLSearchParams(location.search);  // ?label=ppo&task=csv&outcome=resolved
  if (query.has('label')) fl.value = query.get('label');
  if (query.has('task')) ft.value = query.get('task');
  if (query.has('outcome')) fo.value = query.get('outcome');
  if (location.hash) { var el = document.getElementById(location.hash.slice(1));
    if (el && el.tagName === 'DETAILS') { el.open = true; el.scrollIntoView(); } }
  apply();
  var visible = trials.filter(function(x){ return !x.classList.contains('hidden'); });
  if (visible.length && !visible.some(function(x){ return x.open; })) visible[0].open = true;
  document.body.setAttribute('data-viewer-ready', '1');
  console.log('t1jax viewer ready: ' + trials.length + ' trials');
})();
"""


def _outcome(trial: dict) -> str:
    if trial.get("status") == "skipped":
        return "skipped"
    return "resolved" if trial.get("resolved") else "unresolved"


def _assertion_class(status) -> str:
    status = str(status or "").lower()
    if status in ("passed", "pass", "ok", "success"):
        return "pass"
    if status in ("failed", "fail", "error", "errored", "timeout"):
        return "fail"
    return "other"


def _command_html(cmd: dict) -> str:
    code, timed_out = cmd.get("exit_code"), bool(cmd.get("timed_out"))
    status = "timed out" if timed_out else ("exit code ?" if code is None else f"exit code {code}")
    bad = timed_out or (code not in (0, None))
    return (f'<div class="cmd{" bad" if bad else ""}"><pre class="c">$ {_e(cmd.get("command"))}'
            f'</pre><div class="x">{_e(status)}</div>'
            + (f'<pre class="o">{_e(cmd.get("output"))}</pre>' if cmd.get("output") else "")
            + "</div>")


def _conversation_html(trial: dict) -> str:
    """The token sequence turn by turn: context (loss mask 0) and model replies (trained), each
    model reply followed by the commands it ran. ``commands[*].turn`` counts model replies from 0
    (from 1 if the largest turn would otherwise run past the replies)."""
    segments = trial.get("segments") or []
    commands = trial.get("commands") or []
    n_trained = sum(1 for s in segments if s.get("trained"))
    turns = [c.get("turn") for c in commands if isinstance(c.get("turn"), int)]
    offset = 1 if turns and min(turns) >= 1 and max(turns) >= n_trained else 0
    by_turn: dict = {}
    unplaced = []
    for cmd in commands:
        turn = cmd.get("turn")
        if isinstance(turn, int) and 0 <= turn - offset < n_trained:
            by_turn.setdefault(turn - offset, []).append(cmd)
        else:
            unplaced.append(cmd)
    parts, reply, first_context = [], 0, True
    for seg in segments:
        text = seg.get("text", "")
        if seg.get("trained"):
            parts.append(f'<div class="seg trained"><div class="who">model · turn '
                         f'{reply + offset} · trained</div><pre>{_e(text)}</pre></div>')
            parts += [_command_html(c) for c in by_turn.get(reply, [])]
            reply += 1
        else:
            who = "prompt" if first_context else "observation / template"
            first_context = False
            parts.append(f'<div class="seg context"><div class="who">{who} · not trained</div>'
                         f'<pre>{_e(text)}</pre></div>')
    if unplaced:
        parts.append('<h3>Commands not matched to a model turn</h3>')
        parts += [_command_html(c) for c in unplaced]
    if not segments and not commands:
        parts.append('<p class="meta">No conversation recorded.</p>')
    return "".join(parts)


def _trial_html(index: int, trial: dict, open_: bool) -> str:
    outcome = _outcome(trial)
    reward = _num(trial.get("reward"))
    passed, total = trial.get("passed"), trial.get("total")
    head = (f'<span class="badge b-{outcome}">{outcome}</span>'
            f'<span class="lbl">{_e(trial.get("label"))}</span>'
            f'<span class="task">{_e(trial.get("task_id"))}</span>'
            f'<span class="meta">attempt {_e(trial.get("attempt"))}</span>'
            f'<span class="reward">reward {_e(_fmt(reward))}</span>'
            f'<span class="meta">{_e(passed)}/{_e(total)} assertions · {_e(trial.get("turns"))} '
            f'turns · {_e(trial.get("tool_calls"))} tool calls · {_e(trial.get("tokens"))} tokens'
            + (f' · {_e(trial.get("failure_mode"))}'
               if trial.get("failure_mode") not in (None, "", "resolved") else "")
            + "</span>")
    meta = " · ".join(f"{k}: {_e(trial.get(k))}" for k in
                      ("category", "difficulty", "harness", "finish", "sampled_tokens",
                       "duration_s") if trial.get(k) is not None)
    body = [f'<div class="meta">{meta}</div>']
    if trial.get("status") == "skipped":
        body.append(f'<h3>Skipped</h3><pre>{_e(trial.get("skip_reason"))}</pre>')
    body.append(f'<h3>Instruction</h3><pre class="instr">{_e(trial.get("instruction"))}</pre>')
    body.append(f'<h3>Conversation</h3>{_conversation_html(trial)}')
    assertions = trial.get("assertions") or []
    body.append(f'<h3>Verifier: {_e(passed)}/{_e(total)} passed, reward '
                f'{_e(_fmt(reward))}, {"resolved" if trial.get("resolved") else "not resolved"}'
                '</h3>')
    if assertions:
        rows = "".join(f'<tr class="{_assertion_class(a.get("status"))}"><td class="st">'
                       f'{_e(a.get("status"))}</td><td>{_e(a.get("name"))}</td>'
                       f'<td><pre>{_e(a.get("message"))}</pre></td></tr>' for a in assertions)
        body.append('<table class="asserts"><thead><tr><th>status</th><th>assertion</th>'
                    f'<th>message</th></tr></thead><tbody>{rows}</tbody></table>')
    else:
        body.append('<p class="meta">No per-assertion results.</p>')
    if trial.get("verifier_log"):
        body.append('<details><summary>verifier log</summary>'
                    f'<pre class="instr">{_e(trial.get("verifier_log"))}</pre></details>')
    return (f'<details class="trial" id="trial-{index}" data-label="{_e(trial.get("label"))}" '
            f'data-task="{_e(trial.get("task_id"))}" data-outcome="{outcome}"'
            f'{" open" if open_ else ""}><summary>{head}</summary>'
            f'<div class="body">{"".join(body)}</div></details>')


def write_viewer(run: dict, report_dir: Path, workdir: Path) -> Path:
    """``trajectories.html``: every trial of every eval label, self-contained."""
    trials = [dict(t, label=t.get("label") or label)
              for label, data in run["evals"].items() for t in data["trials"]]
    labels = list(run["evals"])
    label_options = "".join(f'<option value="{_e(l)}">{_e(l)} '
                            f'({len(run["evals"][l]["trials"])})</option>' for l in labels)
    items = "".join(_trial_html(i, t, open_=(i == 0)) for i, t in enumerate(trials))
    if not trials:
        items = '<p class="meta">No trials: no eval/&lt;label&gt;/trials.jsonl in this run.</p>'
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>Trajectories: {_e(workdir.name)}</title><style>{_CSS}</style></head>
<body><header><h1>Trajectories · {_e(workdir)}</h1>
<div class="controls">
<label>label <select id="f-label"><option value="">all</option>{label_options}</select></label>
<label>task <input id="f-task" type="search" placeholder="task id contains…"></label>
<label>outcome <select id="f-outcome"><option value="">all</option>
<option value="resolved">resolved</option><option value="unresolved">unresolved</option>
<option value="skipped">skipped</option></select></label>
<button id="expand" type="button">expand all</button>
<button id="collapse" type="button">collapse all</button>
<span id="count">{len(trials)} trials</span></div>
<div class="legend"><span><span class="sw" style="background:#e4f4e8;border:1px solid #2f9e4f"></span>trained tokens (loss mask 1: the model's sampled reply)</span>
<span><span class="sw" style="background:#f1f2f4;border:1px solid #aab3bc"></span>not trained (loss mask 0: prompt, observations, template)</span>
<span><span class="sw" style="background:#1f2428"></span>command run in the sandbox and its output</span>
<span><span class="sw" style="background:#d9f2df"></span>assertion passed</span>
<span><span class="sw" style="background:#fbe0df"></span>assertion failed</span></div>
</header><main>{items}</main><script>{_JS}</script></body></html>
"""
    path = report_dir / VIEWER_FILE
    path.write_text(page, encoding="utf-8")
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
