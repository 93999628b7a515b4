"""Escape and abuse suite: what a policy optimised against a reward might try, under both runtimes
(runc and gVisor). Each test asserts a concrete outcome (denied, contained, killed) and that the
host and a neighbouring sandbox are untouched. The sandbox issue's basic list (fork bomb, memory
hog, disk filler, output flood, loops, host files, network) is in test_sandbox_docker.py.
"""

import errno
import re
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from t1jax.sandbox.base import OutputBudgetExceeded
from t1jax.sandbox.docker import KEPT_CAPABILITIES, SHM_BYTES, storage_enforcement

pytestmark = pytest.mark.slow

AGENT_USER = "nobody"  # uid 65534 in every Debian image: a task's `[agent] user`
CAP_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6,
            "SETUID": 7}
SYSCALL = ("python3 -c \"import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True); "
           "r = libc.syscall({args}); print(r, ctypes.get_errno())\"")


def syscall(sb, *args) -> tuple[int, int]:
    """(return value, errno) of a raw syscall made inside the sandbox."""
    out = sb.exec(SYSCALL.format(args=", ".join(map(str, args))), timeout=60).output.split()
    return int(out[-2]), int(out[-1])


@pytest.fixture(scope="module")
def neighbour(docker_client, runtime):
    """Another sandbox on the same daemon, with a file and a background process to check."""
    from t1jax.sandbox.base import Limits
    from t1jax.sandbox.docker import DockerSandbox
    from t1jax.sandbox.images import LOCAL_BASE_IMAGE
    with DockerSandbox(LOCAL_BASE_IMAGE, limits=Limits(), client=docker_client,
                       run_id=f"test-neighbour-{uuid.uuid4().hex[:8]}", runtime=runtime) as sb:
        sb.exec("echo intact > /app/marker; nohup sleep 100000 >/dev/null 2>&1 &")
        yield sb


@pytest.fixture
def host_sentinel(tmp_path):
    """A host file and a host process the sandbox must not touch."""
    path = tmp_path / f"host-{uuid.uuid4().hex}"
    path.write_text("host")
    proc = subprocess.Popen(["sleep", "600"])
    yield path, proc
    proc.kill()


def assert_untouched(neighbour, host_sentinel):
    path, proc = host_sentinel
    assert path.read_text() == "host" and proc.poll() is None  # the host: its file, its process
    assert subprocess.run(["true"], timeout=10).returncode == 0  # it can still fork
    assert neighbour.exec("cat /app/marker").output == "intact\n"
    assert neighbour.exec("pgrep -x sleep >/dev/null && echo up").output == "up\n"
    assert neighbour.restarts == 0


@pytest.fixture
def root_box(make_sandbox):
    with make_sandbox(pids=128) as sb:
        yield sb


@pytest.fixture
def user_box(make_sandbox):
    with make_sandbox(pids=128, user=AGENT_USER) as sb:
        assert sb.exec("id -u").output == "65534\n"
        yield sb


# -- least privilege, as configured and as seen from inside --------------------------------------

