"""Two evaluations of one task set compared task by task: the difference, its standard error
and a bootstrap 95% interval.

Why paired: tasks differ far more in difficulty than two checkpoints differ in skill, so the
two rows' own standard errors overstate the noise of their difference. Averaging each task's
attempts first and resampling tasks (not trials) keeps a task's attempts together, as the
report's rows count them. Evaluated with one sampling seed (t1jax.rollout.engine.SeededCalls),
the two policies also meet the same random numbers per attempt, which pairs them further.
"""

from __future__ import annotations

import math

import numpy as np

from t1jax.rollout.eval_summary import scored

RESAMPLES = 10_000


def per_task(trials: list[dict], key: str) -> dict[str, float]:
    """Each task's mean of `key` over its finished attempts ("resolved" counts as 0/1);
    skipped trials and trials without the value are left out."""
    values: dict[str, list[float]] = {}
    for t in trials:
        if (value := trial_value(t, key)) is not None:
            values.setdefault(t["task_id"], []).append(value)
    return {task: float(np.mean(v)) for task, v in values.items()}


def trial_value(trial: dict, key: str) -> float | None:
    """A finished trial's `key` as a number ("resolved" as 0/1); None for a skipped trial, an
    infrastructure failure (eval_summary.NOT_SCORED) or one without the value."""
    if not scored(trial):
        return None
    value = bool(trial.get("resolved")) if key == "resolved" else trial.get(key)
    return float(value) if isinstance(value, (bool, int, float)) else None


def task_differences(before: list[dict], after: list[dict], key: str = "resolved") -> dict:
    """{task: after - before} over the tasks both evaluated, each side its task's mean over
    attempts (per_task), in task order: the sample paired_difference summarizes."""
    a, b = per_task(before, key), per_task(after, key)
    return {t: b[t] - a[t] for t in sorted(set(a) & set(b))}


def paired_difference(before: list[dict], after: list[dict], key: str = "resolved", *,
                      resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """after - before over the tasks both evaluated: {tasks, mean, se, low, high}; se is the
    standard error of the mean per-task difference, [low, high] the percentile bootstrap 95%
    interval over tasks (seeded: the report repeats). NaN where fewer than 2 tasks pair."""
    diffs = np.array(list(task_differences(before, after, key).values()), np.float64)
    if len(diffs) < 2:
        mean = float(diffs.mean()) if len(diffs) else math.nan
        return {"tasks": len(diffs), "mean": mean, "se": math.nan, "low": math.nan,
                "high": math.nan}
    rng = np.random.default_rng(seed)
    boots = diffs[rng.integers(0, len(diffs), (resamples, len(diffs)))].mean(axis=1)
    low, high = np.percentile(boots, [2.5, 97.5])
    return {"tasks": len(diffs), "mean": float(diffs.mean()),
            "se": float(diffs.std(ddof=1) / math.sqrt(len(diffs))),
            "low": float(low), "high": float(high)}


def pooled_over_strata(strata, *, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """Per-task differences from several strata (e.g. recipe seeds, each with its own test
    split) pooled: {strata, tasks, mean, se, low, high, seed_se}.

    Why stratified: runs that draw their own pool evaluate different tasks, so a task has no
    counterpart in another run to average with (ppo_seed_sweep's per-task pooling needs one
    shared split), and one sample of all tasks would weight runs by task count and read the
    splits' differences as task noise. Each stratum is one run's estimate instead: mean = the
    mean of the strata's means (equal weight per run); se = sqrt(sum se_i^2) / n, the standard
    error of that average of independent means; [low, high] = the percentile bootstrap 95%
    interval that resamples tasks within each stratum and averages the strata's means. Both
    measure the evaluation's task noise given these runs' trained policies; seed_se, the
    spread of the strata's means over sqrt(n), also holds the training randomness (with n - 1
    degrees of freedom: rough for 3 seeds). A stratum is a {task: difference} dict or a
    sequence of differences; empty ones are left out (`strata` counts those used); se and the
    interval are NaN unless every stratum has 2+ tasks. With one stratum this is
    paired_difference's result (the same seed draws the same resamples)."""
    strata = [np.asarray(list(s.values()) if isinstance(s, dict) else list(s), np.float64)
              for s in strata]
    strata = [d for d in strata if len(d)]
    n = len(strata)
    nan = math.nan
    if not n:
        return {"strata": 0, "tasks": 0, "mean": nan, "se": nan, "low": nan, "high": nan,
                "seed_se": nan}
    means = np.array([d.mean() for d in strata])
    out = {"strata": n, "tasks": int(sum(len(d) for d in strata)), "mean": float(means.mean()),
           "seed_se": float(means.std(ddof=1) / math.sqrt(n)) if n > 1 else nan}
    if min(len(d) for d in strata) < 2:
        return {**out, "se": nan, "low": nan, "high": nan}
    se = math.sqrt(sum(d.var(ddof=1) / len(d) for d in strata)) / n
    rng = np.random.default_rng(seed)
    boots = np.zeros(resamples)
    for d in strata:
        boots += d[rng.integers(0, len(d), (resamples, len(d)))].mean(axis=1)
    low, high = np.percentile(boots / n, [2.5, 97.5])
    return {**out, "se": float(se), "low": float(low), "high": float(high)}


def variance_components(before: list[dict], after: list[dict], key: str = "resolved") -> dict:
    """The paired difference's noise split in two, for sizing an evaluation: `within`, the
    variance of one attempt's difference around its task's mean (sampling: shrinks with more
    attempts), and `between`, the variance of the tasks' true differences (shrinks only with
    more tasks); a one-way random-effects ANOVA over tasks with the same attempt count.
    Attempts pair by index (one seed gives both policies the same draws per attempt).
    se(tasks, attempts) = sqrt((between + within / attempts) / tasks)."""
    def by_attempt(trials):
        out: dict[str, dict[int, float]] = {}
        for t in trials:
            if (value := trial_value(t, key)) is not None:
                out.setdefault(t["task_id"], {})[int(t.get("attempt", 0))] = value
        return out
    a, b = by_attempt(before), by_attempt(after)
    diffs = [[b[t][i] - a[t][i] for i in sorted(set(a[t]) & set(b[t]))]
             for t in sorted(set(a) & set(b))]
    k = min((len(d) for d in diffs), default=0)
    if len(diffs) < 2 or k < 2:
        raise ValueError(f"need 2+ tasks with 2+ paired attempts each, got {len(diffs)} tasks, "
                         f"{k} attempts")
    d = np.array([row[:k] for row in diffs], np.float64)
    within = float(d.var(axis=1, ddof=1).mean())
    between = float(d.mean(axis=1).var(ddof=1) - within / k)
    return {"tasks": len(d), "attempts": k, "within": within, "between": max(between, 0.0),
            "between_raw": between}


def projected_se(components: dict, tasks: int, attempts: int) -> float:
    """The standard error of the mean per-task difference with `tasks` tasks x `attempts`."""
    return math.sqrt((components["between"] + components["within"] / attempts) / tasks)
