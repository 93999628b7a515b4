"""The arithmetic behind the reliability claims, on written trials.jsonl files checked against
hand-computed values (no training: the runs are the main job's): experiments/probes/ppo_seed_sweep.py's
per-seed and pooled PPO - SFT, and the noise split of t1jax.report.paired.variance_components
with experiments/probes/se_budget.py's pooling of evaluation draws."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
from experiments.probes import ppo_seed_sweep  # noqa: E402

SFT = {"t1": [1, 0], "t2": [0, 0], "t3": [1, 1]}


def write_run(workdir: Path, label: str, resolved: dict[str, list[int]]) -> None:
    folder = workdir / "eval" / label
    folder.mkdir(parents=True)
    with open(folder / "trials.jsonl", "w") as f:
        for task, attempts in resolved.items():
            for a, r in enumerate(attempts):
                f.write(json.dumps({"task_id": task, "attempt": a, "status": "done",
                                    "resolved": bool(r), "reward": 0.25 + 0.75 * r}) + "\n")


def sweep(tmp_path, ppo_by_seed: dict[int, dict]) -> dict[int, Path]:
    workdirs = {}
    for seed, ppo in ppo_by_seed.items():
        workdirs[seed] = tmp_path / f"seed_{seed}"
        write_run(workdirs[seed], "sft", SFT)
        write_run(workdirs[seed], "ppo", ppo)
    return workdirs


def test_each_seed_and_the_pool_are_the_per_task_differences(tmp_path):
    workdirs = sweep(tmp_path, {1: {"t1": [1, 1], "t2": [1, 0], "t3": [1, 1]},   # +.5 +.5 0
                                2: {"t1": [0, 0], "t2": [1, 1], "t3": [1, 0]}})  # -.5 +1 -.5
    results = ppo_seed_sweep.gains(workdirs, "resolved")
    assert results[1]["mean"] == pytest.approx(1 / 3) and results[1]["tasks"] == 3
    assert results[2]["mean"] == pytest.approx(0.0)
    pooled = np.array([0.0, 0.75, -0.25])  # t1, t2, t3 averaged over the two seeds
    assert results["pooled"]["mean"] == pytest.approx(pooled.mean())
    assert results["pooled"]["se"] == pytest.approx(pooled.std(ddof=1) / math.sqrt(3))
    assert results["pooled"]["low"] <= pooled.mean() <= results["pooled"]["high"]
    table = ppo_seed_sweep.table(results, "resolved")
    assert "| 1 | +33.3 pts |" in table and "| pooled | +16.7 pts |" in table
    dense = ppo_seed_sweep.gains(workdirs, "reward")  # reward = 0.25 + 0.75 resolved
    assert dense["pooled"]["mean"] == pytest.approx(0.75 * pooled.mean())


def test_the_pool_keeps_only_tasks_every_seed_evaluated(tmp_path):
    workdirs = sweep(tmp_path, {1: {"t1": [1, 1], "t2": [1, 0], "t3": [1, 1]},
                                2: {"t1": [0, 0], "t2": [1, 1]}})  # t3 missing
    results = ppo_seed_sweep.gains(workdirs, "resolved")
    assert results[2]["tasks"] == 2 and results["pooled"]["tasks"] == 2
    assert results["pooled"]["mean"] == pytest.approx(np.mean([0.0, 0.75]))


def trials(resolved: dict[str, list[int]]) -> list[dict]:
    return [{"task_id": t, "attempt": a, "status": "done", "resolved": bool(r)}
            for t, attempts in resolved.items() for a, r in enumerate(attempts)]


def test_variance_components_split_the_paired_noise():
    from t1jax.report.paired import paired_difference, projected_se, variance_components
    before = trials({"t1": [0, 0], "t2": [0, 0], "t3": [0, 0]})
    after = trials({"t1": [1, 1], "t2": [0, 0], "t3": [1, 0]})
    c = variance_components(before, after)
    # differences per attempt: t1 (1, 1), t2 (0, 0), t3 (1, 0): within-task variance 1/6 on
    # average; the task means 1, 0, 1/2 vary by 1/4, of which 1/12 is the attempts' noise
    assert (c["tasks"], c["attempts"]) == (3, 2)
    assert c["within"] == pytest.approx(1 / 6) and c["between"] == pytest.approx(1 / 6)
    # at the design it was measured on, the projection is the paired difference's own SE
    assert projected_se(c, 3, 2) == pytest.approx(paired_difference(before, after)["se"])
    assert projected_se(c, 12, 8) < projected_se(c, 3, 2)
    with pytest.raises(ValueError, match="2\\+ paired attempts"):
        variance_components(trials({"t1": [0], "t2": [1]}), trials({"t1": [1], "t2": [1]}))


def test_se_budget_pools_the_attempts_of_other_evaluation_draws(tmp_path):
    from experiments.probes import se_budget
    runs = [tmp_path / "draw_a", tmp_path / "draw_b"]
    for run, ppo in zip(runs, ({"t1": [1, 0], "t2": [0, 0]}, {"t1": [1, 1], "t2": [1, 0]})):
        write_run(run, "sft", {"t1": [0, 0], "t2": [0, 0]})
        write_run(run, "ppo", ppo)
    pooled = se_budget.pooled_trials(runs, "ppo")
    assert sorted((r["task_id"], r["attempt"], r["resolved"]) for r in pooled) == [
        ("t1", 0, True), ("t1", 1, False), ("t1", 2, True), ("t1", 3, True),
        ("t2", 0, False), ("t2", 1, False), ("t2", 2, True), ("t2", 3, False)]
