"""Bubblewrap sandbox: no daemon, one persistent shell per sandbox, Docker-like isolation.

An image is `~/.cache/t1jax/bwrap/<slug>-<hash12>/`: `meta.json` (env, workdir, user, rootfs)
and `layer/`, a root tree of the rootfs's small parts (/etc, /var but dpkg/apt state, /root,
/usr/local, ...) plus what the build added (see dockerfile_subset). A sandbox runs on its own
`cp -a` of the layer as a writable `/` (so `mkdir /data` works as in Docker) with the rootfs's
/usr (but /usr/local and /usr/src) and /var/lib/{apt,dpkg} bound read-only on top: a few MB
copied, not 350. So `apt-get install` fails under bwrap, as does chown to other users (the
user namespace maps one uid; USER is an identity, not a permission wall).

Isolation: every namespace unshared (user, pid, ipc, uts, cgroup; net unless spec.network), no
nested user namespaces, the capabilities Docker's sandbox keeps, nothing of the host visible
but spec.readonly_mounts. --die-with-parent follows the spawning *thread*, so bwrap is always
spawned from one long-lived thread.

Limits that hold: open files (RLIMIT_NOFILE), one file's size (RLIMIT_FSIZE = storage_mb), the
sandbox's total writes (measured while commands run: StorageQuotaExceeded), timeouts and output
caps (PersistentShell); as root with writable cgroup v1 controllers also memory+swap, pids and
CPU quota. Without cgroups, memory is capped only by RLIMIT_AS at `as_factor` x memory_mb
(address space: a JVM reserving much of it may fail), and pids and cpus are NOT enforced
(RLIMIT_NPROC would count every process of the host user). Replacing a stuck or exited shell
starts a new bwrap: unlike Docker, background jobs do not survive that.

One module at ~410 lines: a sandbox's isolation is one piece, the bwrap command line, the
cgroup, the host-side kill helper and the sandbox that spawns, watches and stops them, each
working on the others' pids and dirs. Building images, a sandbox's changes and the reaper
are t1jax/sandbox/bwrap_backend.py.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import time
import uuid
import warnings
from pathlib import Path

from t1jax.sandbox import dockerfile_subset as layers, images
from t1jax.sandbox.base import ExecResult, Limits, SandboxError
from t1jax.sandbox.docker import KEPT_CAPABILITIES
from t1jax.sandbox.shell import quote as shell_quote
from t1jax.sandbox.shell_sandbox import ShellSandbox

CACHE = Path.home() / ".cache" / "t1jax"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SPAWNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="t1jax-bwrap-spawn")
# JAX warns at every fork of its multithreaded process, and every sandbox, snapshot and copy
# here is a subprocess's fork + exec: 833 warnings in one main-job log, hiding its progress.
# That child runs only plain system calls before exec (rlimits and a cgroup write: _preexec),
# so the warning is silenced for subprocess's forks only; a fork anywhere else still warns.
warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning,
                        module="subprocess")


def default_rootfs() -> str:
    return os.environ.get("T1JAX_ROOTFS") or str(CACHE / "rootfs-bookworm")


def bwrap_argv(root: str, rootfs: str, *, env: dict, workdir: str, ids=(0, 0), network=False,
               mounts=(), info_fd: int | None = None) -> list[str]:
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--unshare-user",
            "--disable-userns", "--die-with-parent", "--new-session", "--hostname", "sandbox",
            "--bind", root, "/"] + (["--share-net"] if network else [])
    for parts in layers.READONLY:
        if os.path.isdir(os.path.join(rootfs, *parts)):
            argv += ["--ro-bind", os.path.join(rootfs, *parts), "/" + "/".join(parts)]
    for parts in layers.WRITABLE_UNDER_RO:
        if os.path.isdir(os.path.join(root, *parts)):
            argv += ["--bind", os.path.join(root, *parts), "/" + "/".join(parts)]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for host, parts in mounts:
        argv += ["--ro-bind", host, "/" + "/".join(parts)]
    if ids[0]:  # bwrap drops every capability of a non-root sandbox user
        argv += ["--uid", str(ids[0]), "--gid", str(ids[1])]
    elif os.geteuid() == 0:
        argv += ["--cap-drop", "ALL"]
        argv += [a for cap in KEPT_CAPABILITIES for a in ("--cap-add", f"CAP_{cap}")]
    argv += ["--clearenv", "--chdir", workdir or "/"]
    for key, value in env.items():
        argv += ["--setenv", key, str(value)]
    return argv + (["--info-fd", str(info_fd)] if info_fd is not None else [])


class Cgroup:
    """Per-sandbox cgroup v1 dirs, where we are root and the controllers are writable."""

    def __init__(self, name: str, limits: Limits | None = None):
        self.dirs = [p for c in ("memory", "pids", "cpu")
                     if os.path.isdir(p := f"/sys/fs/cgroup/{c}/t1jax/{name}")]
        self.memory = False
        if os.geteuid() != 0 or limits is None:
            return
        mem = limits.memory_mb * 2**20
        for ctrl, values in {"memory": {"memory.limit_in_bytes": mem,
                                        "memory.memsw.limit_in_bytes": mem},
                             "pids": {"pids.max": limits.pids},
                             "cpu": {"cpu.cfs_period_us": 100_000,
                                     "cpu.cfs_quota_us": int(limits.cpus * 100_000)}}.items():
            path = f"/sys/fs/cgroup/{ctrl}/t1jax/{name}"
            with contextlib.suppress(OSError):
                os.makedirs(path, exist_ok=True)
                self.dirs.append(path)
                for key, value in values.items():  # memsw needs swap accounting: may fail
                    with contextlib.suppress(OSError):
                        Path(path, key).write_text(str(value))
        self.memory = any("/memory/" in d for d in self.dirs)

    def enter(self) -> None:  # in the child before exec: plain system calls only
        for path in self.dirs:
            fd = os.open(path + "/cgroup.procs", os.O_WRONLY)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)

    def remove(self) -> None:
        for path in self.dirs:
            for _ in range(50):
                try:
                    for pid in Path(path, "cgroup.procs").read_text().split():
                        os.kill(int(pid), signal.SIGKILL)
                    os.rmdir(path)
                    break
                except (FileNotFoundError, ProcessLookupError):
                    break
                except OSError:  # busy until its processes are gone
                    time.sleep(0.05)
        self.dirs = []


class _Pipe:
    """Transport over bwrap's stdin/stdout; closing it ends the sandbox's processes."""

    def __init__(self, proc: subprocess.Popen, stop):
        self.proc, self.close = proc, stop
        os.set_blocking(proc.stdout.fileno(), False)

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        with contextlib.suppress(OSError, ValueError):  # shell gone: recv reports the end
            while view:
                view = view[os.write(self.proc.stdin.fileno(), view):]

    def recv(self) -> bytes | None:
        try:
            return os.read(self.fileno(), 1 << 16) or None
        except BlockingIOError:
            return b""


def kill_helper(anchor: int, args: list[str]) -> None:
    """shell.KILL_SCRIPT's logic, run from the host on /proc with namespace pids (`args`)
    mapped to host pids via NSpid. Not `nsenter ... /bin/sh -c KILL_SCRIPT`: that would run the
    agent's (writable) /bin/sh as real root with every capability, in reach of the host."""
    ns, procs = os.readlink(f"/proc/{anchor}/ns/pid"), {}  # host pid -> (ns pid, ppid, pgid)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, StopIteration):
            if os.readlink(f"/proc/{pid}/ns/pid") == ns:
                status = Path(f"/proc/{pid}/status").read_text().splitlines()
                nspid = next(ln for ln in status if ln.startswith("NSpid:")).split()[-1]
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                procs[int(pid)] = (int(nspid), int(fields[1]), int(fields[2]))
    host_of = {nspid: host for host, (nspid, _, _) in procs.items()}
    shell, keep = host_of.get(int(args[0])), {host_of.get(int(k)) for k in args[2:]}
    if shell is None:
        return
    if args[1] == "shell":
        os.kill(shell, signal.SIGKILL)
    for host, (_, ppid, pgid) in procs.items():
        if ppid == shell and pgid not in keep:
            with contextlib.suppress(ProcessLookupError):
                if pgid == procs[shell][2]:
                    os.kill(host, signal.SIGKILL)
                else:
                    os.killpg(pgid, signal.SIGKILL)


