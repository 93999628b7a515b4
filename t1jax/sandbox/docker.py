"""Docker sandbox: one container per trial, no network, capped resources, one persistent shell.

The container runs `sleep infinity` under Docker's init (which reaps zombies); the agent's shell is
a `docker exec` whose stdin/stdout we hold as a socket. Labels name the owning process so that
`reaper.reap()` removes what a killed run left behind.

Storage: on a daemon with the btrfs storage driver (T1JAX_STORAGE_QUOTA=1 scripts/setup.sh) the kernel caps
the container's writes (`--storage-opt size`, a btrfs qgroup); elsewhere only the watchdog in
ShellSandbox does, between its checks. Either way a sandbox over its quota raises
StorageQuotaExceeded. The runtime is the daemon's default (runc) or one it registers (runsc).
"""

from __future__ import annotations

import io
import os
import select
import socket
import struct
import tarfile
import time
import uuid
import weakref

from t1jax.sandbox import base, overlay
from t1jax.sandbox.base import ExecResult, Limits, SandboxError
from t1jax.sandbox.shell import KILL_SCRIPT
from t1jax.sandbox.shell_sandbox import ShellSandbox

# Capabilities kept: what `apt-get install` and `chown`-ing files inside a task need (apt drops
# to the _apt user: SETUID/SETGID; dpkg sets owners and modes: CHOWN/FOWNER/FSETID;
# root writing into other users' dirs: DAC_OVERRIDE) plus KILL, so the root kill helper can
# stop a timed-out command owned by a non-root agent user. Everything else is dropped.
KEPT_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL"]
SHM_BYTES = 64 * 2**20  # /dev/shm (tmpfs; its pages also count against the memory limit)
# btrfs counts the image's blocks in a container's qgroup, a little over the image's nominal
# size (565 MiB for a 540 MiB image here), so the cap is storage + image * 1.1 + slack.
BTRFS_IMAGE_FACTOR, BTRFS_SLACK_BYTES = 1.1, 32 * 2**20
SIZE_ATTEMPTS = 4  # a btrfs daemon at times answers SizeRw -1 (it could not count) for a moment
QUOTA_PROBE = ("head -c 1048576 /dev/zero > /.t1jax-quota-probe; code=$?; "
               "rm -f /.t1jax-quota-probe; exit $code")


_DAEMON_FACTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # client -> facts


def daemon_facts(client) -> dict:
    """The daemon's storage driver and registered runtimes, asked once per client (a client
    talks to one daemon; a new client asks again)."""
    facts = _DAEMON_FACTS.get(client)
    if facts is None:
        info = client.info()
        facts = {"driver": info.get("Driver", ""), "runtimes": sorted(info.get("Runtimes") or {})}
        _DAEMON_FACTS[client] = facts
    return facts


def storage_enforcement(client) -> str:
    """'kernel' where the daemon caps a container's writes (btrfs), else 'watchdog'."""
    return "kernel" if daemon_facts(client)["driver"] == "btrfs" else "watchdog"


def docker_client(timeout_s: float = 120.0):
    """A Docker client from the environment (DOCKER_HOST), or a clear error saying what to do."""
    import docker
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
        return client
    except Exception as err:  # the SDK raises several unrelated types here
        raise SandboxError(
            "cannot reach a Docker engine (DOCKER_HOST or /var/run/docker.sock): "
            f"{err}. Run scripts/setup.sh, or use sandbox.backend='bwrap'.") from err


class _ExecSocket:
    """Transport over a `docker exec` attach socket; demultiplexes Docker's 8-byte frames."""

    def __init__(self, raw):
        self._raw = raw
        self._sock: socket.socket = raw._sock
        self._sock.setblocking(False)
        self._buf = bytearray()

    def fileno(self) -> int:
        return self._sock.fileno()

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                sent = self._sock.send(view)
                view = view[sent:]
            except BlockingIOError:
                select.select([], [self._sock], [], 1.0)

    def recv(self) -> bytes | None:
        try:
            chunk = self._sock.recv(1 << 16)
        except BlockingIOError:  # nothing yet; not end of stream
            return b""
        if not chunk:
            return None
        self._buf += chunk
        return self._frames()

    def _frames(self) -> bytes:
        out = bytearray()
        while len(self._buf) >= 8:
            size = struct.unpack(">I", self._buf[4:8])[0]
            if len(self._buf) < 8 + size:
                break
            out += self._buf[8:8 + size]
            del self._buf[:8 + size]
        return bytes(out)

    def close(self) -> None:
        try:
            self._sock.close()
        finally:
            self._raw.close()


