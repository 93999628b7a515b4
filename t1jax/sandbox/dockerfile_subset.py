"""A subset of the Dockerfile language, interpreted onto a directory tree (the bwrap backend).

Why: without a Docker daemon there is no image builder, yet most task Dockerfiles only pick a
base, set a workdir and environment, copy files from the build context and run a few commands.
Those we interpret: FROM (one stage; any base stands for the local rootfs), ARG (for
substitution), ENV, WORKDIR, COPY/ADD (build-context files; ADD extracts local tar archives),
RUN (through a caller-given runner, without network), USER; CMD, ENTRYPOINT, LABEL, EXPOSE and
other pure metadata are ignored. Anything else, or a RUN that fails, raises SandboxError naming
the Dockerfile, line and instruction, so the task's author sees what this backend cannot build.

`resolve` is here too: COPY and the sandbox's put/get must follow symlinks the way a process
inside the root would, never out of it onto the host.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import posixpath
import re
import shlex
import shutil
import stat
import tarfile
from pathlib import Path
from typing import Callable

from t1jax.sandbox.base import SandboxError

LOCAL_BASE = "t1jax/base:bookworm"
IGNORED = {"CMD", "ENTRYPOINT", "LABEL", "EXPOSE", "MAINTAINER", "HEALTHCHECK", "STOPSIGNAL"}
_VAR = re.compile(r"\\\$|\$(?:\{(\w+)(?::([-+])([^}]*))?\}|(\w+))")
_HEREDOC = re.compile(r"(?<!<)<<-?\s*[\"']?[A-Za-z_]\w*[\"']?")
# (argv, environment, workdir, user) -> (exit code, output)
Runner = Callable[[list[str], dict, str, "str | None"], "tuple[int, str]"]


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


def host_path(root: str, path: str, create: bool = False) -> tuple[str, tuple[str, ...]]:
    """The host path of `path` inside `root` (for use while nothing runs inside), and its
    symlink-free components."""
    fd, _, parts = resolve(root, path, create=create)
    os.close(fd)
    return os.path.join(root, *parts), parts


@dataclasses.dataclass
class _State:
    env: dict
    args: dict
    workdir: str = "/"
    user: str | None = None
    froms: int = 0


def build(dockerfile: Path, context: Path, layer: str, run: Runner,
          readonly: Callable[[tuple[str, ...]], bool]) -> dict:
    """Interpret `dockerfile` onto `layer`; returns {env, workdir, user, warnings}."""
    state, warnings = _State(env={}, args={}), []
    context = context.resolve()
    for ins in parse(dockerfile):
        where = f"{dockerfile}:{ins.lineno}: {ins}"

        def fail(why: str) -> SandboxError:
            return SandboxError(f"bwrap build of {where}: {why}")

        scope = {**state.args, **state.env}
        if ins.op == "FROM":
            words = [w for w in ins.args.split() if not w.startswith("--platform")]
            state.froms += 1
            if state.froms > 1 or ins.args.upper().find(" AS ") >= 0 and state.froms > 1:
                raise fail("multi-stage builds are unsupported by the bwrap backend")
            image = expand(words[0], scope) if words else ""
            if image != LOCAL_BASE:
                warnings.append(f"{dockerfile}:{ins.lineno}: base image {image!r} is replaced "
                                f"by the local Debian bookworm rootfs")
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
            target, parts = host_path(layer, state.workdir + "/.", create=True)
            if readonly(parts):
                raise fail(f"{state.workdir} is in a read-only system directory under bwrap")
            os.makedirs(target, exist_ok=True)
        elif ins.op in ("COPY", "ADD"):
            _copy(ins, state, context, layer, readonly, fail)
        elif ins.op == "RUN":
            if _HEREDOC.search(ins.args):
                raise fail("heredocs are unsupported by the bwrap backend")
            argv = (json.loads(ins.args) if ins.args.startswith("[")
                    else ["/bin/bash", "-c", ins.args])
            code, output = run(argv, scope, state.workdir, state.user)
            if code != 0:
                hint = ""
                if "Read-only file system" in output or re.search(r"\bapt(-get)?\b", ins.args):
                    hint = (" (under bwrap /usr and the dpkg/apt state are read-only and there"
                            " is no network: system packages cannot be installed; put them in"
                            " the base rootfs or use the docker backend)")
                raise fail(f"exited with {code}{hint}:\n{output[-2000:]}")
        elif ins.op == "USER":
            state.user = expand(ins.args, scope)
        elif ins.op not in IGNORED:
            raise fail(f"instruction {ins.op} is unsupported by the bwrap backend")
    return {"env": state.env, "workdir": state.workdir, "user": state.user,
            "warnings": warnings}


def _copy(ins: Instruction, state: _State, context: Path, layer: str, readonly, fail) -> None:
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
    target, parts = host_path(layer, dest_abs + ("/." if into_dir else ""), create=True)
    if readonly(parts):
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
