"""Image layers for the bwrap backend, built by interpreting a subset of the Dockerfile language.

Why: without a Docker daemon there is no image builder, yet most task Dockerfiles only pick a
base, set a workdir and environment, copy files from the build context and run a few commands.
Those we interpret onto a layer (a root tree: the base rootfs's small, writable parts plus what
the build adds): FROM (one stage; any base stands for the local rootfs), ARG (substitution only),
ENV, WORKDIR, COPY/ADD (build-context files; ADD extracts local tar archives), RUN (through a
caller-given runner, without network), USER; CMD, ENTRYPOINT, LABEL, EXPOSE and other pure
metadata are ignored. Anything else, or a failing RUN, raises SandboxError naming the Dockerfile,
line and instruction, so the task's author sees what this backend cannot build.

Layout: a layer is a whole root tree except what the sandbox binds read-only from the rootfs
(READONLY: /usr but /usr/local and /usr/src, and the dpkg/apt state; left as empty mount points)
and the virtual /proc, /dev, /sys. `resolve` follows symlinks the way a process inside such a
root would, never out of it onto the host: COPY here and the sandbox's put/get/mounts rely on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import logging
import os
import posixpath
import re
import shlex
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import Callable

from t1jax.sandbox.base import SandboxError

log = logging.getLogger(__name__)
LOCAL_BASE = "t1jax/base:bookworm"
IGNORED = {"CMD", "ENTRYPOINT", "LABEL", "EXPOSE", "MAINTAINER", "HEALTHCHECK", "STOPSIGNAL"}
_VAR = re.compile(r"\\\$|\$(?:\{(\w+)(?::([-+])([^}]*))?\}|(\w+))")
_HEREDOC = re.compile(r"(?<!<)<<-?\s*[\"']?[A-Za-z_]\w*[\"']?")
# (argv, environment, workdir, user) -> (exit code, output)
Runner = Callable[[list[str], dict, str, "str | None"], "tuple[int, str]"]
READONLY = (("usr",), ("var", "lib", "apt"), ("var", "lib", "dpkg"))  # bound from the rootfs
WRITABLE_UNDER_RO = (("usr", "local"), ("usr", "src"))  # copied into the layer, bound rw
VIRTUAL = (("proc",), ("dev",), ("sys",))


def _under(parts, prefixes) -> bool:
    return any(tuple(parts[:len(p)]) == tuple(p) for p in prefixes)


def is_readonly(parts) -> bool:
    return _under(parts, READONLY + VIRTUAL) and not _under(parts, WRITABLE_UNDER_RO)


def cp(*args: str, unreadable_ok: bool = False) -> None:
    """`cp -a`; files vanishing meanwhile (a live sandbox) are fine, and with `unreadable_ok`
    so are files we may not read (a root-built rootfs's /etc/shadow, for a non-root user)."""
    done = subprocess.run(["cp", "-a", "--", *args], capture_output=True, text=True)
    ok = ("No such file or directory",) + (("Permission denied",) if unreadable_ok else ())
    lines = done.stderr.splitlines()
    if done.returncode != 0 and any(all(w not in ln for w in ok) for ln in lines):
        raise SandboxError(f"copying {args[:-1]} to {args[-1]} failed: {done.stderr[-1000:]}")
    if done.returncode != 0:
        log.warning("copying to %s skipped: %s", args[-1], "; ".join(lines)[:1000])


def copy_base(rootfs: str, layer: str) -> None:
    """The rootfs minus what is bound read-only or virtual (empty mount points stand in)."""
    def walk(src: str, dst: str, skip: set) -> None:
        os.mkdir(dst)
        shutil.copystat(src, dst)
        plain = []
        for name in sorted(os.listdir(src)):
            inner = {s[1:] for s in skip if s[0] == name and len(s) > 1}
            if inner:
                walk(os.path.join(src, name), os.path.join(dst, name), inner)
            elif (name,) in skip:
                os.mkdir(os.path.join(dst, name))
            else:
                plain.append(os.path.join(src, name))
        if plain:
            cp(*plain, dst, unreadable_ok=True)
    if not os.path.isfile(os.path.join(rootfs, "usr", "bin", "bash")):
        raise SandboxError(f"no base root filesystem at {rootfs} (T1JAX_ROOTFS): run "
                           "T1JAX_SKIP_DOCKER=1 scripts/setup.sh to build it")
    walk(rootfs, layer, set(READONLY + VIRTUAL))
    for parts in WRITABLE_UNDER_RO:
        if os.path.isdir(os.path.join(rootfs, *parts)):
            cp(os.path.join(rootfs, *parts), os.path.join(layer, *parts[:-1]))


def user_ids(root: str, user: str | None) -> tuple[int, int, str]:
    """(uid, gid, home) of `user` ("name", "uid", "name:group") from the root's /etc files."""
    def table(name, fields):
        try:
            path, _ = host_path(root, f"/etc/{name}")
            rows = [ln.split(":") for ln in Path(path).read_text().splitlines()]
        except OSError:
            return []
        return [r for r in rows if len(r) >= fields and r[2].isdigit()]
    if not user or user in ("root", "0"):
        return 0, 0, "/root"
    name, _, group = user.partition(":")
    row = next((r for r in table("passwd", 7) if name in (r[0], r[2])), None)
    if row is None and not name.isdigit() or group and not group.isdigit() and not any(
            group == r[0] for r in table("group", 3)):
        raise SandboxError(f"user {user!r} does not exist in the sandbox's /etc/passwd, group")
    uid, gid, home = ((int(row[2]), int(row[3]) if row[3].isdigit() else 0, row[5]) if row
                      else (int(name), int(name), "/"))
    if group:
        gid = int(group) if group.isdigit() else next(
            int(r[2]) for r in table("group", 3) if r[0] == group)
    return uid, gid, home


@dataclasses.dataclass(frozen=True)
class Instruction:
    lineno: int
    op: str
    args: str

    def __str__(self) -> str:
        text = f"{self.op} {self.args}".replace("\n", " ")
        return text if len(text) <= 120 else text[:117] + "..."


def parse(dockerfile: Path) -> list[Instruction]:
    """Instructions with the line each starts on (continuations joined, comments dropped)."""
    lines = dockerfile.read_text(errors="replace").splitlines()
    out, i = [], 0
    while i < len(lines):
        lineno, text = i + 1, lines[i]
        i += 1
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        while text.rstrip().endswith("\\") and i < len(lines):
            text = text.rstrip()[:-1]
            if not lines[i].lstrip().startswith("#"):
                text += lines[i]
            i += 1
        op, _, args = text.strip().partition(" ")
        out.append(Instruction(lineno, op.upper(), args.strip()))
    return out


def expand(text: str, env: dict) -> str:
    """Docker's variable substitution: $X, ${X}, ${X:-default}, ${X:+alt}, \\$ for a dollar."""
    def one(m: re.Match) -> str:
        if m.group(0) == "\\$":
            return "$"
        name = m.group(1) or m.group(4)
        value = env.get(name, "")
        if m.group(2) == "-":
            return value or m.group(3)
        if m.group(2) == "+":
            return m.group(3) if value else ""
        return value
    return _VAR.sub(one, text)


def resolve(root: str, path: str, *, create: bool = False) -> tuple[int, str, tuple[str, ...]]:
    """Walk `path` inside `root` as if `root` were `/`, following symlinks (absolute ones from
    `root`, `..` never above it) with directory fds, so no symlink, even one swapped in
    meanwhile, leads out. Returns (an fd of the parent directory, the last name, the resolved
    components); the caller closes the fd. `create` makes missing parent directories."""
    todo = [c for c in path.split("/") if c not in ("", ".")][::-1]
    stack, names, hops = [os.open(root, os.O_PATH | os.O_DIRECTORY)], [], 0
    try:
        while todo:
            name = todo.pop()
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                    names.pop()
                continue
            try:
                mode = os.stat(name, dir_fd=stack[-1], follow_symlinks=False).st_mode
            except FileNotFoundError:
                mode = None
            if mode is not None and stat.S_ISLNK(mode):
                hops += 1
                if hops > 40:
                    raise SandboxError(f"{path}: too many levels of symbolic links")
                target = os.readlink(name, dir_fd=stack[-1])
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop())
                        names.pop()
                todo.extend([c for c in target.split("/") if c not in ("", ".")][::-1])
                continue
            if not todo:
                return os.dup(stack[-1]), name, tuple(names + [name])
            if mode is None:
                if not create:
                    raise FileNotFoundError(f"{path} does not exist in the sandbox")
                os.mkdir(name, 0o755, dir_fd=stack[-1])
            stack.append(os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW,
                                 dir_fd=stack[-1]))
            names.append(name)
        return os.dup(stack[-1]), ".", tuple(names)
    finally:
        for fd in stack:
            os.close(fd)


