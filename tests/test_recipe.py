"""The main job end to end at toy size (real sandboxes, engine, verifier, trainer): every phase
runs, base / SFT / PPO are evaluated on the held-out split, the report is written, and running
the command again resumes instead of redoing finished phases."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOY = ["--config.pool.families=write,mkdir", "--config.pool.train_per_family=3",
       "--config.pool.heldout_per_family=2", "--config.sft.steps=3", "--config.warmup.steps=1",
       "--config.ppo.steps=1", "--config.eval.attempts=1", "--config.rollouts.batch_size=2"]

pytestmark = pytest.mark.slow


def run(workdir, config="tiny_cpu.py", *extra):
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), "--config",
                           str(ROOT / "configs" / config), "--workdir", str(workdir),
                           *TOY, *extra], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def test_recipe_runs_every_phase_and_resumes(docker_backend, tmp_path):
    run(tmp_path)
    split = json.loads((tmp_path / "pool" / "split.json").read_text())
    assert not set(split["train"]) & set(split["heldout"])
    assert json.loads((tmp_path / "oracle" / "DONE").read_text())["pool_healthy"]
    for stage in ("sft", "warmup", "ppo"):
        assert (tmp_path / stage / "DONE").is_file()
        assert (tmp_path / stage / "metrics.jsonl").read_text().strip()
    for label in ("base", "sft", "ppo"):
        summary = json.loads((tmp_path / "eval" / label / "summary.json").read_text())
        assert summary["trials"] == len(split["heldout"]), label
    report = (tmp_path / "report" / "summary.md").read_text()
    assert "base" in report and "ppo" in report
    assert (tmp_path / "report" / "trajectories.html").is_file()

    timed = [json.loads(line)["phase"] for line in
             (tmp_path / "timings.jsonl").read_text().splitlines()]
    assert timed == ["pool", "oracle", "sft", "warmup", "ppo", "eval"]
    assert "## Wall time" in report

    mtime = (tmp_path / "ppo" / "metrics.jsonl").stat().st_mtime
    again = run(tmp_path)
    assert (tmp_path / "ppo" / "metrics.jsonl").stat().st_mtime == mtime  # nothing retrained
    assert "ppo" in again.stdout
    assert len((tmp_path / "timings.jsonl").read_text().splitlines()) == len(timed)

    # an ablation reuses everything before PPO and trains PPO on the binary outcome
    ablation = tmp_path.parent / (tmp_path.name + "-binary")
    run(ablation, "ablations.py:binary_reward", f"--config.reuse={tmp_path}")
    for name in ("pool", "oracle", "sft", "warmup", "eval/base", "eval/sft"):
        assert (ablation / name).is_symlink(), name
    assert not (ablation / "ppo").is_symlink() and (ablation / "ppo" / "DONE").is_file()
    assert (ablation / "eval" / "ppo" / "summary.json").is_file()
    assert json.loads((ablation / "config.json").read_text())["rl"]["reward"] == "binary"
    for line in (ablation / "ppo" / "metrics.jsonl").read_text().splitlines():
        assert json.loads(line)["reward/trained_mean"] in (0.0, 0.5, 1.0)  # 2 trials, 0 or 1
    ablation_timed = [json.loads(line)["phase"] for line in
                      (ablation / "timings.jsonl").read_text().splitlines()]
    assert ablation_timed == ["ppo", "eval"]
