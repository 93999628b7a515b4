"""t1jax/report/ablation.py without running an arm: the paired statistic against a hand computation,
metrics read back in step order, and the guards that keep a finished arm from being mixed up
with another (the real arms run in tests/report/test_colabs.py)."""

import json
import math

import pytest

from t1jax.report import ablation


def trial(task, attempt, resolved, reward, status="done"):
    return {"task_id": task, "attempt": attempt, "resolved": resolved, "reward": reward,
            "status": status}


def test_paired_by_task_matches_a_hand_computation():
    a = [trial("t1", 0, True, 1.0), trial("t1", 1, False, 0.5), trial("t2", 0, True, 1.0),
         trial("t3", 0, False, 0.25)]
    b = [trial("t1", 0, False, 0.25), trial("t2", 0, False, 0.5), trial("t2", 1, True, 1.0),
         trial("t3", 0, False, 0.5), trial("t4", 0, True, 1.0)]  # t4: only in b, not paired
    # per-task resolved means: a = {t1: .5, t2: 1, t3: 0}, b = {t1: 0, t2: .5, t3: 0}
    mean, se, n = ablation.paired_by_task(a, b, "resolved")
    diffs = [0.5, 0.5, 0.0]
    want = sum(diffs) / 3
    var = sum((d - want) ** 2 for d in diffs) / 2
    assert n == 3 and mean == pytest.approx(want) and se == pytest.approx(math.sqrt(var / 3))
    mean, _, _ = ablation.paired_by_task(a, b, "reward")
    assert mean == pytest.approx(((0.75 - 0.25) + (1.0 - 0.75) + (0.25 - 0.5)) / 3)


def test_paired_by_task_skips_skipped_trials_and_needs_a_common_task():
    a = [trial("t1", 0, True, 1.0), trial("t1", 1, False, 0.0, status="skipped")]
    b = [trial("t1", 0, False, 0.0)]
    assert ablation.paired_by_task(a, b, "resolved") == (1.0, 0.0, 1)
    with pytest.raises(ValueError, match="no task"):
        ablation.paired_by_task(a, [trial("t9", 0, True, 1.0)], "resolved")


def test_stage_metrics_in_step_order_and_a_resumed_step_keeps_its_last_row(tmp_path):
    (tmp_path / "ppo").mkdir()
    rows = [{"step": 1, "x": 1.0}, {"step": 2, "x": 2.0}, {"step": 2, "x": 2.5},
            {"step": 3, "x": None}]
    (tmp_path / "ppo" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows))
    read = ablation.stage_metrics(tmp_path)
    assert [(r["step"], r["x"]) for r in read[:2]] == [(1, 1.0), (2, 2.5)]
    assert read[2]["step"] == 3 and math.isnan(read[2]["x"])  # logged non-finite
    with pytest.raises(FileNotFoundError, match="warmup"):
        ablation.stage_metrics(tmp_path, "warmup")


def finished_base(path, evaluated=False):
    for phase in ablation.BASE_PHASES:
        (path / phase).mkdir(parents=True)
        (path / phase / "DONE").write_text("{}\n")
    if evaluated:
        for label in ("base", "sft"):
            (path / "eval" / label).mkdir(parents=True)
            (path / "eval" / label / "summary.json").write_text("{}\n")
    return path


def test_base_finished_needs_every_phase_and_for_evaluated_arms_the_evaluations(tmp_path):
    base = finished_base(tmp_path / "base")
    assert ablation.base_finished(base) and not ablation.base_finished(base, evaluated=True)
    (base / "sft" / "DONE").unlink()
    assert not ablation.base_finished(base)
    assert ablation.ensure_base(finished_base(tmp_path / "done", evaluated=True),
                                evaluated=True) == 0.0


def test_a_finished_arm_is_read_back_only_with_the_same_settings(tmp_path):
    base = finished_base(tmp_path / "base")
    arm = tmp_path / "arm"
    settings = {"config": "tiny_cpu.py", "base": str(base.resolve()), "seed": 0,
                "ppo_steps": 3, "evaluate": False, "overrides": []}
    (arm / "ppo").mkdir(parents=True)
    (arm / "ppo" / "DONE").write_text("{}\n")
    (arm / "arm.json").write_text(json.dumps(settings))
    assert ablation.run_arm(arm, "tiny_cpu.py", base, ppo_steps=3) == 0.0
    with pytest.raises(ablation.ArmFailed, match="ppo_steps"):
        ablation.run_arm(arm, "tiny_cpu.py", base, ppo_steps=5)
    with pytest.raises(ablation.ArmFailed, match="seed"):
        ablation.run_arm(arm, "tiny_cpu.py", base, seed=1, ppo_steps=3)


def test_an_arm_never_writes_into_a_foreign_workdir_or_from_an_unfinished_base(tmp_path):
    base = finished_base(tmp_path / "base")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me\n")
    with pytest.raises(ablation.ArmFailed, match="not made by run_arm"):
        ablation.run_arm(foreign, "tiny_cpu.py", base, ppo_steps=1)
    assert (foreign / "notes.txt").read_text() == "keep me\n"
    with pytest.raises(ablation.ArmFailed, match="base/SFT evaluations"):
        ablation.run_arm(tmp_path / "new", "tiny_cpu.py", base, ppo_steps=1, evaluate=True)
    assert not (tmp_path / "new").exists()


def test_a_failed_run_reports_its_error_without_progress_bar_noise():
    text = "\x1b[2K\x1b[?25lPPO \x1b[32m0/3\x1b[0m\n\n\x1b[2K\nSandboxError: no engine\n"
    assert ablation._readable(text) == "PPO 0/3\nSandboxError: no engine"


def test_arms_run_the_repositorys_entry_point():
    """ROOT is the repository (a move of this module once pointed it into t1jax/)."""
    assert (ablation.ROOT / "experiments" / "run.py").is_file()
    assert (ablation.ROOT / "configs" / "tiny_cpu.py").is_file()
