"""One trial of a task: the sandbox it starts in, what plays in it, the verification, the close.

Why here: every trial (training rollouts, evaluation, SFT data, pool validation, synthesis, the
mismatch study) must start the same sandbox for the same task, as Harbor does, grade what the
player left with the same verifier and close the sandbox whatever happened, so a trial is
written once (`run_trial`), in the rollout layer all of them sit on (docs/ARCHITECTURE.md).
Callers differ only in what plays (an agent's episode, a reference solution, nothing) and in
what they make of the outcome (a Sample, an evaluation row, a validation verdict).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any, Callable

from t1jax.rollout.fan_out import Images
from t1jax.sandbox.backend import SandboxSpec
from t1jax.sandbox.base import Limits
from t1jax.tasks.task import resolve_env
from t1jax.verify.reward import GlobalScale
from t1jax.verify.verifier import VerifierReport, VerifierSettings, verify


def task_limits(task, base: Limits) -> Limits:
    """The run's sandbox limits with the task's own cpus, memory and storage."""
    env = task.environment
    return dataclasses.replace(base, cpus=env.cpus, memory_mb=env.memory_mb,
                               storage_mb=env.storage_mb)


def task_sandbox_spec(task, image: str, limits: Limits, *, run_id: str,
                      allow_network: bool = False) -> SandboxSpec:
    """The sandbox a task's agent (or oracle) works in, as Harbor starts it: the task's limits,
    the image's own WORKDIR (Docker's default; bwrap reads it from the Dockerfile), the task's
    `[environment.env]`, its agent user, and the network only when both the task and the run
    allow it. Every trial (rollouts, evaluation, SFT data, validation, synthesis) starts here."""
    env = resolve_env(task, task.environment.env, "environment.env")
    return SandboxSpec(image=image, limits=task_limits(task, limits),
                       workdir=task.environment.workdir, user=task.agent.user,
                       network=allow_network and task.environment.allow_internet,
                       environment=tuple(env.items()), run_id=run_id)


def start_sandbox(task, backend, image: str, limits: Limits, *, run_id: str,
                  allow_network: bool = False):
    """A started sandbox for one trial of `task` (task_sandbox_spec); the caller closes it (or
    hands it to run_trial, which does)."""
    return backend.create(task_sandbox_spec(task, image, limits, run_id=run_id,
                                            allow_network=allow_network))


@dataclasses.dataclass
class TrialOutcome:
    """What one trial left: what the player returned (an agent's Trajectory), the verifier's
    report, and each side's failure (recorded, not raised: the caller decides what a failure
    means; an evaluation grades it, a training step drops it)."""
    task_id: str
    played: Any = None
    report: VerifierReport | None = None
    play_error: Exception | None = None  # the sandbox could not start, or the player raised
    verify_error: Exception | None = None  # the verifier could not run (not a task's failure)
    play_s: float = 0.0
    seconds: float = 0.0

    @property
    def error(self) -> str | None:
        """The first failure as "Type: message", or None."""
        err = self.play_error or self.verify_error
        return None if err is None else f"{type(err).__name__}: {err}"


@dataclasses.dataclass(frozen=True)
class TrialSite:
    """Where a job's trials run, the same for each of them: the sandbox backend and its limits,
    the run id its sandboxes are labelled (and reaped) by, whether a task's allow_internet may
    open the network, the dense reward's scale the verifier scores on (None: not graded), the
    run's built images (each task's built once, fan_out.Images) and how many trials run at
    once. A job builds one (t1jax/jobs/build.py TaskStack.site) and hands it down whole, as it
    does its EpisodeSettings; a caller that needs another scale or run id replaces that field
    (`with_`)."""
    backend: Any
    limits: Limits = Limits()
    # a job names its own; the default is unique, so one site's reap never meets another's
    run_id: str = dataclasses.field(default_factory=lambda: f"adhoc-{uuid.uuid4().hex[:8]}")
    allow_network: bool = False
    scale: GlobalScale | None = None
    concurrency: int = 4
    images: Images | None = None  # None: a fresh cache over `backend`

    def __post_init__(self):
        if self.concurrency < 1:
            raise ValueError(f"TrialSite needs concurrency >= 1, got {self.concurrency}")
        if self.images is None:
            object.__setattr__(self, "images", Images(self.backend))

    def with_(self, **changes) -> "TrialSite":
        return dataclasses.replace(self, **changes)

    def start(self, task, image: str | None = None):
        """A started sandbox for one trial of `task` (from `image`, default the task's own,
        built once); the caller closes it (or hands it to run_trial, which does)."""
        return start_sandbox(task, self.backend, image or self.images.get(task), self.limits,
                             run_id=self.run_id, allow_network=self.allow_network)


def run_trial(task, site: TrialSite, play: Callable[[Any], Any], *, image: str | None = None,
              sandbox=None, verifier: VerifierSettings = VerifierSettings(),
              grade_failed_play: bool = True, catch: tuple = (Exception,),
              keep_open_on: tuple = ()) -> TrialOutcome:
    """One trial of `task` at `site`: a sandbox started as `task_sandbox_spec` says, from
    `image` (default: the task's, built once by site.images; a build failure is a play_error)
    or `sandbox` (one a stopped episode left open), `play(sandbox)`, then, when site.scale is
    given, the verifier on what the player left, in its sandbox or a snapshot's
    (verifier.where; also after the player failed, unless grade_failed_play=False: an agent
    that crashed is graded on what it did), and the sandbox closed.

    Failures of the types in `catch` are recorded on the outcome; others propagate once the
    sandbox is closed (a bug in our code must not read as a task's failure). An exception in
    `keep_open_on` propagates with the sandbox left open: a stopped episode the scheduler
    resumes later."""
    t0 = time.monotonic()
    out = TrialOutcome(task.task_id)
    if sandbox is None:
        try:
            sandbox = site.start(task, image)
        except catch as err:
            out.play_error, out.seconds = err, time.monotonic() - t0
            return out
    keep_open = False
    try:
        try:
            out.played = play(sandbox)
        except keep_open_on:
            keep_open = True
            raise
        except catch as err:
            out.play_error = err
        out.play_s = time.monotonic() - t0
        if site.scale is not None and (out.play_error is None or grade_failed_play):
            try:
                out.report = verify(task, sandbox, site.backend, site.scale,
                                    mode=verifier.mode, run_id=site.run_id,
                                    limits=task_limits(task, site.limits),
                                    allow_network=site.allow_network, where=verifier.where)
            except catch as err:
                out.verify_error = err
    finally:
        if not keep_open:
            try:
                sandbox.close()
            except Exception:  # noqa: BLE001 - the caller's reap of run_id removes leftovers
                pass
    out.seconds = time.monotonic() - t0
    return out