class _ChunkReader(io.RawIOBase):
    """A file over an iterator of byte chunks (Docker's archive stream) for tarfile's stream
    mode."""

    def __init__(self, chunks):
        self._chunks, self._rest = iter(chunks), memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._rest:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._rest = memoryview(chunk)
        n = min(len(buffer), len(self._rest))
        buffer[:n], self._rest = self._rest[:n], self._rest[n:]
        return n


class DockerSandbox(ShellSandbox):
    """A task container with a persistent shell. See `base.Sandbox` for the protocol.

    Its keywords (11) are a SandboxSpec's fields, which DockerBackend.create passes one by one,
    plus the backend's client, runtime and container name."""

    def __init__(self, image: str, *, limits: Limits = Limits(), workdir: str | None = "/app",
                 user: str | None = None, network: str | None = None, run_id: str = "adhoc",
                 runtime: str | None = None, environment: dict | None = None, client=None,
                 name: str | None = None, readonly_mounts: dict[str, str] | None = None):
        self.image = image
        self.limits = limits
        self.workdir = workdir
        self.user = user
        self.client = client or docker_client()
        self.container = None
        self._upperdir: str | None = None
        self._lowerdirs: list[str] | None = None
        self._init_shell_state()
        self.name = name or f"t1jax-{run_id[:20]}-{uuid.uuid4().hex[:8]}"
        labels = {base.LABEL_OWNER: "t1jax", base.LABEL_RUN: run_id,
                  base.LABEL_PID: str(os.getpid()), base.LABEL_HOST: socket.gethostname()}
        import docker.types
        storage_kb = max(limits.storage_mb, 1) * 1024
        self._create_kwargs = dict(
            image=image, command=["sleep", "infinity"], detach=True, init=True,
            name=self.name, labels=labels,
            network_mode=network or "none", working_dir=workdir or None,
            environment=environment or {}, hostname="sandbox",
            cap_drop=["ALL"], cap_add=KEPT_CAPABILITIES, security_opt=["no-new-privileges"],
            pids_limit=limits.pids, mem_limit=f"{limits.memory_mb}m",
            memswap_limit=f"{limits.memory_mb}m", nano_cpus=int(limits.cpus * 1e9),
            ulimits=[docker.types.Ulimit(name="nofile", soft=limits.nofile, hard=limits.nofile),
                     # per-file cap: one runaway file cannot outgrow the task's storage
                     docker.types.Ulimit(name="fsize", soft=storage_kb * 1024,
                                         hard=storage_kb * 1024)],
            volumes={host: {"bind": path, "mode": "ro"}
                     for host, path in (readonly_mounts or {}).items()},
            shm_size=SHM_BYTES, runtime=runtime or None, auto_remove=False)
        self.restarts = 0  # times the container itself stopped (all its processes killed)

    def create_options(self) -> dict:
        """The `docker run` settings of this sandbox: image, limits and every hardening option
        (benchmarks take options out of it to price each one)."""
        return dict(self._create_kwargs, storage_opt=self._storage_opt())

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> "DockerSandbox":
        import docker.errors
        facts = daemon_facts(self.client)
        runtime = self._create_kwargs["runtime"]
        if runtime and runtime not in facts["runtimes"]:
            raise SandboxError(
                f"the Docker daemon has no runtime {runtime!r} (it has {', '.join(facts['runtimes'])})"
                "; scripts/setup.sh registers runsc (gVisor) when it starts dockerd (BUILD.md, "
                "Sandbox security), or set sandbox.runtime=''")
        try:
            self.container = self.client.containers.run(**self.create_options())
        except docker.errors.DockerException as err:
            raise SandboxError(f"cannot start a sandbox from image {self.image}: {err}") from err
        with self._closing_on_failure():
            if self.workdir and self.user:  # Docker made a missing workdir, root's
                self._root_exec(["chown", self.user, self.workdir])
            self.container.reload()
            layers = (self.container.attrs.get("GraphDriver") or {}).get("Data") or {}
            upper = layers.get("UpperDir")
            self._upperdir = upper if upper and os.access(upper, os.R_OK) else None
            lowers = [d for d in (layers.get("LowerDir") or "").split(":") if d]
            self._lowerdirs = (lowers if self._upperdir and lowers
                               and all(os.access(d, os.R_OK) for d in lowers) else None)
            self._start_shell()
        return self

    def close(self) -> None:
        """Remove the container (and snapshot images nobody claimed); safe to call twice."""
        import docker.errors
        if self.shell is not None:
            self.shell.close()
            self.shell = None
        if self.container is not None:
            try:
                self.container.remove(force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.DockerException as err:
                raise SandboxError(f"could not remove sandbox {self.container.name}: {err}")
            finally:
                self.container = None

    # -- the protocol -------------------------------------------------------------------------
    def put(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write one file (parent directories created), owned by the agent user if any."""
        directory, name = os.path.split(path.rstrip("/"))
        self._root_exec(["mkdir", "-p", directory or "/"])
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        if not self.container.put_archive(directory or "/", archive.getvalue()):
            raise SandboxError(f"could not write {path} into sandbox {self.container.name}")
        if self.user:
            self._root_exec(["chown", self.user, path])

    def put_dir(self, host_dir: str, path: str, mode: int | None = None) -> None:
        """Copy a host directory tree to `path` (used for /tests and /solution)."""
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            tar.add(host_dir, arcname=os.path.basename(path.rstrip("/")))
        parent = os.path.dirname(path.rstrip("/")) or "/"
        self._root_exec(["mkdir", "-p", parent])
        self.container.put_archive(parent, archive.getvalue())

    def get(self, path: str) -> bytes:
        import docker.errors
        try:
            stream, _ = self.container.get_archive(path)
        except docker.errors.NotFound as err:
            raise FileNotFoundError(f"{path} does not exist in sandbox {self.container.name}") from err
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise IsADirectoryError(f"{path} in sandbox {self.container.name} is not a file")
            return tar.extractfile(member).read()

    def get_files(self, directory: str, names) -> dict[str, bytes]:
        """`ShellSandbox.get_files` in one archive call: the verifier reads its results this
        way (one call instead of three: 56 ms instead of 121 per trial here). `dir/.` follows
        a linked directory as a `get` of each file would; a linked file is left out."""
        import docker.errors
        try:
            stream, _ = self.container.get_archive(directory.rstrip("/") + "/.")
        except docker.errors.NotFound:
            return {}
        wanted, found = {f"./{name}": name for name in names}, {}
        with tarfile.open(fileobj=_ChunkReader(stream), mode="r|") as tar:
            for member in tar:  # a stream: the directory's other files are never held
                name = wanted.get(member.name)
                if name is not None and member.isfile():
                    found[name] = tar.extractfile(member).read()
        return found

    def changes(self) -> list[tuple[str, str]]:
        """(kind, path) the container added (A), changed (C) or deleted (D), as `docker diff`
        lists them: read from its overlay layers where this process can (a local daemon), at a
        few ms instead of the daemon's ~0.6 CPU-s (t1jax/sandbox/overlay.py)."""
        if self._lowerdirs:
            found = overlay.changes(self._upperdir, self._lowerdirs)
            if found is not None:
                return found
        kinds = {0: "C", 1: "A", 2: "D"}
        return [(kinds.get(c["Kind"], "?"), c["Path"]) for c in self.container.diff() or []]

    def snapshot(self) -> str:
        """Commit the container's filesystem to an image (the verifier starts from it)."""
        self._check_storage(force=True)
        image = self.container.commit(
            repository="t1jax-snapshot", tag=self.container.name,
            conf={"Labels": {base.LABEL_OWNER: "t1jax", base.LABEL_RUN:
                             self.container.labels.get(base.LABEL_RUN, ""),
                             base.LABEL_PID: str(os.getpid()),
                             base.LABEL_HOST: socket.gethostname()}})
        return image.id

    # -- helpers ------------------------------------------------------------------------------
    def _storage_opt(self) -> dict | None:
        """The kernel cap on the container's writes, where the daemon can enforce one."""
        if storage_enforcement(self.client) != "kernel":
            return None
        image_bytes = self.client.images.get(self.image).attrs["Size"]
        cap = (int(image_bytes * BTRFS_IMAGE_FACTOR) + self.limits.storage_mb * 2**20
               + BTRFS_SLACK_BYTES)
        return {"size": str(cap)}

    def _open_shell(self) -> _ExecSocket:
        # `kill -9 -1` as root kills `sleep infinity`, and with it the container: start it again
        # (the filesystem survives, processes do not), as a shell that exited is replaced.
        # A container whose last process just died can still read "running" for a moment, and
        # the exec is then refused (409): a SandboxError, so the shell's restart loop tries again.
        return self._exec_shell(self.user)

    def _exec_shell(self, user: str | None, environment: dict | None = None) -> _ExecSocket:
        """A shell exec'd as `user` (None: the image's), the container started again first if
        all its processes died (files kept)."""
        import docker.errors
        try:
            self.container.reload()
            if self.container.status != "running":
                self.restarts += 1
                self.container.start()
            return self._exec_socket(user, environment)
        except docker.errors.APIError as err:
            raise SandboxError(f"no shell could start in sandbox {self.container.name}: "
                               f"{err}") from err

    def _exec_socket(self, user: str | None, environment: dict | None) -> _ExecSocket:
        shell = ("if command -v bash >/dev/null; then exec bash --noprofile --norc; "
                 "else exec sh; fi")
        exec_id = self.client.api.exec_create(
            self.container.id, ["/bin/sh", "-c", shell], stdin=True, stdout=True,
            stderr=True, tty=False, user=user or "", workdir=self.workdir,
            environment=environment or None)["Id"]
        return _ExecSocket(self.client.api.exec_start(exec_id, socket=True))

    def cut_network(self) -> None:
        """Take every network from the running container (loopback stays): the offline
        verifier's tests never reach the network, even where the agent could."""
        import docker.errors
        self.container.reload()
        for name in (self.container.attrs.get("NetworkSettings") or {}).get("Networks") or {}:
            if name == "none":
                continue
            try:
                self.client.networks.get(name).disconnect(self.container, force=True)
            except docker.errors.DockerException as err:
                raise SandboxError(f"could not take network {name} from sandbox "
                                   f"{self.container.name}: {err}") from err

    def fresh_exec(self, cmd: str, *, environment: dict, user: str | None, timeout: float,
                   max_output_bytes: int) -> ExecResult:
        """`cmd` as Harbor's verifier runs it in the agent's container: a new `docker exec` as
        `user` (None: the image's), with the container's environment plus `environment`, in
        its working directory; none of the agent shell's state, and whatever the agent left
        running keeps running. Its output counts toward no episode budget."""
        return self._run_in_fresh_shell(lambda: self._exec_shell(user, environment), cmd,
                                        timeout, max_output_bytes)

    def _stopped(self) -> bool:
        import docker.errors
        try:
            self.container.reload()
        except docker.errors.DockerException:
            return False  # the daemon did not answer: the command's own timeout still applies
        return self.container.status != "running"

    def _root_exec(self, argv: list[str]) -> str:
        import docker.errors
        try:
            code, output = self.container.exec_run(argv, user="root")
        except docker.errors.APIError as err:  # e.g. the container stopped
            raise SandboxError(f"{argv[0]} could not run in sandbox {self.container.name}: "
                               f"{err}") from err
        if code != 0:
            raise SandboxError(f"{' '.join(argv)} failed in sandbox {self.container.name}: "
                               f"{output.decode(errors='replace')[-500:]}")
        return output.decode(errors="replace")

    def _kill_helper(self, args: list[str]) -> None:
        self._root_exec(["/bin/sh", "-c", KILL_SCRIPT, "kill-helper", *args])

    def _at_kernel_cap(self) -> bool:
        """A 1 MiB probe write as root fails with EDQUOT: the btrfs qgroup is full."""
        if storage_enforcement(self.client) != "kernel":
            return False
        code, output = self.container.exec_run(["/bin/sh", "-c", QUOTA_PROBE], user="root")
        return code != 0 and b"quota" in output.lower()

    def disk_usage_bytes(self) -> int | None:
        """Bytes the sandbox wrote: its overlay upper layer where we can read it (local root),
        else the daemon's SizeRw (btrfs, remote daemons; apparent sizes, so a sparse file counts
        in full)."""
        if self._upperdir is None:
            for attempt in range(SIZE_ATTEMPTS):  # -1: the daemon failed to count this time
                found = self.client.api.containers(all=True, size=True,
                                                   filters={"id": self.container.id})
                if not found:
                    return None
                size = int(found[0].get("SizeRw") or 0)
                if size >= 0:
                    return size
                time.sleep(0.2 * (attempt + 1))
            return None
        total = 0
        for root, _, files in os.walk(self._upperdir):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_blocks * 512
                except OSError:
                    pass
        return total