class BwrapSandbox(ShellSandbox):
    """A sandbox dir (a copy of an image's layer) and the bwrap running its shell; see
    `base.Sandbox` for the protocol. Its keywords (11) are a SandboxSpec's fields, which
    BwrapBackend.create passes one by one, plus the backend's cache and cgroup settings."""

    def __init__(self, image: str, *, limits: Limits = Limits(), workdir: str | None = "/app",
                 user: str | None = None, network: bool = False, run_id: str = "adhoc",
                 environment: dict | None = None, readonly_mounts: dict | None = None,
                 cache_dir=None, cgroups: bool = True, as_factor: float = 4.0):
        try:
            self.meta = json.loads(Path(image, "meta.json").read_text())
        except (OSError, ValueError) as err:
            raise SandboxError(f"{image} is not a bwrap image (build it first): {err}") from err
        self.image, self.limits, self.network, self.run_id = image, limits, network, run_id
        self.rootfs, self.user = self.meta["rootfs"], user or self.meta.get("user")
        self.workdir = workdir or self.meta.get("workdir") or "/"
        self.environment = {**self.meta.get("env", {}), **(environment or {})}
        self.readonly_mounts = dict(readonly_mounts or {})
        self.images_dir = Path(cache_dir or CACHE) / "bwrap"
        self.name = f"{images._slug(run_id)[:20]}-{uuid.uuid4().hex[:8]}"
        self.dir = Path(cache_dir or CACHE) / "bwrap-run" / self.name
        self.root = str(self.dir / "root")
        self._cgroups, self._as_factor, self._cgroup = cgroups, as_factor, None
        self._proc: subprocess.Popen | None = None
        self._anchor: int | None = None  # host pid of the sandbox's pid-namespace init
        self._mounts: list[tuple[str, tuple[str, ...]]] = []
        self._init_shell_state()

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> "BwrapSandbox":
        if shutil.which("bwrap") is None:
            raise SandboxError("bwrap (bubblewrap) is not installed: apt-get install bubblewrap")
        with self._closing_on_failure():
            self.dir.mkdir(parents=True)
            Path(self.dir, "owner.json").write_text(json.dumps(_owner(self.run_id)))
            layers.cp(str(Path(self.image, "layer")), self.root)
            for host, path in self.readonly_mounts.items():  # mount points, symlinks resolved
                if not os.path.exists(host):
                    raise SandboxError(f"read-only mount source {host} (for {path}) is missing")
                with layers.opened(self.root, path, create=True) as (target, parts):
                    if os.path.isdir(host):
                        os.makedirs(target, exist_ok=True)
                    elif not os.path.lexists(target):
                        Path(target).touch()
                self._mounts.append((os.path.realpath(host), parts))
            with self._writable(self.workdir) as target:
                os.makedirs(target, exist_ok=True)
            self._ids = layers.user_ids(self.root, self.user)
            self._cgroup = Cgroup(self.name, self.limits) if self._cgroups else None
            self._start_shell()
        return self

    def close(self) -> None:
        """End every process, remove the sandbox dir and cgroup; safe to call twice."""
        shell, self.shell = self.shell, None
        if shell is not None:
            shell.close()
        self._stop()
        group, self._cgroup = self._cgroup, None
        if group is not None:
            group.remove()
        rmtree(self.dir)

    # -- the protocol -------------------------------------------------------------------------
    def put(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write one file (parent directories created)."""
        with self._writable(path) as target:
            try:  # O_NONBLOCK: an agent's FIFO fails (ENXIO) rather than hanging us
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK,
                             mode)
            except OSError as err:
                raise SandboxError(f"cannot write {path} in sandbox {self.name}: {err}") from err
            with os.fdopen(fd, "wb") as out:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise SandboxError(f"{path} in sandbox {self.name} is not a regular file")
                os.ftruncate(fd, 0)
                out.write(data)
                os.fchmod(fd, mode)

    def put_dir(self, host_dir: str, path: str, mode: int | None = None) -> None:
        """Copy a host directory tree to `path` (used for /tests and /solution), file by file
        through the resolver: the agent's symlinks in `path` cannot redirect it to the host."""
        for dirpath, _, files in os.walk(host_dir):
            dest = os.path.normpath(os.path.join(path, os.path.relpath(dirpath, host_dir)))
            with self._writable(dest) as target:
                os.makedirs(target, exist_ok=True)
            for name in files:
                source = os.path.join(dirpath, name)
                self.put(f"{dest}/{name}", Path(source).read_bytes(),
                         os.stat(source).st_mode & 0o7777)

    def get(self, path: str) -> bytes:
        """A file's bytes; read-only system paths and mounts are read from their source."""
        parts = tuple(p for p in os.path.normpath("/" + path).split("/") if p)
        base, rel = (self.rootfs if layers.is_readonly(parts) else self.root), parts
        for host, mount in self._mounts:
            if parts[:len(mount)] == mount:
                base, rel = host, parts[len(mount):]
        with layers.opened(base, "/".join(rel)) as (target, _):
            with open(os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # a FIFO must not hang us
                    raise IsADirectoryError(f"{path} in sandbox {self.name} is not a file")
                return f.read()

    def snapshot(self) -> str:
        """Copy the sandbox's filesystem into a new image dir (the verifier starts from it)."""
        self._check_storage(force=True)
        dest = self.images_dir / f"snap-{self.name}-{uuid.uuid4().hex[:8]}"
        tmp = self.images_dir / f".tmp-{os.getpid()}-{dest.name}"
        try:
            tmp.mkdir(parents=True)
            layers.cp(self.root, str(tmp / "layer"))
            meta = {**self.meta, "snapshot_of": self.image, "owner": _owner(self.run_id)}
            Path(tmp, "meta.json").write_text(json.dumps(meta, indent=1))
            os.rename(tmp, dest)
        finally:
            rmtree(tmp)
        return str(dest)

    def cut_network(self) -> None:
        """A bwrap sandbox shares the host's network or has none, fixed at its start."""
        if self.network:
            raise SandboxError(f"bwrap sandbox {self.name} shares the host's network, which "
                               "cannot be taken from it while it runs (the offline verifier "
                               "needs that): use --config.verifier.where=snapshot")

    def fresh_exec(self, cmd: str, *, environment: dict, user: str | None, timeout: float,
                   max_output_bytes: int) -> ExecResult:
        """`cmd` as a new login to the sandbox runs it (see base.Sandbox): started from the
        agent's shell (a bwrap sandbox is that shell's namespace) but under `env -i` with the
        sandbox's starting environment plus `environment`, in its working directory, so none
        of the shell's variables, functions or directory carry over. It runs as the sandbox's
        one user: another `user` is refused (the snapshot verifier honours it)."""
        if user and user != (self.user or "root"):
            raise SandboxError(f"bwrap sandbox {self.name} runs as {self.user or 'root'}; it "
                               f"cannot start a command as {user} (the verifier's user): use "
                               "--config.verifier.where=snapshot")
        if self.shell is None:
            raise SandboxError("the sandbox is not running (call start() or use `with`)")
        env = {"PATH": DEFAULT_PATH, "HOME": self._ids[2], **self.environment,
               "TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat",
               "DEBIAN_FRONTEND": "noninteractive", **environment}
        line = (f"cd {shell_quote(self.workdir or '/')} && env -i "
                + " ".join(shell_quote(f"{k}={v}") for k, v in env.items())
                + f" bash --noprofile --norc -c {shell_quote(cmd)}")
        with self._lock:
            return self.shell.run(line, timeout, max_output_bytes=max_output_bytes)

    # -- helpers ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _writable(self, path: str):
        """A host path for `path` if the agent could write it; read-only ones fail clearly."""
        def check(parts):
            if layers.is_readonly(parts) or any(parts[:len(m)] == m for _, m in self._mounts):
                raise SandboxError(f"{path} is read-only in bwrap sandbox {self.name} (/usr but"
                                   " /usr/local and /usr/src, the dpkg/apt state, mounts are)")
        check(tuple(p for p in os.path.normpath("/" + path).split("/") if p))
        with layers.opened(self.root, path, create=True) as (target, parts):
            check(parts)
            yield target

    def _preexec(self) -> None:  # in the child between fork and exec
        nofile, fsize = self.limits.nofile, max(self.limits.storage_mb, 1) * 2**20
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if self._as_factor and not (self._cgroup and self._cgroup.memory):
            size = int(self.limits.memory_mb * self._as_factor) * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (size, size))
        if self._cgroup is not None:
            self._cgroup.enter()

    def _open_shell(self) -> _Pipe:
        self._stop()  # a replaced shell's namespace goes with it
        uid, gid, home = self._ids
        info_r, info_w = os.pipe()
        argv = bwrap_argv(self.root, self.rootfs, env={"PATH": DEFAULT_PATH, "HOME": home,
                                                      **self.environment},
                          workdir=self.workdir, ids=(uid, gid), network=self.network,
                          mounts=self._mounts, info_fd=info_w)
        try:
            self._proc = _SPAWNER.submit(
                subprocess.Popen, argv + ["/bin/bash", "--noprofile", "--norc"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                bufsize=0, cwd="/", pass_fds=(info_w,), preexec_fn=self._preexec,
                start_new_session=True, env={"PATH": os.environ.get("PATH", DEFAULT_PATH)},
            ).result()
        finally:
            os.close(info_w)
        self._anchor = _read_child_pid(info_r)
        return _Pipe(self._proc, self._stop)

    def _stop(self) -> None:
        proc, anchor, self._proc, self._anchor = self._proc, self._anchor, None, None
        if proc is None:
            return
        # The namespace's init first: its death ends the namespace and bwrap reaps it (no
        # zombie left to pid 1); then bwrap's process group, should bwrap linger. While bwrap
        # runs, its child's pid cannot have been reused.
        with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
            if anchor and proc.poll() is None:
                os.kill(anchor, signal.SIGKILL)
                proc.wait(timeout=2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stdin.close()
        proc.stdout.close()
        proc.wait()

    def _kill_helper(self, args: list[str]) -> None:
        if self._anchor is not None and self._proc is not None and self._proc.poll() is None:
            kill_helper(self._anchor, args)

    @property
    def mount_points(self) -> list[str]:
        """Where the read-only mounts sit in the sandbox (its changes leave them out)."""
        return ["/" + "/".join(parts) for _, parts in self._mounts]

    def disk_usage_bytes(self) -> int:
        return sum(st.st_blocks * 512 for st in scan_tree(self.root, set(), stats=True).values())


def _read_child_pid(fd: int) -> int | None:
    """bwrap's --info-fd JSON names the host pid of the sandbox's first process; bwrap closes
    the fd once written (or on failing), so reading to its end does not hang."""
    with open(fd, "rb") as info:
        data = info.read()
    with contextlib.suppress(ValueError, KeyError):
        return int(json.loads(data)["child-pid"])
    return None


def _owner(run_id: str) -> dict:
    return {"pid": os.getpid(), "run_id": run_id, "host": socket.gethostname()}


def scan_tree(root: str, skip: set[str], stats: bool = False) -> dict:
    """path -> (kind, mode, size, mtime or link target) for everything under `root`, or each
    path's lstat result with `stats`."""
    out, todo = {}, [""]
    while todo:
        rel = todo.pop()
        with contextlib.suppress(OSError):
            for entry in os.scandir(root + rel):
                path = f"{rel}/{entry.name}"
                if path in skip:
                    continue
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    todo.append(path)
                out[path] = st if stats else (
                    ("d", st.st_mode) if stat.S_ISDIR(st.st_mode) else
                    ("l", os.readlink(entry.path)) if stat.S_ISLNK(st.st_mode) else
                    ("f", st.st_mode, st.st_size, st.st_mtime_ns))
    return out


def rmtree(path) -> None:
    if not os.path.lexists(path):
        return
    try:
        shutil.rmtree(path)
    except OSError:  # an agent's `chmod 000` must not leave the dir behind (-R skips symlinks)
        subprocess.run(["chmod", "-R", "u+rwX", "--", str(path)], capture_output=True)
        shutil.rmtree(path, ignore_errors=True)
