"""The bubblewrap sandbox with real bwrap processes: shell semantics, isolation, the Dockerfile
subset, snapshots, clean-up. Skips only where bwrap or the base rootfs is missing."""

import json
import os
import shutil
import textwrap
import threading
import time
import types
import uuid
from pathlib import Path

import pytest

from t1jax.sandbox.backend import SandboxSpec
from t1jax.sandbox.base import Limits, SandboxError, StorageQuotaExceeded

ROOTFS = os.environ.get("T1JAX_ROOTFS") or os.path.expanduser("~/.cache/t1jax/rootfs-bookworm")
pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed"),
    pytest.mark.skipif(not os.path.isfile(os.path.join(ROOTFS, "usr/bin/bash")),
                       reason=f"no base rootfs at {ROOTFS} (T1JAX_SKIP_DOCKER=1 scripts/setup.sh)"),
]
ROOT = os.geteuid() == 0


def make_task(tmp: Path, dockerfile: str, files: dict | None = None, task_id: str = "tiny"):
    env_dir = tmp / task_id / "environment"
    env_dir.mkdir(parents=True)
    (env_dir / "Dockerfile").write_text(textwrap.dedent(dockerfile).lstrip())
    for name, text in (files or {}).items():
        (env_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (env_dir / name).write_text(text)
    return types.SimpleNamespace(
        task_id=task_id, environment_dir=env_dir, dockerfile=env_dir / "Dockerfile",
        environment=types.SimpleNamespace(build_timeout_sec=60, docker_image=None))


TINY = """
    FROM t1jax/base:bookworm
    ARG WHO=world
    WORKDIR /app
    ENV GREETING="hello $WHO" \\
        MODE=test
    ENV LEGACY value with spaces
    COPY data.txt ./
    COPY src/ /app/src/
    RUN echo built > /app/built.txt && mkdir -p /data && echo "$GREETING" > /data/greet.txt
    CMD ["bash"]
"""


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from t1jax.sandbox.bwrap_backend import BwrapBackend
    return BwrapBackend(rootfs=ROOTFS, cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def image(backend, tmp_path_factory):
    files = {"data.txt": "data\n", "src/main.py": "print('hi')\n"}
    return backend.build(make_task(tmp_path_factory.mktemp("task"), TINY, files))


@pytest.fixture
def sandbox(backend, image):
    with backend.create(SandboxSpec(image=image, run_id="test-bwrap")) as sb:
        yield sb


# -- the persistent shell ---------------------------------------------------------------------

def test_state_persists_and_exit_codes(sandbox):
    assert sandbox.exec("cd /tmp && export GREETING2=hi && X=local").exit_code == 0
    assert sandbox.exec("pwd; echo $GREETING2 $X").output == "/tmp\nhi local\n"
    assert sandbox.exec("sleep 300 &").exit_code == 0
    assert sandbox.exec("jobs -r | wc -l").output.strip() == "1"
    assert sandbox.exec("f() { return 7; }; f").exit_code == 7
    assert sandbox.exec("echo oops >&2; false").output == "oops\n"
    assert sandbox.exec("cat").exit_code == 0  # stdin is /dev/null


def test_timeout_kills_command_and_shell_stays(sandbox):
    sandbox.exec("sleep 300 &")
    start = time.monotonic()
    result = sandbox.exec("echo started; sleep 30", timeout=1)
    assert result.timed_out and result.exit_code is None and not result.shell_restarted
    assert "timed out" in result.output
    assert time.monotonic() - start < 5
    assert sandbox.exec("ps -eo comm | grep -c '^sleep$'").output.strip() == "1"  # job kept
    assert sandbox.exec("echo alive").output == "alive\n"


def test_builtin_loop_replaces_shell(sandbox):
    sandbox.exec("cd /srv && export KEEP=me")
    result = sandbox.exec("while :; do :; done", timeout=1)
    assert result.timed_out and result.shell_restarted
    assert sandbox.exec("pwd; echo $KEEP").output == "/srv\nme\n"
    exited = sandbox.exec("exit 3")
    assert exited.shell_restarted and sandbox.exec("pwd").output == "/srv\n"


def test_sandbox_outlives_the_thread_that_made_it(backend, image):
    made = []
    maker = threading.Thread(target=lambda: made.append(backend.create(SandboxSpec(image=image))))
    maker.start()
    maker.join()
    with made[0] as sb:  # --die-with-parent follows the spawning thread, which is gone
        time.sleep(0.2)
        assert sb.exec("echo alive").output == "alive\n" and not sb.shell.restarts


def test_output_truncated(backend, image):
    spec = SandboxSpec(image=image, limits=Limits(max_output_bytes=1000))
    with backend.create(spec) as sb:
        result = sb.exec("seq 1 100000")
    assert result.truncated and result.exit_code == 0
    assert "output truncated" in result.output and result.output.endswith("100000\n")
    assert len(result.output) < 1200


# -- isolation --------------------------------------------------------------------------------

def test_no_network(sandbox):
    connect = "import socket; socket.create_connection(('1.1.1.1', 53), 2)"
    probe = sandbox.exec(f'python3 -c "{connect}"')
    assert probe.exit_code != 0 and "unreachable" in probe.output.lower()
    devices = sandbox.exec("tail -n +3 /proc/net/dev | cut -d: -f1").output.split()
    assert devices == ["lo"]


def test_host_files_invisible(sandbox, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("secret")
    assert sandbox.exec(f"test -e {secret}").exit_code == 1
    assert sandbox.exec(f"test -e {ROOTFS}").exit_code == 1
    assert sandbox.exec("ls -A /root/.ssh 2>/dev/null | wc -l").output.strip() == "0"
    assert sandbox.exec("ls /sys | wc -l").output.strip() == "0"


def test_readonly_system_dirs(sandbox):
    denied = sandbox.exec("touch /usr/bin/evil")
    assert denied.exit_code != 0 and "Read-only file system" in denied.output
    assert sandbox.exec("touch /usr/local/bin/ok /opt/ok /etc/ok && mkdir /newdir").exit_code == 0
    with pytest.raises(SandboxError, match="read-only"):
        sandbox.put("/usr/bin/evil", b"x")


def test_put_get_cannot_escape_through_symlinks(sandbox):
    name = f"t1jax-escape-{uuid.uuid4().hex[:8]}"
    sandbox.exec("ln -s ../../../../../../../../tmp /app/up && ln -s / /app/abs")
    sandbox.put(f"/app/up/{name}", b"inside")
    sandbox.put(f"/app/abs/tmp/{name}2", b"inside2")
    assert not os.path.exists(f"/tmp/{name}") and not os.path.exists(f"/tmp/{name}2")
    assert sandbox.exec(f"cat /tmp/{name} /tmp/{name}2").output == "insideinside2"
    assert sandbox.get("/app/abs/tmp/" + name) == b"inside"
    assert sandbox.get("/usr/bin/python3").startswith(b"\x7fELF")  # from the read-only rootfs
    with pytest.raises(FileNotFoundError):
        sandbox.get("/app/missing")
    sandbox.exec("mkfifo /app/fifo")
    with pytest.raises(OSError):  # not a hang
        sandbox.get("/app/fifo")
    with pytest.raises(SandboxError):
        sandbox.put("/app/fifo", b"x")


def test_put_dir_cannot_escape_through_symlinks(sandbox, tmp_path):
    victim, source = tmp_path / "victim", tmp_path / "source"
    victim.mkdir()
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "payload").write_text("x")
    sandbox.exec(f"mkdir -p /solution && ln -s {victim} /solution/sub")
    sandbox.put_dir(str(source), "/solution")
    assert list(victim.iterdir()) == []
    assert sandbox.exec("cat /solution/sub/payload").output == "x"


def test_readonly_mounts_and_put_dir(backend, image, tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("assert True\n")
    spec = SandboxSpec(image=image, readonly_mounts=((str(tmp_path / "tests"), "/tests"),))
    with backend.create(spec) as sb:
        assert sb.exec("cat /tests/test_x.py").output == "assert True\n"
        assert "Read-only" in sb.exec("touch /tests/new").output
        assert sb.get("/tests/test_x.py") == b"assert True\n"
        with pytest.raises(SandboxError):
            sb.put("/tests/new", b"x")
        sb.put_dir(str(tmp_path / "tests"), "/solution")
        assert sb.exec("ls /solution").output == "test_x.py\n"


def test_storage_limits(backend, image):
    with backend.create(SandboxSpec(image=image, limits=Limits(storage_mb=8))) as sb:
        big = sb.exec("head -c 10M /dev/zero > /tmp/big; echo $?; stat -c %s /tmp/big; rm /tmp/big")
        assert big.output.split()[-2:] == ["153", str(8 * 2**20)]  # RLIMIT_FSIZE: SIGXFSZ
        with pytest.raises(StorageQuotaExceeded):  # the whole sandbox
            sb.exec("for i in 1 2 3; do head -c 3M /dev/zero > /tmp/f$i; done; sleep 2")


@pytest.mark.skipif(not (ROOT and os.access("/sys/fs/cgroup/memory", os.W_OK)),
                    reason="cgroup v1 memory limits need root and a writable controller")
def test_cgroup_memory_and_pids(backend, image):
    with backend.create(SandboxSpec(image=image, limits=Limits(memory_mb=128, pids=32))) as sb:
        hog = sb.exec("python3 -c 'a = bytearray(512 * 2**20); print(len(a))'", timeout=30)
        assert hog.exit_code == 137
        forks = sb.exec("python3 -c \"import subprocess as s\nn = 0\ntry:\n  while n < 64:"
                        " s.Popen(['sleep', '9']); n += 1\nexcept OSError: print(n)\"")
        assert 0 < int(forks.output.split()[-1]) < 32
        cgroup = f"/sys/fs/cgroup/memory/t1jax/{sb.name}"
        assert os.path.isdir(cgroup)
    assert not os.path.exists(cgroup)


# -- building, snapshots, changes, clean-up ---------------------------------------------------

def test_build_subset(sandbox, backend, image, tmp_path):
    assert sandbox.exec("pwd; cat data.txt built.txt /data/greet.txt; echo $MODE").output == (
        "/app\ndata\nbuilt\nhello world\ntest\n")
    assert sandbox.exec("python3 src/main.py; echo $LEGACY").output == "hi\nvalue with spaces\n"
    meta = json.loads(Path(image, "meta.json").read_text())
    assert meta["workdir"] == "/app" and meta["warnings"] == []
    start = time.monotonic()
    again = backend.build(make_task(tmp_path, TINY, {"data.txt": "data\n",
                                                    "src/main.py": "print('hi')\n"}))
    assert again == image and time.monotonic() - start < 1  # cached by content
    dockerfile = "FROM ubuntu:24.04\nUSER nobody\nRUN id -un > /tmp/who\n"
    other = backend.build(make_task(tmp_path, dockerfile, task_id="ub"))
    assert "ubuntu:24.04" in json.loads(Path(other, "meta.json").read_text())["warnings"][0]
    with backend.create(SandboxSpec(image=other, workdir=None)) as sb:
        assert sb.exec("id -un; cat /tmp/who; pwd").output == "nobody\nnobody\n/\n"


@pytest.mark.parametrize("dockerfile, line, word", [
    ("FROM t1jax/base:bookworm\nWORKDIR /app\n\nSHELL [\"/bin/sh\", \"-c\"]\n", 4, "SHELL"),
    ("FROM t1jax/base:bookworm\nRUN true && \\\n    touch /usr/bin/evil\n", 2, "read-only"),
    ("FROM t1jax/base:bookworm\nADD https://example.com/x.tgz /app/\n", 2, "URL"),
])
def test_build_errors_name_the_line(backend, tmp_path, dockerfile, line, word):
    task = make_task(tmp_path, dockerfile, task_id=f"bad{line}")
    with pytest.raises(SandboxError) as err:
        backend.build(task)
    assert f"Dockerfile:{line}:" in str(err.value) and word in str(err.value)
    assert not list(Path(backend.images_dir).glob(".tmp-*"))


def test_snapshot_and_changes(backend, sandbox):
    sandbox.exec("echo agent > /app/agent.txt && rm /app/built.txt && echo x >> /app/data.txt")
    changes = backend.changes(sandbox)
    assert ("A", "/app/agent.txt") in changes and ("D", "/app/built.txt") in changes
    assert ("C", "/app/data.txt") in changes
    snap = sandbox.snapshot()
    try:
        with backend.create(SandboxSpec(image=snap)) as fresh:
            listing = fresh.exec("cat /app/agent.txt; ls /app").output
            assert listing == "agent\nagent.txt\ndata.txt\nsrc\n"
            assert all(path.startswith("/tmp/") for _, path in backend.changes(fresh))
    finally:
        backend.remove_image(snap)
    assert not os.path.exists(snap)
    with pytest.raises(SandboxError):
        backend.remove_image("/tmp")


def test_close_after_keyboard_interrupt(backend, image):
    with pytest.raises(KeyboardInterrupt):
        with backend.create(SandboxSpec(image=image)) as sb:
            sb.exec("sleep 300 &")
            anchor, directory = sb._anchor, sb.dir
            raise KeyboardInterrupt
    assert not directory.exists()
    time.sleep(0.2)
    assert not os.path.exists(f"/proc/{anchor}")
    sb.close()  # twice is fine


def test_reap_dead_owner(backend, image):
    stale = Path(backend.runs_dir) / "dead-run-0000"
    (stale / "root").mkdir(parents=True)
    (stale / "owner.json").write_text(json.dumps({"pid": 2**22 + 7, "run_id": "dead",
                                                  "host": os.uname().nodename}))
    with backend.create(SandboxSpec(image=image, run_id="alive")) as live:
        assert backend.reap() == 1 and not stale.exists() and live.dir.exists()
        assert backend.reap("alive") == 1 and not live.dir.exists()


def test_sandboxes_started_from_a_jax_process_do_not_warn_about_fork(image, tmp_path):
    # every sandbox is a subprocess fork + exec; with JAX initialized, each printed JAX's fork
    # warning (833 in one main-job log); a fork elsewhere must still warn
    import subprocess
    import sys
    child = textwrap.dedent(f"""
        import os, sys
        import jax
        jax.devices()  # JAX installs its at-fork warning with its backends
        from t1jax.sandbox.backend import SandboxSpec
        from t1jax.sandbox.bwrap_backend import BwrapBackend
        backend = BwrapBackend(rootfs={ROOTFS!r}, cache_dir={str(tmp_path)!r})
        for _ in range(2):
            with backend.create(SandboxSpec(image={image!r}, run_id="fork-warning")) as sb:
                assert sb.exec("echo ok").output.strip() == "ok"
        print("sandboxes done", file=sys.stderr, flush=True)
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    before, _, after = done.stderr.partition("sandboxes done")
    assert "os.fork() was called" not in before, before[-2000:]
    assert "os.fork() was called" in after