@contextlib.contextmanager
def opened(root: str, path: str, create: bool = False):
    """`resolve` as (a host path through the pinned parent fd, the resolved components)."""
    fd, name, parts = resolve(root, path, create=create)
    try:
        yield f"/proc/self/fd/{fd}/{name}", parts
    finally:
        os.close(fd)


def host_path(root: str, path: str, create: bool = False) -> tuple[str, tuple[str, ...]]:
    """The host path of `path` inside `root` (while nothing runs in it) and its components."""
    with opened(root, path, create) as (_, parts):
        return os.path.join(root, *parts), parts


@dataclasses.dataclass
class _State:
    env: dict
    args: dict
    workdir: str = "/"
    user: str | None = None
    froms: int = 0


def build(dockerfile: Path, context: Path, layer: str, run: Runner) -> dict:
    """Interpret `dockerfile` onto `layer`; returns {env, workdir, user, warnings}."""
    state, warnings = _State(env={}, args={}), []
    for ins in parse(dockerfile):
        where = f"{dockerfile}:{ins.lineno}: {ins}"

        def fail(why: str) -> SandboxError:
            return SandboxError(f"bwrap build of {where}: {why}")

        try:
            _step(ins, state, context.resolve(), layer, run, fail, warnings,
                  f"{dockerfile}:{ins.lineno}")
        except SandboxError as err:
            if str(err).startswith("bwrap build of"):
                raise
            raise fail(str(err)) from err  # e.g. an unknown USER
        except (OSError, ValueError) as err:  # bad JSON or mode, unwritable target, ...
            raise fail(str(err)) from err
    return {"env": state.env, "workdir": state.workdir, "user": state.user,
            "warnings": warnings}


