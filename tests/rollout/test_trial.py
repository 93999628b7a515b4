"""run_trial, the one trial primitive every caller uses (rollouts, evaluation, SFT data, pool
validation, synthesis): on a real Docker sandbox, what it grades, what it records, what it
lets through, and that it never leaves a sandbox behind (unless told to keep a stopped one)."""

from __future__ import annotations

import uuid

import pytest

from t1jax.rollout.trial import TrialSite, run_trial
from t1jax.tasks.task import load_task
from t1jax.verify.reward import GlobalScale
from conftest import COUNT_LOG_SOLVE, COUNT_LOG_TASK

TASK_DIR = COUNT_LOG_TASK
SOLVE = COUNT_LOG_SOLVE


class Stopped(Exception):
    pass


@pytest.mark.slow
def test_run_trial_grades_records_and_always_closes(docker_backend):
    task = load_task(TASK_DIR)
    run_id = f"test-trial-{uuid.uuid4().hex[:8]}"
    scale = GlobalScale(5, "test")
    site = TrialSite(docker_backend, run_id=run_id, scale=scale)
    boxes = []

    def trial(play, scale=scale, **kwargs):
        def recorded(box):
            boxes.append(box)
            return play(box)
        return run_trial(task, site.with_(scale=scale), recorded, **kwargs)

    try:
        solved = trial(lambda box: box.exec(SOLVE).exit_code, scale=scale)
        assert solved.played == 0 and solved.error is None
        assert solved.report.solved and solved.report.passed == solved.report.total > 0
        assert boxes[-1].container is None  # closed

        def crash(box):  # half the work, then the agent fails: graded on what it left
            box.exec("cd /app && echo 'api: 1' > report.txt")
            raise ValueError("malformed model output")

        graded = trial(crash, scale=scale)
        assert isinstance(graded.play_error, ValueError) and graded.played is None
        assert graded.error == "ValueError: malformed model output"
        assert graded.report is not None and not graded.report.solved
        assert boxes[-1].container is None
        ungraded = trial(crash, scale=scale, grade_failed_play=False)
        assert ungraded.report is None and isinstance(ungraded.play_error, ValueError)

        unscored = trial(lambda box: "played", scale=None)  # no scale: nothing verified
        assert unscored.played == "played" and unscored.report is None

        with pytest.raises(KeyError):  # not in `catch`: a bug propagates, sandbox closed
            trial(lambda box: {}["missing"], scale=scale, catch=(OSError,))
        assert boxes[-1].container is None

        def stop(box):
            box.exec("echo kept > /app/kept.txt")
            raise Stopped
        with pytest.raises(Stopped):  # a stopped episode keeps its sandbox for the next step
            trial(stop, scale=scale, keep_open_on=(Stopped,))
        kept = boxes[-1]
        assert kept.container is not None
        resumed = run_trial(task, site, lambda box: box.exec(
            "cat /app/kept.txt").output.strip(), sandbox=kept)
        assert resumed.played == "kept" and resumed.report is not None
        assert kept.container is None

        no_image = run_trial(task, site, lambda box: None, image="t1jax-no-such-image:0")
        assert no_image.play_error is not None and no_image.report is None
        assert len(boxes) == 6  # the player never ran without a sandbox
    finally:
        assert docker_backend.reap(run_id) == 0  # nothing was left running
