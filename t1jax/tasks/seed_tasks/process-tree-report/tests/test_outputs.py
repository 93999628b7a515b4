import os
import signal
import subprocess
import time

import pytest

SCRIPT = "/app/ptree.sh"


def _stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return rest[0], int(rest[1])
    except (OSError, IndexError):
        return None


def alive(pid):
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().rstrip(b"\0").replace(b"\0", b" ").decode()


def children_map():
    kids = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            st = _stat(int(e))
            if st and st[0] != "Z":
                kids.setdefault(st[1], []).append(int(e))
    return kids


def expected_report(root):
    kids, out = children_map(), []

    def walk(pid, depth):
        out.append(f"{'  ' * depth}{pid} {_stat(pid)[1]} {cmdline(pid)}")
        for c in sorted(kids.get(pid, [])):
            walk(c, depth + 1)

    walk(root, 0)
    return out


def subtree(root):
    kids, out, todo = children_map(), [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def find(root, text):
    return [p for p in subtree(root) if cmdline(p) == text][0]


@pytest.fixture
def tree(tmp_path):
    log = tmp_path / "signals.log"
    env = dict(os.environ, LAUNCHER_SIGNAL_LOG=str(log))
    proc = subprocess.Popen(["python3", "/app/launcher.py"], stdout=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    line = proc.stdout.readline()
    assert line.startswith("READY"), line
    time.sleep(0.2)
    pids = subtree(proc.pid)
    assert len(pids) == 10
    yield proc, log
    for p in subtree(proc.pid) + pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    proc.wait(timeout=10)


def run(*args, timeout=60):
    assert os.path.isfile(SCRIPT) and os.access(SCRIPT, os.X_OK), "/app/ptree.sh missing or not executable"
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=timeout)


def test_report_whole_tree(tree):
    proc, _ = tree
    res = run("report", str(proc.pid))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == expected_report(proc.pid)


def test_report_subtree(tree):
    proc, _ = tree
    ingest = find(proc.pid, "python3 /app/launcher.py --role ingest")
    res = run("report", str(ingest))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines == expected_report(ingest)
    assert lines[0] == f"{ingest} {proc.pid} python3 /app/launcher.py --role ingest"
    deepest = [l for l in lines if l.endswith(" sleep 3602")]
    assert len(deepest) == 1 and deepest[0].startswith("      ") and deepest[0][6] != " "


def test_kill_subtree_term_then_kill(tree):
    proc, log = tree
    ingest = find(proc.pid, "python3 /app/launcher.py --role ingest")
    doomed = subtree(ingest)
    survivors = [p for p in subtree(proc.pid) if p not in doomed]
    assert len(doomed) == 6 and len(survivors) == 4
    t0 = time.monotonic()
    res = run("kill", str(ingest))
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    assert [p for p in doomed if alive(p)] == [], "subtree processes still alive"
    assert all(alive(p) for p in survivors), "processes outside the subtree were killed"
    # SIGTERM first (the parser logs and ignores it), SIGKILL only after the grace period
    roles = sorted(l.split()[0] for l in log.read_text().splitlines()) if log.exists() else []
    assert roles == ["ingest", "parser", "reader"], roles
    assert elapsed >= 2.5, f"SIGKILL after only {elapsed:.1f}s: the grace period after SIGTERM is 3 seconds"


def test_kill_other_subtree_with_term(tree):
    proc, log = tree
    api = find(proc.pid, "python3 /app/launcher.py --role api")
    doomed = subtree(api)
    survivors = [p for p in subtree(proc.pid) if p not in doomed]
    res = run("kill", str(api))
    assert res.returncode == 0, res.stderr
    assert not any(alive(p) for p in doomed)
    assert all(alive(p) for p in survivors)
    assert log.exists() and log.read_text().split()[0::3] == ["api"], "only api may get SIGTERM"


def test_kill_whole_tree(tree):
    proc, _ = tree
    everything = subtree(proc.pid)
    res = run("kill", str(proc.pid))
    assert res.returncode == 0, res.stderr
    assert not any(alive(p) for p in everything)
    assert alive(os.getpid())


def test_errors():
    dead = subprocess.Popen(["true"])
    dead.wait()
    for sub in ("report", "kill"):
        res = run(sub, str(dead.pid))
        assert res.returncode == 1, (sub, res.stderr)
        assert f"ptree: no such process: {dead.pid}" in res.stderr
    for args in ([], ["report"], ["explode", "1"], ["report", "abc"], ["kill", "-9"]):
        res = run(*args)
        assert res.returncode == 2, (args, res.returncode)
        assert res.stderr.strip()