def _step(ins: Instruction, state: _State, context: Path, layer: str, run: Runner, fail,
          warnings: list, location: str) -> None:
    scope = {**state.args, **state.env}
    if ins.op == "FROM":
        words = [w for w in ins.args.split() if not w.startswith("--platform")]
        state.froms += 1
        if state.froms > 1:
            raise fail("multi-stage builds are unsupported by the bwrap backend")
        image = expand(words[0], scope) if words else ""
        if image != LOCAL_BASE:
            warnings.append(f"{location}: base image {image!r} is replaced by the local Debian"
                            " bookworm rootfs")
    elif ins.op == "ARG":
        name, eq, default = ins.args.partition("=")
        state.args[name.strip()] = expand(default.strip().strip("\"'"), scope) if eq else ""
    elif ins.op == "ENV":
        tokens = shlex.split(ins.args)
        if tokens and "=" not in tokens[0]:  # legacy `ENV KEY value with spaces`
            key, _, value = ins.args.partition(" ")
            pairs = [(key, value.strip())]
        else:
            pairs = [t.partition("=")[::2] for t in tokens]
        for key, value in pairs:
            state.env[key] = expand(value, {**state.args, **state.env})
    elif ins.op == "WORKDIR":
        state.workdir = posixpath.normpath(posixpath.join(state.workdir, expand(ins.args, scope)))
        target, parts = host_path(layer, state.workdir, create=True)
        if is_readonly(parts):
            raise fail(f"{state.workdir} is in a read-only system directory under bwrap")
        os.makedirs(target, exist_ok=True)
    elif ins.op in ("COPY", "ADD"):
        _copy(ins, state, context, layer, fail)
    elif ins.op == "RUN":
        if _HEREDOC.search(ins.args):
            raise fail("heredocs are unsupported by the bwrap backend")
        argv = json.loads(ins.args) if ins.args.startswith("[") else ["/bin/bash", "-c", ins.args]
        code, output = run(argv, scope, state.workdir, state.user)
        if code != 0:
            hint = ""
            if "Read-only file system" in output or re.search(r"\bapt(-get)?\b", ins.args):
                hint = (" (under bwrap /usr and the dpkg/apt state are read-only and there is"
                        " no network: system packages cannot be installed; put them in the"
                        " base rootfs or use the docker backend)")
            raise fail(f"exited with {code}{hint}:\n{output[-2000:]}")
    elif ins.op == "USER":
        state.user = expand(ins.args, scope)
        user_ids(layer, state.user)  # fails here, naming the line, if unknown
    elif ins.op not in IGNORED:
        raise fail(f"instruction {ins.op} is unsupported by the bwrap backend")


