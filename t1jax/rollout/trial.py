"""How a trial of a task starts: the sandbox the task's agent (or oracle) works in.

Why here: every trial (training rollouts, evaluation, SFT data, pool validation, synthesis, the
mismatch study) must start the same sandbox for the same task, as Harbor does, so the rules
live once, in the rollout layer that all of them sit on (docs/ARCHITECTURE.md). The rest of
a trial (agent, snapshot, verify, score, reap) is still written per caller; issue #28.
"""

from __future__ import annotations

import dataclasses

from t1jax.sandbox.backend import SandboxSpec
from t1jax.sandbox.base import Limits
from t1jax.tasks.task import resolve_env


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
