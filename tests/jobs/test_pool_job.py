"""The pool job: refuses a pool that overlaps a held-out suite, else materialises the dataset."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = [sys.executable, str(ROOT / "experiments" / "run.py"), "--config",
       str(ROOT / "configs" / "pool.py")]


def test_pool_job_refuses_contamination_then_builds(tmp_path):
    seeds = ROOT / "t1jax" / "tasks" / "seed_tasks"
    pool = tmp_path / "pool"
    for name in ("count-log-errors", "csv-join-report", "organize-files"):
        shutil.copytree(seeds / name, pool / name)
    heldout = tmp_path / "heldout"
    shutil.copytree(seeds / "csv-join-report", heldout / "renamed-benchmark-task")
    proc = subprocess.run(RUN + [f"--workdir={tmp_path / 'a'}", f"--config.tasks={pool}",
                                 f"--config.heldout_dirs={heldout}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "csv-join-report" in proc.stderr and "renamed-benchmark-task" in proc.stderr
    assert not (tmp_path / "a" / "tfds").exists()  # nothing materialised from a tainted pool

    shutil.rmtree(pool / "csv-join-report")
    proc = subprocess.run(RUN + [f"--workdir={tmp_path / 'b'}", f"--config.tasks={pool}",
                                 f"--config.heldout_dirs={heldout}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "b" / "pool.json").read_text())
    assert summary["tasks"] == 2 and summary["global_scale"] >= 3