def test_container_is_created_least_privileged(root_box, runtime, docker_client):
    host = root_box.container.attrs["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and sorted(host["CapAdd"]) == sorted(KEPT_CAPABILITIES)
    assert host["SecurityOpt"] == ["no-new-privileges"]  # and Docker's default seccomp profile
    assert not host["Privileged"] and host["NetworkMode"] == "none" and host["Init"]
    assert host["PidsLimit"] == 128 and host["Memory"] == host["MemorySwap"] == 2048 * 2**20
    assert host["NanoCpus"] == 10**9 and host["ShmSize"] == SHM_BYTES
    assert {u["Name"]: u["Hard"] for u in host["Ulimits"]}["nofile"] == 4096
    assert not host["Binds"] and not root_box.container.attrs["Mounts"]  # no host paths
    assert not host["Devices"] and host["Runtime"] == runtime
    if storage_enforcement(docker_client) == "kernel":
        assert int(host["StorageOpt"]["size"]) > 10240 * 2**20


def test_only_the_kept_capabilities_and_none_for_the_agent_user(root_box, user_box):
    want = sum(1 << CAP_BITS[c] for c in KEPT_CAPABILITIES)
    status = root_box.exec("grep -E '^Cap(Eff|Bnd)' /proc/self/status").output.split()
    assert int(status[1], 16) == want and int(status[3], 16) == want
    assert int(user_box.exec("grep CapEff /proc/self/status").output.split()[-1], 16) == 0
    # kept: what package installs need (chown, setuid to _apt); dropped: raw sockets, chroot
    assert root_box.exec("touch /app/f && chown nobody /app/f && "
                         "setpriv --reuid=65534 --regid=65534 --clear-groups id -u"
                         ).output == "65534\n"
    assert root_box.exec("chroot / true").exit_code != 0
    raw = "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'"
    assert "PermissionError" in root_box.exec(raw).output


def test_no_new_privileges_and_seccomp(root_box, runtime):
    status = root_box.exec("cat /proc/self/status").output
    if runtime == "runc":
        assert "NoNewPrivs:\t1" in status and "Seccomp:\t2" in status
        # the default profile denies new user namespaces (a common kernel attack surface)
        assert root_box.exec("unshare --user --map-root-user true").exit_code != 0
    else:
        # gVisor serves syscalls in its own user-space kernel (itself under a host seccomp
        # filter) and reports neither field; no-new-privileges is checked by the setuid test
        assert "gVisor" in root_box.exec("dmesg").output


def test_init_reaps_orphaned_zombies(root_box):
    assert root_box.exec("cat /proc/1/comm").output == "docker-init\n"
    root_box.exec("sh -c 'sleep 0.2 & exit 0'")  # the child is orphaned to PID 1, then exits
    time.sleep(1.5)
    states = root_box.exec("cat /proc/[0-9]*/stat 2>/dev/null | awk '{print $3}'").output.split()
    assert states and "Z" not in states


def test_open_files_limit(root_box):
    assert root_box.exec("ulimit -n").output == "4096\n"
    out = root_box.exec("python3 -c \"import os\nfs=[]\ntry:\n  while True: "
                        "fs.append(os.open('/dev/null', os.O_RDONLY))\nexcept OSError as e: "
                        "print(e.errno, len(fs))\"").output.split()
    assert int(out[0]) == errno.EMFILE and int(out[1]) < 4096


def test_cpu_quota_caps_a_busy_loop(make_sandbox, docker_client):
    with make_sandbox(cpus=0.5) as sb:
        def usage():
            return sb.container.stats(stream=False)["cpu_stats"]["cpu_usage"]["total_usage"]
        before, t0 = usage(), time.monotonic()
        sb.exec("for i in 1 2; do timeout 3 sh -c 'while :; do :; done' & done; wait", timeout=30)
        used_s, wall_s = (usage() - before) / 1e9, time.monotonic() - t0
        assert used_s <= 0.5 * wall_s * 1.25 + 0.3  # two busy loops, half a core between them


def test_no_docker_socket_and_no_host_mounts(root_box):
    assert root_box.exec("ls /var/run/docker.sock /run/docker.sock "
                         "/run/containerd/containerd.sock").exit_code != 0
    # Docker's own per-container files are the only bind mounts (hosts, hostname, resolv.conf)
    targets = root_box.exec("awk '{print $5}' /proc/self/mountinfo").output.split()
    binds = {t for t in targets if t.startswith("/etc/")}
    assert binds <= {"/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}
    assert not any(t.startswith(("/var/lib/docker", "/var/lib/t1jax", "/root", "/home", "/work"))
                   for t in targets)


def test_tests_are_read_only_at_verify_time(make_sandbox, tmp_path):
    (tmp_path / "test_outputs.py").write_text("def test_x():\n    assert True\n")
    with make_sandbox(readonly_mounts={str(tmp_path): "/tests"}) as sb:
        assert sb.exec("cat /tests/test_outputs.py").exit_code == 0
        assert sb.exec("echo hacked >> /tests/test_outputs.py").exit_code != 0
        assert sb.exec("rm /tests/test_outputs.py").exit_code != 0
        assert sb.exec("mount -o remount,rw /tests").exit_code != 0
    assert (tmp_path / "test_outputs.py").read_text() == "def test_x():\n    assert True\n"


# -- abuse: each contained, the host and the neighbour untouched ---------------------------------

def test_kill_everything_as_root(root_box, neighbour, host_sentinel):
    root_box.put("/app/kept.txt", b"kept")
    result = root_box.exec("kill -9 -1; sleep 1; echo survived")
    assert "survived" not in result.output  # every process in the sandbox died ...
    assert not result.timed_out  # ... seen at once (gVisor keeps the shell's stream open)
    assert root_box.exec("cat /app/kept.txt").output == "kept"  # ... and it came back, files kept
    assert root_box.restarts == 1 and root_box.shell.restarts >= 1
    assert_untouched(neighbour, host_sentinel)


def test_kill_everything_as_the_agent_user(user_box, neighbour, host_sentinel):
    user_box.exec("nohup sleep 1000 >/dev/null 2>&1 &")
    user_box.exec("kill -9 -1")  # only the user's own processes can be signalled
    assert user_box.exec("pgrep -u nobody -x sleep").exit_code != 0
    assert user_box.exec("echo alive").output == "alive\n" and user_box.restarts == 0
    assert user_box.exec("pgrep -u root -x sleep >/dev/null && echo up").output == "up\n"
    assert_untouched(neighbour, host_sentinel)


def test_host_environment_and_processes_are_invisible(user_box, root_box, runtime, neighbour,
                                                      host_sentinel):
    # PID 1's environment is the image's plus what we set: nothing of the host's or the daemon's
    names = {kv.split("=", 1)[0] for kv in
             root_box.exec("tr '\\0' '\\n' < /proc/1/environ").output.split()}
    assert names <= {"PATH", "HOSTNAME", "HOME", "TERM", "container"}, names
    if runtime == "runc":  # gVisor's /proc lets any user read it: it holds nothing secret
        assert user_box.exec("cat /proc/1/environ").exit_code != 0  # root's, not the user's
    pids = root_box.exec("ls /proc | grep -E '^[0-9]+$'").output.split()
    assert len(pids) < 20  # its own pid namespace: a handful, not the host's
    host_file, proc = host_sentinel
    assert root_box.exec(f"cat /proc/{proc.pid}/cmdline").output != "sleep\x00600\x00"
    assert root_box.exec(f"cat {host_file}").exit_code != 0
    root_of_1 = root_box.exec("cat /proc/1/root/etc/hostname")  # gVisor: denied
    assert root_of_1.exit_code != 0 or root_of_1.output == "sandbox\n"
    assert_untouched(neighbour, host_sentinel)


@pytest.mark.parametrize("who", ["root", "user"])
def test_mounting_filesystems_is_denied(who, root_box, user_box, neighbour, host_sentinel):
    sb = root_box if who == "root" else user_box
    for cmd in ("mount -t tmpfs none /mnt", "mount -t proc proc /mnt",
                "mount --bind / /mnt", "mount -o remount,rw /proc/sys",
                "mount -t sysfs sysfs /mnt"):
        result = sb.exec(cmd)
        assert result.exit_code != 0, (cmd, result.output)
    assert sb.exec("grep -c ' /mnt ' /proc/self/mounts").output == "0\n"
    assert_untouched(neighbour, host_sentinel)


def test_loading_kernel_modules_is_denied(root_box, neighbour, host_sentinel):
    modules = Path("/proc/modules")  # absent where the host kernel has no module support
    modules_before = modules.exists() and modules.read_text()
    # init_module (175) and finit_module (313) on x86_64; delete_module (176)
    for number, args in ((175, "0, 0, b''"), (313, "0, b'', 0"), (176, "b'btrfs', 0")):
        ret, err = syscall(root_box, number, args)
        assert ret == -1 and err in (errno.EPERM, errno.ENOSYS), (number, err)
    assert root_box.exec("modprobe dummy 2>&1; insmod /nonexistent.ko").exit_code != 0
    assert (modules.exists() and modules.read_text()) == modules_before
    assert_untouched(neighbour, host_sentinel)


def test_ptrace_of_other_processes_is_denied(user_box, root_box, neighbour, host_sentinel):
    root_pid = user_box.exec("pgrep -u root -x sleep").output.split()[0]
    ret, err = syscall(user_box, 101, 16, root_pid, 0, 0)  # ptrace(PTRACE_ATTACH, root's sleep)
    assert ret == -1 and err == errno.EPERM
    _, proc = host_sentinel
    ret, err = syscall(root_box, 101, 16, proc.pid + 100000, 0, 0)  # no such (host) process
    assert ret == -1 and err == errno.ESRCH
    assert_untouched(neighbour, host_sentinel)


def test_writes_to_sys_and_proc_sys_are_denied(root_box, neighbour, host_sentinel):
    knobs = [Path(p) for p in ("/proc/sys/kernel/pid_max", "/proc/sys/vm/overcommit_memory",
                               "/proc/sys/kernel/sysrq") if Path(p).exists()]
    before = [k.read_text() for k in knobs]
    for cmd in ("echo 4096 > /proc/sys/kernel/pid_max", "echo 2 > /proc/sys/vm/overcommit_memory",
                "echo 3 > /proc/sys/vm/drop_caches", "echo 1 > /proc/sysrq-trigger",
                "touch /sys/t1jax", "echo never > /sys/kernel/mm/transparent_hugepage/enabled"):
        assert root_box.exec(cmd).exit_code != 0, cmd
    assert [k.read_text() for k in knobs] == before
    assert_untouched(neighbour, host_sentinel)


def test_fork_bomb_as_the_agent_user(make_sandbox, runtime, neighbour, host_sentinel):
    with make_sandbox(pids=64, user=AGENT_USER) as sb:
        sb.exec("bomb() { bomb | bomb & }; bomb", timeout=3)
        time.sleep(1)
        assert subprocess.run(["true"], timeout=10).returncode == 0
        sb.exec("true", timeout=30)  # under gVisor the sandbox may go down here and restart
        n = sb.exec("n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo processes=$n")
        assert int(re.search(r"processes=(\d+)", n.output).group(1)) <= 64
        assert "alive" in sb.exec("echo alive").output.splitlines()  # amid the bomb's noise
    assert_untouched(neighbour, host_sentinel)


def test_filling_dev_shm_stops_at_its_size(root_box, neighbour, host_sentinel):
    result = root_box.exec("dd if=/dev/zero of=/dev/shm/fill bs=1M count=512", timeout=60)
    assert result.exit_code != 0 and "No space left on device" in result.output
    used = int(root_box.exec("du -sk /dev/shm/fill | cut -f1").output) * 1024
    assert used <= SHM_BYTES
    assert root_box.exec("echo alive").output == "alive\n"
    assert_untouched(neighbour, host_sentinel)


def test_setuid_binaries_do_not_raise_privileges(user_box, neighbour, host_sentinel):
    user_box._root_exec(["sh", "-c", "cp /usr/bin/id /usr/local/bin/suid-id && "
                         "chmod 4755 /usr/local/bin/suid-id"])
    assert user_box.exec("stat -c %A /usr/local/bin/suid-id").output.startswith("-rws")
    assert user_box.exec("/usr/local/bin/suid-id -u").output == "65534\n"  # no-new-privileges
    assert user_box.exec("chmod u+s /bin/sh").exit_code != 0
    assert_untouched(neighbour, host_sentinel)


def test_no_address_is_reachable(root_box, neighbour, host_sentinel):
    server = socket.create_server(("127.0.0.1", 0))  # a host service on loopback
    port = server.getsockname()[1]
    accepted = []
    server.settimeout(60)
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    neighbour.exec("nohup python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 & disown")
    time.sleep(1)
    assert neighbour.exec("python3 -c \"import urllib.request; "
                          "urllib.request.urlopen('http://127.0.0.1:8765', timeout=5)\"",
                          timeout=30).exit_code == 0  # it listens, inside its own namespace
    probe = "python3 -c \"import socket; socket.create_connection(('{}', {}), timeout=3)\""
    for address, p in (("127.0.0.1", port), ("127.0.0.1", 8765), ("172.17.0.1", 80),
                       ("10.0.2.2", 80), ("169.254.169.254", 80), ("8.8.8.8", 53)):
        assert root_box.exec(probe.format(address, p), timeout=30).exit_code != 0, address
    assert root_box.exec(probe.format("::1", port), timeout=30).exit_code != 0
    assert not accepted
    socket.create_connection(("127.0.0.1", port), timeout=5).close()  # the host itself can
    time.sleep(0.5)
    assert len(accepted) == 1
    server.close()
    neighbour.exec("pkill -f http.server")
    assert_untouched(neighbour, host_sentinel)


# -- budgets enforced from outside --------------------------------------------------------------

def test_no_trick_outlives_the_command_timeout(root_box, neighbour, host_sentinel):
    start = time.monotonic()
    result = root_box.exec("trap '' INT TERM HUP; setsid sh -c \"trap '' INT TERM HUP; "
                           "sleep 300\" & wait; sleep 300", timeout=2)
    assert result.timed_out and time.monotonic() - start < 20  # the host's clock, not theirs
    assert root_box.exec("date -s '2000-01-01'").exit_code != 0  # nor can they set the clock
    assert root_box.exec("echo alive").output == "alive\n"
    assert_untouched(neighbour, host_sentinel)


def test_output_budget_ends_the_episode(make_sandbox):
    with make_sandbox(episode_output_bytes=2**20) as sb:
        for _ in range(2):
            assert sb.exec("head -c 400000 /dev/zero | tr '\\0' x").output_bytes == 400_000
        with pytest.raises(OutputBudgetExceeded, match="printed 1200000 bytes, over its budget"):
            sb.exec("head -c 400000 /dev/zero | tr '\\0' x")


def test_background_floods_are_counted_and_stopped(make_sandbox, neighbour, host_sentinel):
    budget, kill = 5 * 2**19, 2**20  # 2.5 MiB an episode, 1 MiB a command
    with make_sandbox(episode_output_bytes=budget, kill_output_bytes=kill) as sb:
        # a flood in its own session, orphaned: the kill of a command's process groups does not
        # reach it, and it writes into the shell's output during later commands. Every byte that
        # arrives counts; it stops when the shell is replaced (its output channel closes) or the
        # episode's budget runs out, whichever comes first
        sb.exec("setsid sh -c 'sleep 0.5; yes flood' &")
        try:
            for _ in range(4):
                last = sb.exec("sleep 1; echo tick", timeout=10)
            assert last.output == "tick\n"  # the flood is gone
        except OutputBudgetExceeded:
            pass
        assert kill <= sb.output_bytes <= budget + kill + 2**16
    assert_untouched(neighbour, host_sentinel)
