"""Backends make sandboxes for tasks: build a task's environment once, then start many sandboxes
from it (or from a snapshot of another sandbox, which is how the verifier gets a fresh one).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from t1jax.sandbox.base import Limits, Sandbox


@dataclasses.dataclass(frozen=True)
class SandboxSpec:
    """How to start one sandbox. `image` is what `Backend.build` or `Sandbox.snapshot` returned."""
    image: str
    limits: Limits = Limits()
    workdir: str | None = "/app"
    user: str | None = None
    network: bool = False  # True only when the task AND the run config allow it
    # host path -> sandbox path, mounted read-only (the verifier's tests)
    readonly_mounts: tuple[tuple[str, str], ...] = ()
    environment: tuple[tuple[str, str], ...] = ()
    run_id: str = "adhoc"


class Backend(Protocol):
    name: str

    def build(self, task) -> str:
        """The environment of a `t1jax.tasks.task.Task` (built once, cached by content)."""

    def create(self, spec: SandboxSpec) -> Sandbox:
        """A started sandbox; the caller closes it (use it as a context manager)."""

    def changes(self, sandbox) -> list[tuple[str, str]]:
        """(kind, path) for every path the sandbox added ('A'), changed ('C') or deleted ('D')
        relative to the environment it started from; the verifier's tamper check reads it."""

    def remove_image(self, image: str) -> None:
        """Delete a snapshot made by `Sandbox.snapshot` once nobody needs it."""

    def reap(self, run_id: str | None = None) -> int:
        """Remove leftovers (sandboxes, snapshots) of dead runs, or of `run_id`; returns a count."""
