"""experiments/ppo_seed_sweep.py's arithmetic: per-seed PPO - SFT paired by task, and the pooled
difference (each task's difference averaged over the seeds), checked against hand-computed
values on written trials.jsonl files (no training: the sweep's runs are the main job's)."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))

import ppo_seed_sweep  # noqa: E402

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
