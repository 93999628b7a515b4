"""The one fan-out over tasks (rollout/fan_out.py): results in job order, progress per job, an
error cancels what has not started and reaps the run's real sandboxes, and a task that cannot
build is the same named reason, built once, for every caller (evaluation and pool validation)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from t1jax.curation.validate import validate_pool
from t1jax.rollout.fan_out import BUILD_FAILED, ImageBuildError, Images, fan_out
from t1jax.rollout.trial import TrialSite
from t1jax.sandbox.base import LABEL_RUN
from t1jax.tasks.task import load_task

SEED = Path(__file__).resolve().parents[2] / "t1jax" / "tasks" / "seed_tasks"


def test_results_come_in_job_order_and_each_job_is_heard_once():
    heard, lock = [], threading.Lock()

    def work(n):
        time.sleep(0.01 * (5 - n))  # later jobs finish first
        return n * n

    def done(job, result):
        with lock:
            heard.append((job, result))

    assert fan_out(range(5), work, workers=3, on_done=done) == [0, 1, 4, 9, 16]
    assert sorted(heard) == [(n, n * n) for n in range(5)]
    with pytest.raises(ValueError, match="workers must be >= 1"):
        fan_out([1], work, workers=0)


def test_an_error_cancels_queued_jobs():
    started = []

    def work(n):
        started.append(n)
        if n == 0:
            raise RuntimeError("job 0 broke")
        return n

    with pytest.raises(RuntimeError, match="job 0 broke"):
        fan_out(range(6), work, workers=1)
    time.sleep(0.1)
    assert started == [0]  # one worker: nothing after the failing job ever started


class CountingBackend:
    """The real backend, counting its builds (a task that cannot build is tried once)."""

    def __init__(self, backend):
        self.backend, self.builds = backend, 0

    def build(self, task):
        self.builds += 1
        return self.backend.build(task)

    def __getattr__(self, name):
        return getattr(self.backend, name)


def _broken_task(tmp_path: Path):
    dst = tmp_path / "broken-build"
    shutil.copytree(SEED / "organize-files", dst)
    with open(dst / "environment" / "Dockerfile", "a") as f:
        f.write("\nRUN echo this build is broken >&2 && exit 3\n")
    return load_task(dst)


@pytest.mark.slow
def test_a_task_that_cannot_build_is_one_named_reason_for_every_caller(docker_backend,
                                                                       tmp_path):
    broken, good = _broken_task(tmp_path), load_task(SEED / "organize-files")
    backend = CountingBackend(docker_backend)
    images = Images(backend)
    assert images.build_all([broken, good]).keys() == {"broken-build"}
    why = images.failed["broken-build"]
    assert why.startswith(f"{BUILD_FAILED}: SandboxError: ") and "broken" in why, why
    with pytest.raises(ImageBuildError) as err:
        images.get(broken)  # remembered, not rebuilt
    assert str(err.value) == why and backend.builds == 2 and "organize-files" in images.built

    # pool validation names the same reason for both of its agents, and runs the good task
    site = TrialSite(docker_backend, run_id=f"test-fan-out-{os.getpid()}", concurrency=2)
    summary = validate_pool([broken, good], site, out_dir=tmp_path / "validate")
    rows = [json.loads(line) for line in open(tmp_path / "validate" / "results.jsonl")]
    # the same words (the daemon's log of the build names its own layer ids each time)
    head = why.split(" returned a non-zero code")[0]
    errors = [r["error"] for r in rows if r["task_id"] == "broken-build"]
    assert len(errors) == 2 and all(e.startswith(head) for e in errors), (head, errors)
    assert all(r["report"] is not None for r in rows if r["task_id"] == "organize-files")
    assert "broken-build" in summary["unhealthy"] and backend.builds == 2


@pytest.mark.slow
def test_an_interrupted_fan_out_reaps_its_sandboxes(docker_backend):
    task = load_task(SEED / "organize-files")
    run_id = f"test-fan-out-reap-{os.getpid()}"
    site = TrialSite(docker_backend, run_id=run_id)
    opened = []

    def work(n):
        box = site.start(task)
        opened.append(box)  # left open, as a trial that is interrupted leaves it
        if n == 1:
            raise KeyboardInterrupt
        return n

    with pytest.raises(KeyboardInterrupt):
        fan_out(range(2), work, workers=1, backend=docker_backend, run_id=run_id)
    assert len(opened) == 2
    client = docker_backend.client
    left = client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})
    assert left == [], [c.name for c in left]
