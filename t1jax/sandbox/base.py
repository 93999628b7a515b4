"""The Sandbox protocol every backend implements, and the limits a sandbox runs under.

An agent's commands run in a sandbox through one persistent shell; the verifier needs files in and
out and a snapshot of the agent's filesystem. Backends: `docker.DockerSandbox` (the default) and
`bwrap.BwrapSandbox` (no daemon needed).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Protocol, runtime_checkable

# Labels on every Docker object we create, so a reaper can find leftovers of crashed runs.
LABEL_OWNER = "t1jax.owner"
LABEL_RUN = "t1jax.run"
LABEL_PID = "t1jax.pid"
LABEL_HOST = "t1jax.host"


def reapable(run: str | None, host: str | None, pid, run_id: str | None) -> bool:
    """Whether a reap may remove a sandbox its run `run`, on `host`, by process `pid` left.

    With `run_id`: that run's sandboxes, unless a live process other than this one on this
    host owns them. Why: run ids repeat (an evaluation's default names its label and start
    second; two checkouts share a workdir name), and a reap by run id alone removed another
    job's live containers under its trials. Without: those whose owner on this host is dead
    (a run killed with SIGKILL cannot clean up after itself)."""
    if run_id is not None and run != run_id:
        return False
    if host != socket.gethostname():
        return run_id is not None  # another machine's run: only by its run id
    try:
        pid = int(pid or 0)
    except (TypeError, ValueError):
        pid = 0
    if pid == os.getpid():
        return run_id is not None
    if pid <= 0:
        return True  # no owner recorded
    try:
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's


class SandboxError(RuntimeError):
    """A sandbox could not be created, reached or used; the message says which and why."""


class SandboxLimitExceeded(SandboxError):
    """The episode used up a budget enforced from outside the sandbox (storage, total output).
    The agent ends the episode here (finish "sandbox_limit"); it is verified and scored like
    any other, so a policy that fills the disk learns from the outcome."""


class StorageQuotaExceeded(SandboxLimitExceeded):
    """The sandbox wrote more than its storage quota (task [environment] storage_mb)."""


class OutputBudgetExceeded(SandboxLimitExceeded):
    """The episode's commands printed more than Limits.episode_output_bytes in all."""


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """What one shell command produced.

    `exit_code` is None when the command was killed for its timeout or its output flood.
    `truncated` says the middle of `output` was cut to the configured cap (a marker shows where).
    `shell_restarted` says the shell itself had to be replaced (state restored from its last save).
    """
    output: str
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    output_bytes: int = 0
    shell_restarted: bool = False


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resources for one sandbox; tasks give cpus/memory/storage, the run config the rest."""
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    pids: int = 512
    nofile: int = 4096
    # Output kept per command (head + tail); Terminus-2 keeps 10 KB.
    max_output_bytes: int = 10_000
    # A command producing more than this is killed like a timeout: a `yes` flood must not spin
    # the reader for the whole timeout.
    kill_output_bytes: int = 16 * 1024 * 1024
    # All commands of an episode together, counted on the host as the bytes arrive.
    episode_output_bytes: int = 64 * 1024 * 1024
    default_timeout_s: float = 180.0


@runtime_checkable
class Sandbox(Protocol):
    """A running, isolated shell environment. Use as a context manager: closed on every path."""

    def exec(self, cmd: str, timeout: float | None = None) -> ExecResult: ...

    def put(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    def get(self, path: str) -> bytes: ...

    def get_files(self, directory: str, names) -> dict[str, bytes]: ...

    def fresh_exec(self, cmd: str, *, environment: dict, user: str | None, timeout: float,
                   max_output_bytes: int) -> ExecResult:
        """`cmd` as a new login to this sandbox runs it (the verifier's way, Harbor's `docker
        exec`): none of the agent shell's state, whatever the agent left running alive."""

    def cut_network(self) -> None:
        """No network from now on (loopback stays); an error where that cannot be done."""

    def snapshot(self) -> str: ...

    def close(self) -> None: ...

    def __enter__(self) -> "Sandbox": ...

    def __exit__(self, *exc) -> None: ...
