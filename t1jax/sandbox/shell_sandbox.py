"""What the Docker and bubblewrap sandboxes share: one persistent shell, `exec` under the storage
watchdog, and closing on every exit path. Subclasses provide the transport, the kill helper and
the disk-usage reading."""

from __future__ import annotations

import contextlib
import signal
import threading
import time

from t1jax.sandbox.base import (ExecResult, Limits, OutputBudgetExceeded, SandboxError,
                                StorageQuotaExceeded)
from t1jax.sandbox.shell import SANDBOX_DOWN, PersistentShell

MIN_CHECK_INTERVAL_S = 0.25
ALIVE_CHECK_INTERVAL_S = 1.0
# What a write into a full (kernel-capped) filesystem prints: look at the usage right away.
DISK_FULL = ("No space left on device", "Disk quota exceeded")


class ShellSandbox:
    name: str
    limits: Limits
    workdir: str | None
    shell: PersistentShell | None = None

    def _init_shell_state(self) -> None:
        self._lock = threading.Lock()
        self._last_check, self._check_every, self._baseline = 0.0, MIN_CHECK_INTERVAL_S, 0
        self._last_alive_check = 0.0
        self.output_bytes = 0  # every command's output so far (Limits.episode_output_bytes)

    def get_files(self, directory: str, names) -> dict[str, bytes]:
        """The regular files `names` directly inside `directory`, by name; absent ones (or
        ones that are not regular files) left out. One `get` each here; Docker overrides it
        with one archive call."""
        found = {}
        for name in names:
            try:
                found[name] = self.get(f"{directory.rstrip('/')}/{name}")
            except (FileNotFoundError, IsADirectoryError):
                pass
        return found

    # -- for subclasses -----------------------------------------------------------------------
    def _open_shell(self):
        raise NotImplementedError

    def _kill_helper(self, args: list[str]) -> None:
        raise NotImplementedError

    def disk_usage_bytes(self) -> int | None:
        """Bytes the sandbox has on its writable layer; None where that is not visible."""
        raise NotImplementedError

    def _at_kernel_cap(self) -> bool:
        """Whether the kernel refuses the sandbox's writes for its quota right now (a daemon
        that caps writes itself); False where nothing but the watchdog enforces the quota."""
        return False

    def _stopped(self) -> bool:
        """Whether every process of the sandbox is gone while its shell stream stays open
        (gVisor keeps a `docker exec` stream open after `kill -9 -1` stops the container);
        False where that cannot happen or cannot be told."""
        return False

    @contextlib.contextmanager
    def _closing_on_failure(self):
        """For `start`: a failure inside (Ctrl-C too) closes whatever was made, then goes on."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    def _start_shell(self) -> None:
        self._baseline = self.disk_usage_bytes() or 0  # what the image brought is not counted
        self.shell = PersistentShell(
            self._open_shell, self._kill_helper, workdir=self.workdir,
            max_output_bytes=self.limits.max_output_bytes,
            kill_output_bytes=self.limits.kill_output_bytes,
            check_limits=self._limit_violation)
        self.shell.start()

    # -- shared behaviour ---------------------------------------------------------------------
    def __enter__(self):
        return self if self.shell is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def exec(self, cmd: str, timeout: float | None = None) -> ExecResult:
        if self.shell is None:
            raise SandboxError("the sandbox is not running (call start() or use `with`)")
        with self._lock:
            result = self.shell.run(cmd, timeout or self.limits.default_timeout_s)
        # SIGXFSZ: a file hit the per-file cap (= the quota), so look now, not at the next tick
        hit_file_cap = result.exit_code == 128 + signal.SIGXFSZ
        disk_full = any(text in result.output for text in DISK_FULL)
        self._check_storage(force=result.timed_out or result.exit_code is None or hit_file_cap
                            or disk_full, disk_full=disk_full)
        self.output_bytes += result.output_bytes
        if self.output_bytes > self.limits.episode_output_bytes:
            raise OutputBudgetExceeded(
                f"sandbox {self.name}: the episode's commands printed {self.output_bytes} bytes, "
                f"over its budget of {self.limits.episode_output_bytes} "
                "(sandbox.episode_output_bytes)")
        return result

    def _limit_violation(self) -> str | None:
        """Why the running command must stop now, if it must: the sandbox stopped under it
        (else its shell would wait out the command's whole timeout) or the storage quota."""
        return self._down() or self._storage_violation()

    def _down(self) -> str | None:
        if time.monotonic() - self._last_alive_check >= ALIVE_CHECK_INTERVAL_S:
            self._last_alive_check = time.monotonic()
            if self._stopped():
                return SANDBOX_DOWN
        return None

    def _run_in_fresh_shell(self, transport, cmd: str, timeout: float,
                            max_output_bytes: int) -> ExecResult:
        """`cmd` in a shell of its own over `transport` (fresh_exec), closed after: the
        same timeout, kill and output handling as the agent's commands, no episode budget."""
        shell = PersistentShell(transport, self._kill_helper, workdir=self.workdir,
                                max_output_bytes=max_output_bytes,
                                kill_output_bytes=max(self.limits.kill_output_bytes,
                                                      max_output_bytes),
                                check_limits=self._down)
        for attempt in range(3):  # a container whose processes just died can refuse an exec
            try:
                shell.start()
                break
            except SandboxError:
                if attempt == 2:
                    raise
                time.sleep(0.5)
        try:
            return shell.run(cmd, timeout)
        finally:
            shell.close()

    def _storage_violation(self) -> str | None:
        if time.monotonic() - self._last_check < self._check_every:
            return None
        began = time.monotonic()
        used = self.disk_usage_bytes()
        self._last_check = time.monotonic()
        # walking a huge tree must not take most of a command's time
        self._check_every = max(MIN_CHECK_INTERVAL_S, 10 * (self._last_check - began))
        if used is not None and used - self._baseline >= self.limits.storage_mb * 2**20:
            return (f"sandbox {self.name} wrote {(used - self._baseline) / 2**20:.0f} MiB, over "
                    f"its storage quota of {self.limits.storage_mb} MiB "
                    "(task [environment] storage_mb)")
        return None

    def _check_storage(self, force: bool = False, disk_full: bool = False) -> None:
        if force:
            self._last_check = 0.0
        violation = self._storage_violation()
        if not violation and disk_full and self._at_kernel_cap():
            # the kernel's count (btrfs qgroup) binds even where the daemon's count of the
            # written bytes is still under the quota: the sandbox cannot write any more
            used = self.disk_usage_bytes()
            counted = ("the daemon could not count what it wrote" if used is None else
                       f"the daemon counts {(used - self._baseline) / 2**20:.0f} MiB written")
            violation = (f"sandbox {self.name} reached the kernel cap on its writes, its storage "
                         f"quota of {self.limits.storage_mb} MiB (task [environment] storage_mb; "
                         f"{counted})")
        if violation:
            raise StorageQuotaExceeded(violation)
