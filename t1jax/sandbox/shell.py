"""A persistent shell inside a sandbox, driven over a byte stream, with sentinel-based completion.

Why a persistent shell: an agent's `cd`, `export` and `cmd &` must survive between its commands, and
a fresh `docker exec` per command costs tens of milliseconds. Why sentinels: waiting a fixed second
(Terminus-2) wastes most of an episode's wall clock; instead each command is followed by a marker
line carrying its exit code and working directory, and we return the moment it arrives.

Every command is sent as one line, `eval '<command>' </dev/null`, so an unterminated quote cannot
eat the marker, `return` cannot skip it, and a command that reads stdin sees end-of-file. The
shell runs with job control (`set -m`), so each command gets its own process group: a timeout kills
exactly that group (run by `kill_helper` as root inside the sandbox), and background jobs started
earlier survive. If the shell itself is stuck (a builtin `while :; do :; done`) or gone (`exit`),
it is replaced and its working directory and exported variables are restored.
"""

from __future__ import annotations

import re
import secrets
import select
import time
from typing import Callable, Protocol

from t1jax.sandbox.base import ExecResult, SandboxError
from t1jax.sandbox.output import HeadTailBuffer, clean_output

STATE_FILE = "/tmp/.t1jax_shell_env"
KILL_GRACE_S = 2.0
RESTART_ATTEMPTS = 3
LIMIT_CHECK_INTERVAL_S = 0.25  # how often check_limits runs while a command runs
SANDBOX_DOWN = "the sandbox's processes were all killed"

# Run as root inside the sandbox: kill the process groups of the shell's children except the
# background jobs that existed before the command; with "shell", kill the shell too.
KILL_SCRIPT = r"""
shell=$1; mode=$2; shift 2; keep=" $* "
read -r sline < /proc/$shell/stat 2>/dev/null || exit 0
set -- ${sline##*) }; shell_pgid=$3
[ "$mode" = shell ] && kill -9 "$shell" 2>/dev/null
for st in /proc/[0-9]*/stat; do
  read -r line < "$st" 2>/dev/null || continue
  pid=${st#/proc/}; pid=${pid%/stat}
  set -- ${line##*) }
  [ "$2" = "$shell" ] || continue
  case "$keep" in *" $3 "*) continue;; esac
  if [ "$3" = "$shell_pgid" ]; then kill -9 "$pid" 2>/dev/null; else kill -9 "-$3" 2>/dev/null; fi
done
exit 0
"""


class Transport(Protocol):
    """A bidirectional byte stream to a shell process inside the sandbox."""

    def fileno(self) -> int: ...

    def send(self, data: bytes) -> None: ...

    def recv(self) -> bytes | None:
        """Bytes that are ready (b'' if none), or None at end of stream."""

    def close(self) -> None: ...


