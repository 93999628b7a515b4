import os
import signal
import subprocess
import time

import pytest

SCRIPT = "/app/supervise.sh"


def _env(backoff="100"):
    env = dict(os.environ)
    env.pop("SUPERVISE_BACKOFF_MS", None)
    if backoff is not None:
        env["SUPERVISE_BACKOFF_MS"] = backoff
    return env


def _check_script():
    assert os.path.isfile(SCRIPT) and os.access(SCRIPT, os.X_OK), "/app/supervise.sh missing or not executable"
    with open(SCRIPT) as f:
        assert f.readline().rstrip("\n") == "#!/bin/bash"


def supervise(max_restarts, log, cmd, backoff="100", timeout=60):
    _check_script()
    t0 = time.monotonic()
    res = subprocess.run([SCRIPT, str(max_restarts), str(log), "--", *cmd], capture_output=True,
                         text=True, timeout=timeout, env=_env(backoff))
    return res, time.monotonic() - t0


def service(state):
    return ["python3", "/app/service.py", "--state", str(state)]


def pids(state):
    return (state / "pids").read_text().split()


def log_lines(log):
    return log.read_text().splitlines() if log.exists() else []


def wait_for(pred, timeout=20):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_clean_exit_no_restart(tmp_path):
    state, log = tmp_path / "s", tmp_path / "sup.log"
    state.mkdir()
    (state / "crash_plan").write_text("0\n")
    res, _ = supervise(3, log, service(state))
    assert res.returncode == 0, res.stderr
    p = pids(state)
    assert len(p) == 1
    assert log_lines(log) == [f"START attempt=1 pid={p[0]}", "EXIT attempt=1 status=0"]


def test_arguments_and_output_passed_through(tmp_path):
    log = tmp_path / "sup.log"
    res, _ = supervise(0, log, ["bash", "-c", 'printf "%s|" "$@"; echo err >&2', "_", "a b", " c ", "*"])
    assert res.returncode == 0, res.stderr
    assert res.stdout == "a b| c |*|" and "err" in res.stderr
    assert [l.split(" pid=")[0] for l in log_lines(log)] == ["START attempt=1", "EXIT attempt=1 status=0"]


def test_restarts_until_success_with_backoff(tmp_path):
    state, log = tmp_path / "s", tmp_path / "sup.log"
    state.mkdir()
    (state / "crash_plan").write_text("3 5 0\n")
    res, elapsed = supervise(5, log, service(state))
    assert res.returncode == 0, res.stderr
    p = pids(state)
    assert len(p) == 3
    assert log_lines(log) == [
        f"START attempt=1 pid={p[0]}", "EXIT attempt=1 status=3", "RESTART attempt=2 delay_ms=100",
        f"START attempt=2 pid={p[1]}", "EXIT attempt=2 status=5", "RESTART attempt=3 delay_ms=200",
        f"START attempt=3 pid={p[2]}", "EXIT attempt=3 status=0"]
    assert elapsed >= 0.3 + 3 * 0.2, f"backoff delays not respected ({elapsed:.2f}s)"


def test_gives_up_after_max_restarts(tmp_path):
    state, log = tmp_path / "s", tmp_path / "sup.log"
    state.mkdir()
    (state / "crash_plan").write_text("7 7 7 7 7\n")
    res, _ = supervise(2, log, service(state))
    assert res.returncode == 1
    p = pids(state)
    assert len(p) == 3 and (state / "runs").read_text().strip() == "3"
    assert log_lines(log) == [
        f"START attempt=1 pid={p[0]}", "EXIT attempt=1 status=7", "RESTART attempt=2 delay_ms=100",
        f"START attempt=2 pid={p[1]}", "EXIT attempt=2 status=7", "RESTART attempt=3 delay_ms=200",
        f"START attempt=3 pid={p[2]}", "EXIT attempt=3 status=7", "GIVEUP attempts=3"]
    res, _ = supervise(0, tmp_path / "zero.log", ["bash", "-c", "exit 4"])
    assert res.returncode == 1
    lines = log_lines(tmp_path / "zero.log")
    assert [l.split(" pid=")[0] for l in lines] == ["START attempt=1", "EXIT attempt=1 status=4", "GIVEUP attempts=1"]


def test_exponential_backoff_and_default_base(tmp_path):
    state, log = tmp_path / "s", tmp_path / "sup.log"
    state.mkdir()
    (state / "crash_plan").write_text("1 1 1 1 0\n")
    res, elapsed = supervise(10, log, service(state), backoff="50")
    assert res.returncode == 0, res.stderr
    delays = [l for l in log_lines(log) if l.startswith("RESTART")]
    assert delays == ["RESTART attempt=2 delay_ms=50", "RESTART attempt=3 delay_ms=100",
                      "RESTART attempt=4 delay_ms=200", "RESTART attempt=5 delay_ms=400"]
    assert elapsed >= 0.75
    log2 = tmp_path / "default.log"
    res, elapsed = supervise(1, log2, ["bash", "-c", "[ -e flag ] && exit 0; touch flag; exit 9"], backoff=None)
    assert res.returncode == 0, res.stderr
    assert "RESTART attempt=2 delay_ms=1000" in log_lines(log2)
    assert elapsed >= 1.0


def _start_background(tmp_path, max_restarts=3):
    _check_script()
    state, log = tmp_path / "s", tmp_path / "sup.log"
    state.mkdir()
    sup = subprocess.Popen([SCRIPT, str(max_restarts), str(log), "--", *service(state)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env("100"))
    assert wait_for(lambda: (state / "heartbeat.log").exists()), "service never started"
    return sup, state, log


def test_killed_child_counts_as_crash(tmp_path):
    sup, state, log = _start_background(tmp_path)
    try:
        first = pids(state)[0]
        os.kill(int(first), signal.SIGKILL)
        assert wait_for(lambda: len(pids(state)) == 2 and "beat 2 1" in (state / "heartbeat.log").read_text())
        second = pids(state)[1]
        assert log_lines(log) == [f"START attempt=1 pid={first}", "EXIT attempt=1 status=137",
                                  "RESTART attempt=2 delay_ms=100", f"START attempt=2 pid={second}"]
        assert sup.poll() is None, "supervisor must keep running"
    finally:
        sup.kill()
        sup.wait()
        for p in pids(state):
            try:
                os.kill(int(p), signal.SIGKILL)
            except OSError:
                pass


def test_sigterm_stops_child_and_supervisor(tmp_path):
    sup, state, log = _start_background(tmp_path)
    try:
        child = int(pids(state)[0])
        time.sleep(0.3)
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=20) == 0
        assert "stopped 1" in (state / "heartbeat.log").read_text(), "SIGTERM not forwarded to the command"
        assert log_lines(log) == [f"START attempt=1 pid={child}", "STOP attempt=1"]
        time.sleep(0.5)
        assert len(pids(state)) == 1, "must not restart after SIGTERM"
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


@pytest.mark.parametrize("args", [
    [], ["3"], ["3", "log"], ["3", "log", "--"], ["x", "log", "--", "true"], ["-1", "log", "--", "true"],
    ["3", "log", "true"], ["3", "log", "-x", "true"],
])
def test_usage_errors_exit_2(tmp_path, args):
    _check_script()
    res = subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=20, cwd=tmp_path,
                         env=_env("100"))
    assert res.returncode == 2, (args, res.returncode)
    assert res.stderr.strip()
    assert not (tmp_path / "log").exists() or (tmp_path / "log").read_text() == ""
