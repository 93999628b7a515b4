"""The report's plots: one PNG per group of training curves, the evaluation per checkpoint as
bars, and the periodic evaluations over PPO steps.

Separate from summary.py, which writes the Markdown around them: matplotlib is imported only
here (and only when a plot is drawn), and each plot is a function of the loaded run alone.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from t1jax.metrics_log import finite_or_none as _num


def series(rows: list[dict], key: str):
    """(steps, values) of one metric, skipping rows without it; None values become NaN."""
    steps, values = [], []
    for row in rows:
        if key in row:
            steps.append(row.get("step", len(steps)))
            value = _num(row[key])
            values.append(math.nan if value is None else value)
    return steps, values


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


def _families(rows: list[dict]) -> list[str]:
    """The task families with per-family metrics (family/<name>/reward) in any row."""
    return sorted({k.split("/")[1] for row in rows for k in row
                   if k.startswith("family/") and k.endswith("/reward")})


def write_plots(run: dict, plots_dir: Path) -> dict[str, Path]:
    """Writes every plot there is data for; returns {name: path}."""
    plots_dir.mkdir(parents=True, exist_ok=True)
    ppo, warm, sft = (run["metrics"][s] for s in ("ppo", "warmup", "sft"))
    S = series
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
        "turns_length": ("PPO rollouts: turns, sequence length and context chunks", [
            ("PPO step", "turns per trial", [("mean", *S(ppo, "turns/mean")),
                                             ("max", *S(ppo, "turns/max"))]),
            ("PPO step", "tokens per trial", [("mean", *S(ppo, "length/mean")),
                                              ("max", *S(ppo, "length/max"))]),
            ("PPO step", "chunks per trial (1 = no compaction)",
             [("mean", *S(ppo, "chunks/mean")), ("max", *S(ppo, "chunks/max"))])]),
        "update_movement": ("PPO: how far each step moved the policy (on its batch)", [
            ("PPO step", "KL(before || after), nats/token", [("update/kl", *S(ppo, "update/kl"))]),
            ("PPO step", "log-prob change of sampled tokens",
             [("advantage > 0", *S(ppo, "update/logp_delta_pos")),
              ("advantage < 0", *S(ppo, "update/logp_delta_neg"))]),
            ("PPO step", "entropy, nats/token", [("policy", *S(ppo, "policy/entropy"))])]),
        "family_reward": ("PPO: training reward per task family", [
            ("PPO step", "mean dense reward",
             [(f, *S(ppo, f"family/{f}/reward")) for f in _families(ppo)])]),
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
    # periodic evaluations are on the validation split (older runs: the held-out one)
    periodic = run.get("validation") or {}
    if not any(re.fullmatch(r"step_\d+", label) for label in periodic):
        periodic = run["evals"]
    for name, fn, evals in (("eval", _eval_bar_plot, run["evals"]),
                            ("eval_progress", _eval_progress_plot, periodic)):
        path = fn(plots_dir / f"{name}.png", evals)
        if path:
            written[name] = path
    return written