def _copy(ins: Instruction, state: _State, context: Path, layer: str, fail) -> None:
    """COPY/ADD from the build context: a directory's contents, a file, or (ADD) a tar's."""
    words = json.loads(ins.args) if ins.args.startswith("[") else ins.args.split()
    flags = [w for w in words if w.startswith("--")]
    words = [expand(w, {**state.args, **state.env}) for w in words if not w.startswith("--")]
    chmod = None
    for flag in flags:
        name, _, value = flag[2:].partition("=")
        if name == "chmod":
            chmod = int(value, 8)
        elif name not in ("chown", "link"):  # owners cannot be mapped in a user namespace
            raise fail(f"{ins.op} --{name} is unsupported by the bwrap backend")
    if len(words) < 2:
        raise fail(f"{ins.op} needs a source and a destination")
    *sources, dest = words
    dest_abs = posixpath.join(state.workdir, dest)
    matches = []
    for src in sources:
        if "://" in src:
            raise fail(f"{ins.op} from a URL is unsupported (no network); vendor the file")
        found = sorted(glob.glob(str(context / src.lstrip("/")))) or []
        if not found:
            raise fail(f"{src} is not in the build context {context}")
        for path in map(Path, found):
            if path.resolve() != context and context not in path.resolve().parents:
                raise fail(f"{src} is outside the build context {context}")
            matches.append(path)
    into_dir = dest.endswith("/") or len(matches) > 1 or any(p.is_dir() for p in matches)
    target, parts = host_path(layer, dest_abs, create=True)
    if is_readonly(parts):
        raise fail(f"{dest_abs} is in a read-only system directory under bwrap")
    for path in matches:
        if path.is_dir():
            os.makedirs(target, exist_ok=True)
            shutil.copytree(path, target, symlinks=True, dirs_exist_ok=True)
        elif ins.op == "ADD" and tarfile.is_tarfile(path):
            os.makedirs(target, exist_ok=True)
            with tarfile.open(path) as tar:
                tar.extractall(target, filter="data")
        else:
            out = os.path.join(target, path.name) if into_dir or os.path.isdir(target) else target
            os.makedirs(os.path.dirname(out), exist_ok=True)
            shutil.copy2(path, out, follow_symlinks=True)
            if chmod is not None:
                os.chmod(out, chmod)