class PersistentShell:
    """One long-lived shell. Not thread-safe: one command at a time, like a terminal."""

    def __init__(self, open_transport: Callable[[], Transport],
                 run_kill_helper: Callable[[list[str]], None], *, workdir: str | None,
                 max_output_bytes: int, kill_output_bytes: int, clean: bool = True,
                 check_limits: Callable[[], str | None] = lambda: None):
        self._open_transport = open_transport
        self._run_kill_helper = run_kill_helper
        self._workdir = workdir
        self._max_output_bytes = max_output_bytes
        self._kill_output_bytes = kill_output_bytes
        self._clean = clean
        # Called a few times a second while a command runs; a returned reason kills the command.
        self._check_limits = check_limits
        self._nonce = secrets.token_hex(8).encode()
        self._transport: Transport | None = None
        self._pending = bytearray()
        self.pid: int | None = None
        self.cwd: str | None = workdir
        self.restarts = 0
        self._stop_reason = ""
        self._discarded = 0

    # -- life cycle ---------------------------------------------------------------------------
    def start(self, restore: bool = False) -> None:
        self._transport = self._open_transport()
        self._pending.clear()
        n = self._nonce.decode()
        init = [
            "exec 2>&1", "set -m", "set +o history 2>/dev/null", "unset PROMPT_COMMAND",
            "PS1= PS2=", "export TERM=dumb PAGER=cat GIT_PAGER=cat DEBIAN_FRONTEND=noninteractive",
        ]
        if restore:
            init.append(f". {STATE_FILE} 2>/dev/null")
        if self.cwd:
            init.append(f"cd {quote(self.cwd)} 2>/dev/null")
        init.append(f"printf '\\036T1R{n} %s\\n' \"$$\"")
        self._transport.send(("\n".join(init) + "\n").encode())
        match = self._read_until(re.compile(rb"\x1eT1R" + self._nonce + rb" (\d+)\n"),
                                 time.monotonic() + 30.0)
        if match is None:
            raw = bytes(self._pending[-500:]).decode(errors="replace")
            raise SandboxError(f"the sandbox shell did not start (no bash/sh?); it said: {raw!r}")
        self.pid = int(match.group(1))
        del self._pending[:match.end()]

    def close(self) -> None:
        if self._transport is not None:
            try:
                self._transport.close()
            finally:
                self._transport = None

    # -- commands -----------------------------------------------------------------------------
    def run(self, cmd: str, timeout: float, max_output_bytes: int | None = None) -> ExecResult:
        """max_output_bytes: this command's head + tail kept (default: the shell's)."""
        if self._transport is None:
            raise SandboxError("the shell is closed")
        if "\x00" in cmd:
            raise ValueError("a shell command cannot contain NUL bytes")
        n = self._nonce.decode()
        line = (f"printf '\\036T1S{n}\\n'; jobs -p; printf '\\036T1B{n}\\n'; "
                f"eval {quote(cmd)} </dev/null; __t1_rc=$?; export -p >{STATE_FILE} 2>/dev/null; "
                f"printf '\\n\\036T1E{n} %d %s\\n' \"$__t1_rc\" \"$PWD\"\n")
        start = time.monotonic()
        out = HeadTailBuffer(max_output_bytes or self._max_output_bytes)
        self._discarded = 0  # bytes read but not shown (drained after a kill); they count
        self._transport.send(line.encode())

        begin = self._read_until(re.compile(rb"\x1eT1S" + self._nonce + rb"\n(.*?)\x1eT1B"
                                            + self._nonce + rb"\n", re.S),
                                 start + timeout, out)
        if begin is None:  # what arrived counts (a background flood), though it is not shown
            self._discarded = len(self._pending)
            self._pending.clear()
            return self._recover(out, start, keep=[])
        keep = begin.group(1).decode(errors="replace").split()
        out.write(bytes(self._pending[:begin.start()]))
        del self._pending[:begin.end()]

        end_re = re.compile(rb"\n\x1eT1E" + self._nonce + rb" (\d+) ([^\n]*)\n")
        end = self._read_until(end_re, start + timeout, out, flush_body=True)
        if end is None:  # keep what the command printed before it was stopped
            out.write(bytes(self._pending))
            self._pending.clear()
            return self._recover(out, start, keep=keep)
        exit_code, cwd = int(end.group(1)), end.group(2).decode(errors="replace")
        out.write(bytes(self._pending[:end.start()]))
        del self._pending[:end.end()]  # (a match on a bytearray changes when it does)
        self.cwd = cwd or self.cwd
        return self._result(out, start, exit_code=exit_code)

    def _result(self, out: HeadTailBuffer, start: float, exit_code: int | None,
                timed_out: bool = False, restarted: bool = False) -> ExecResult:
        data = out.getvalue()
        text = clean_output(data) if self._clean else data.decode("utf-8", errors="replace")
        return ExecResult(output=text, exit_code=exit_code, timed_out=timed_out,
                          truncated=out.truncated, duration_s=time.monotonic() - start,
                          output_bytes=out.total + self._discarded, shell_restarted=restarted)

    def _recover(self, out: HeadTailBuffer, start: float, keep: list[str]) -> ExecResult:
        """Kill the command's process groups; if the shell does not come back, replace it."""
        reason = self._stop_reason
        timed_out = reason == "timeout"
        if reason != "eof" and self.pid is not None:
            try:
                self._run_kill_helper([str(self.pid), "children", *keep])
            except SandboxError:  # the sandbox itself went down (gVisor: its OOM): replace all
                reason = SANDBOX_DOWN
                return self._replace(out, start, keep, reason, timed_out)
            end_re = re.compile(rb"\n\x1eT1E" + self._nonce + rb" (\d+) ([^\n]*)\n")
            sink = _Sink()
            end = self._read_until(end_re, time.monotonic() + KILL_GRACE_S, sink,
                                   flush_body=True)
            self._discarded += sink.total
            if end is not None:
                del self._pending[:end.end()]
                self._pending.clear()  # whatever raced in after the kill belongs to nobody
                why = {"timeout": "timed out",
                       "flood": f"exceeded {self._kill_output_bytes} bytes of output"
                       }.get(reason, reason)
                out.write(f"\n[command killed: {why}]\n".encode())
                return self._result(out, start, exit_code=None, timed_out=timed_out)
        return self._replace(out, start, keep, reason, timed_out)

    def _replace(self, out: HeadTailBuffer, start: float, keep: list[str], reason: str,
                 timed_out: bool) -> ExecResult:
        """The shell itself is stuck or gone: replace it, restoring cwd and exported
        variables."""
        self.close()
        if self.pid is not None:
            try:
                self._run_kill_helper([str(self.pid), "shell", *keep])
            except SandboxError:
                pass
        self.restarts += 1
        for attempt in range(RESTART_ATTEMPTS):
            try:
                self.start(restore=True)
                break
            except SandboxError:  # a sandbox going down (kill -9 -1) can take the new shell too
                if attempt + 1 == RESTART_ATTEMPTS:
                    raise
                time.sleep(0.5)
        why = {"eof": "the shell exited", "timeout": "timed out",
               "flood": "output flood"}.get(reason, reason)
        out.write(f"\n[{why}; a new shell was started in {self.cwd}]\n".encode())
        return self._result(out, start, exit_code=None, timed_out=timed_out, restarted=True)

    def _read_until(self, pattern: re.Pattern, deadline: float, out=None,
                    flush_body: bool = False):
        """Read until `pattern` matches the pending bytes; None at the deadline, on end of
        stream (transport closed), or when the output exceeds the kill threshold."""
        keep_tail = 8192
        last_check = time.monotonic()
        while True:
            match = pattern.search(self._pending)
            if match is not None:
                return match
            if out is not None and flush_body and len(self._pending) > keep_tail:
                cut = len(self._pending) - keep_tail
                out.write(bytes(self._pending[:cut]))
                del self._pending[:cut]
            if out is not None and out.total + len(self._pending) > self._kill_output_bytes:
                self._stop_reason = "flood"
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._stop_reason = "timeout"
                return None
            ready, _, _ = select.select([self._transport.fileno()], [], [],
                                          min(remaining, LIMIT_CHECK_INTERVAL_S))
            if out is not None and time.monotonic() - last_check >= LIMIT_CHECK_INTERVAL_S:
                last_check = time.monotonic()
                reason = self._check_limits()
                if reason:
                    self._stop_reason = reason
                    return None
            if not ready:
                continue
            data = self._transport.recv()
            if data is None:  # end of stream: the shell exited
                if out is not None:  # else keep it: start() quotes it in its error
                    out.write(bytes(self._pending))
                    self._pending.clear()
                self.close()
                self._stop_reason = "eof"
                return None
            self._pending += data


class _Sink:
    """Discards (and counts) output read while waiting for a killed command's marker."""

    def __init__(self):
        self.total = 0

    def write(self, data: bytes) -> None:
        self.total += len(data)


def quote(text: str) -> str:
    """`text` as one single-quoted shell word."""
    return "'" + text.replace("'", "'\\''") + "'"
