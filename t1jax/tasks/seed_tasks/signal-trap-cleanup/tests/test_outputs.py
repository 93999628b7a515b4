import glob
import os
import signal
import subprocess
import time

import pytest

SCRIPT = "/app/worker.sh"


@pytest.fixture
def dirs(tmp_path):
    tmp = tmp_path / "tmp"
    out = tmp_path / "out dir"
    tmp.mkdir()
    out.mkdir()
    return tmp, out


class Worker:
    """The script running in the background; stdout/stderr go to files (not pipes), so that
    a leftover child process holding them open cannot delay the test."""

    def __init__(self, dirs, count, delay):
        tmp, out = dirs
        logs = tmp.parent / "logs"
        logs.mkdir(exist_ok=True)
        self.out_path, self.err_path = logs / "stdout", logs / "stderr"
        env = dict(os.environ, TMPDIR=str(tmp))
        with open(self.out_path, "w") as o, open(self.err_path, "w") as e:
            self.p = subprocess.Popen([SCRIPT, str(out), str(count), str(delay)], env=env,
                                      stdin=subprocess.DEVNULL, stdout=o, stderr=e)

    def wait(self, timeout):
        try:
            return self.p.wait(timeout=timeout)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()

    def output(self):
        return self.out_path.read_text(), self.err_path.read_text()


def start(dirs, count, delay):
    return Worker(dirs, count, delay)


def wait_for(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def worker_dirs(tmp):
    return glob.glob(os.path.join(str(tmp), "worker.*"))


def run_sync(dirs, *args):
    tmp, _ = dirs
    env = dict(os.environ, TMPDIR=str(tmp))
    return subprocess.run([SCRIPT, *map(str, args)], env=env, capture_output=True, text=True, timeout=30)


def interrupt(dirs, sig):
    tmp, out = dirs
    w = start(dirs, 4, 10)
    try:
        assert wait_for(lambda: any(os.path.exists(os.path.join(d, "part-1.txt")) for d in worker_dirs(tmp))), \
            "no worker.XXXXXX directory with part-1.txt appeared in TMPDIR"
        wdir = worker_dirs(tmp)[0]
        time.sleep(0.2)
        t0 = time.monotonic()
        w.p.send_signal(sig)
        rc = w.wait(timeout=5)
        elapsed = time.monotonic() - t0
    finally:
        if w.p.poll() is None:
            w.p.kill()
    out_text, err_text = w.output()
    return rc, out_text, err_text, elapsed, wdir


def test_normal_run(dirs):
    tmp, out = dirs
    res = run_sync(dirs, out, 5, 0.05)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("tmpdir=") and lines[-1] == "done"
    wdir = lines[0][len("tmpdir="):]
    assert os.path.dirname(wdir) == str(tmp) and os.path.basename(wdir).startswith("worker.")
    assert not os.path.exists(wdir)
    assert os.listdir(tmp) == []
    assert (out / "result.txt").read_text() == "".join(f"item {i}\n" for i in range(1, 6))
    assert os.listdir(out) == ["result.txt"]


def test_sigint_cleans_up(dirs):
    tmp, out = dirs
    rc, stdout, stderr, elapsed, wdir = interrupt(dirs, signal.SIGINT)
    assert rc == 130
    assert "interrupted" in stderr
    assert elapsed < 2.5
    assert not os.path.exists(wdir) and os.listdir(tmp) == []
    assert os.listdir(out) == []
    assert stdout.splitlines()[0] == f"tmpdir={wdir}"


def test_sigterm_cleans_up(dirs):
    tmp, out = dirs
    (out / "result.txt").write_text("previous result\n")
    rc, _, stderr, elapsed, wdir = interrupt(dirs, signal.SIGTERM)
    assert rc == 143
    assert "terminated" in stderr
    assert elapsed < 2.5
    assert os.listdir(tmp) == []
    assert os.listdir(out) == ["result.txt"]
    assert (out / "result.txt").read_text() == "previous result\n"


def test_sighup_ignored(dirs):
    tmp, out = dirs
    w = start(dirs, 3, 0.5)
    assert wait_for(lambda: worker_dirs(tmp))
    time.sleep(0.2)
    w.p.send_signal(signal.SIGHUP)
    rc = w.wait(timeout=15)
    stdout, stderr = w.output()
    assert rc == 0, stderr
    assert stdout.splitlines()[-1] == "done"
    assert (out / "result.txt").read_text() == "item 1\nitem 2\nitem 3\n"
    assert os.listdir(tmp) == []


def test_bad_outdir(dirs):
    tmp, out = dirs
    res = run_sync(dirs, out / "missing", 2, 0)
    assert res.returncode == 1 and res.stderr.strip()
    (out / "file").write_text("x")
    assert run_sync(dirs, out / "file", 2, 0).returncode == 1
    assert os.listdir(tmp) == []


def test_usage_errors(dirs):
    tmp, out = dirs
    for args in ([], [out], [out, 2], [out, 2, 0, 1], [out, 0, 1], [out, "x", 1], [out, 2, "-1"], [out, 2, "soon"]):
        res = run_sync(dirs, *args)
        assert res.returncode == 2, args
    assert os.listdir(tmp) == [] and os.listdir(out) == []
