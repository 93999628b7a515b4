import os
import signal
import subprocess
import time

import pytest

SCRIPT = "/app/daemon.sh"
# Time bounds are generous (several x what an idle machine needs): the verifier may share a
# loaded host, and a bound that an honest daemon can miss makes the reward noise.


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def session_id(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[3])


def wait_for(cond, timeout=10.0, step=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


class Env:
    def __init__(self, tmp_path, interval=1, message="tick"):
        self.dir = tmp_path
        self.conf = tmp_path / "svc.conf"
        self.pidfile = tmp_path / "run" / "svc.pid"
        self.log = tmp_path / "log" / "svc.log"
        self.write_conf(interval, message)
        self.env = dict(os.environ, DAEMON_CONF=str(self.conf), DAEMON_PIDFILE=str(self.pidfile),
                        DAEMON_LOG=str(self.log))
        self.pids = set()

    def write_conf(self, interval, message):
        self.conf.write_text(f"# test config\nINTERVAL={interval}\nMESSAGE={message}\n")

    def cmd(self, *args, timeout=15):
        p = subprocess.Popen([SCRIPT, *args], env=self.env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise AssertionError(f"daemon.sh {' '.join(args)} did not return within {timeout}s "
                                 "(is the daemon holding the caller's stdout/stderr?)")
        self.track()
        return p.returncode, out, err

    def pid(self):
        try:
            text = self.pidfile.read_text().strip()
            return int(text) if text else None
        except (FileNotFoundError, ValueError):
            return None

    def track(self):
        pid = self.pid()
        if pid:
            self.pids.add(pid)

    def lines(self):
        try:
            return self.log.read_text().splitlines()
        except FileNotFoundError:
            return []

    def cleanup(self):
        self.track()
        for pid in self.pids:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def svc(tmp_path):
    e = Env(tmp_path)
    yield e
    e.cleanup()


def start(svc):
    rc, out, err = svc.cmd("start", timeout=10)
    assert rc == 0, err
    pid = svc.pid()
    assert pid and alive(pid), "pidfile must name a live process after start"
    return pid


def test_start_detaches(svc):
    t0 = time.monotonic()
    pid = start(svc)
    assert time.monotonic() - t0 < 8, "start must return once the pidfile is written"
    assert session_id(pid) != session_id(os.getpid()), "daemon must run in its own session"
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null", "daemon stdin must be /dev/null"
    assert wait_for(lambda: f"started pid={pid}" in svc.lines())
    assert svc.lines()[0] == f"started pid={pid}"


def test_periodic_messages(svc):
    pid = start(svc)
    assert wait_for(lambda: svc.lines().count("tick") >= 3, timeout=10)
    assert set(svc.lines()) == {f"started pid={pid}", "tick"}


def test_status(svc):
    rc, out, _ = svc.cmd("status")
    assert (rc, out.strip()) == (3, "stopped")
    pid = start(svc)
    rc, out, _ = svc.cmd("status")
    assert (rc, out.strip()) == (0, f"running {pid}")
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not alive(pid))
    rc, out, _ = svc.cmd("status")
    assert (rc, out.strip()) == (3, "stopped")


def test_reload_on_sighup(svc):
    svc.write_conf(30, "tick")
    pid = start(svc)
    assert wait_for(lambda: "tick" in svc.lines())
    svc.write_conf(30, "tock tock")
    rc, _, err = svc.cmd("reload")
    assert rc == 0, err
    assert wait_for(lambda: "tock tock" in svc.lines(), timeout=6), svc.lines()
    lines = svc.lines()
    assert "reloaded" in lines and lines.index("reloaded") < lines.index("tock tock")
    assert svc.pid() == pid and alive(pid)
    os.kill(pid, signal.SIGHUP)
    assert wait_for(lambda: svc.lines().count("reloaded") == 2, timeout=6)


def test_stop_with_sigterm(svc):
    svc.write_conf(30, "tick")
    pid = start(svc)
    t0 = time.monotonic()
    rc, _, err = svc.cmd("stop")
    assert rc == 0, err
    assert time.monotonic() - t0 < 8, "SIGTERM must be handled promptly (INTERVAL is 30 s)"
    assert not alive(pid)
    assert not svc.pidfile.exists()
    assert svc.lines()[-1] == f"stopping pid={pid}"
    rc, _, err = svc.cmd("stop")
    assert rc == 1 and "not running" in err


def test_double_start_and_stale_pidfile(svc):
    pid = start(svc)
    rc, _, err = svc.cmd("start", timeout=10)
    assert rc == 1 and "already running" in err
    assert svc.pid() == pid
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not alive(pid))
    assert svc.pidfile.exists()
    new = start(svc)
    assert new != pid
    assert wait_for(lambda: f"started pid={new}" in svc.lines())


def test_run_foreground_exit_code(svc):
    svc.write_conf(30, "fg")
    p = subprocess.Popen([SCRIPT, "run"], env=svc.env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    svc.pids.add(p.pid)
    try:
        assert wait_for(lambda: svc.pid() == p.pid and "fg" in svc.lines()), \
            "run must write its own PID to the pidfile"
        time.sleep(0.3)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=8) == 0
        assert svc.lines() == [f"started pid={p.pid}", "fg", f"stopping pid={p.pid}"]
        assert not svc.pidfile.exists()
    finally:
        if p.poll() is None:
            p.kill()


def test_usage_and_reload_errors(svc):
    assert svc.cmd()[0] == 2
    assert svc.cmd("restart-now")[0] == 2
    rc, _, err = svc.cmd("reload")
    assert rc == 1 and "not running" in err
