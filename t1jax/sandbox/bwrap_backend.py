"""The bubblewrap backend: task images as layer dirs built from the Dockerfile subset
(t1jax.sandbox.dockerfile_subset) on a local rootfs, sandboxes as bwrap processes
(t1jax.sandbox.bwrap), a sandbox's changes against its image, and a reaper for what crashed
runs leave behind.

Separate from bwrap.py, as docker_backend.py is from docker.py: the sandbox is one running
shell and its limits; the backend is what lives on disk across sandboxes (the image cache,
snapshots, leftover run dirs).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import types
import uuid
from pathlib import Path

from t1jax.sandbox import dockerfile_subset as layers, images
from t1jax.sandbox.backend import SandboxSpec
from t1jax.sandbox.base import SandboxError, reapable
from t1jax.sandbox.bwrap import (CACHE, DEFAULT_PATH, BwrapSandbox, Cgroup, bwrap_argv,
                                 default_rootfs, rmtree, scan_tree)

log = logging.getLogger(__name__)


class BwrapBackend:
    """Images as layer dirs built from a Dockerfile subset; sandboxes as bwrap processes."""
    name = "bwrap"

    def __init__(self, rootfs: str | None = None, cache_dir=None, cgroups: bool = True,
                 as_factor: float = 4.0):
        self.rootfs = os.path.realpath(rootfs or default_rootfs())
        self.cache = Path(cache_dir or CACHE)
        self.images_dir, self.runs_dir = self.cache / "bwrap", self.cache / "bwrap-run"
        self.cgroups, self.as_factor = cgroups, as_factor
        self.warnings: list[str] = []

    def build(self, task) -> str:
        """The task's layer, cached by the content hash the Docker backend uses."""
        context = task.environment_dir or (task.dockerfile and task.dockerfile.parent)
        key = (images.context_hash(context, task.dockerfile, base_map={})[:12]
               if task.dockerfile else f"image-{images._slug(task.environment.docker_image or '')}")
        final = self.images_dir / f"{images._slug(task.task_id)}-{key}"
        tmp = self.images_dir / f".tmp-{os.getpid()}-{final.name}-{uuid.uuid4().hex[:6]}"
        try:
            if not final.is_dir():
                tmp.mkdir(parents=True)
                layers.copy_base(self.rootfs, str(tmp / "layer"))
                image = task.environment.docker_image
                meta = {"env": {}, "workdir": None, "user": None, "warnings": [
                    f"task {task.task_id}: image {image!r} is replaced by the local Debian "
                    "bookworm rootfs"] if image != layers.LOCAL_BASE else []}
                if task.dockerfile is not None:
                    meta = layers.build(task.dockerfile, context, str(tmp / "layer"),
                                        lambda *a: self._run_build(str(tmp / "layer"), task, *a))
                Path(tmp, "meta.json").write_text(json.dumps(
                    {**meta, "rootfs": self.rootfs, "task_id": task.task_id}, indent=1))
                with contextlib.suppress(OSError):  # a concurrent build may have won
                    os.rename(tmp, final)
        except OSError as err:
            raise SandboxError(f"task {task.task_id}: bwrap build failed: {err}") from err
        finally:
            rmtree(tmp)
        for warning in json.loads(Path(final, "meta.json").read_text())["warnings"]:
            if warning not in self.warnings:
                log.warning("%s", warning)
                self.warnings.append(warning)
        return str(final)

    def base_image(self) -> str:
        """The bare rootfs as an image (benchmarks, ad-hoc sandboxes)."""
        env = types.SimpleNamespace(docker_image=layers.LOCAL_BASE, build_timeout_sec=60)
        return self.build(types.SimpleNamespace(task_id="base", dockerfile=None,
                                                environment_dir=None, environment=env))

    def _run_build(self, layer: str, task, argv, env, workdir, user) -> tuple[int, str]:
        uid, gid, home = layers.user_ids(layer, user)
        full = bwrap_argv(layer, self.rootfs, env={"PATH": DEFAULT_PATH, "HOME": home, **env},
                          workdir=workdir, ids=(uid, gid)) + argv
        try:
            done = subprocess.run(full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, start_new_session=True,
                                  timeout=task.environment.build_timeout_sec)
        except subprocess.TimeoutExpired:
            return 124, f"timed out after {task.environment.build_timeout_sec:.0f}s"
        return done.returncode, done.stdout.decode(errors="replace")

    def create(self, spec: SandboxSpec) -> BwrapSandbox:
        return BwrapSandbox(
            spec.image, limits=spec.limits, workdir=spec.workdir, user=spec.user,
            network=spec.network, run_id=spec.run_id, environment=dict(spec.environment),
            readonly_mounts=dict(spec.readonly_mounts), cache_dir=self.cache,
            cgroups=self.cgroups, as_factor=self.as_factor).start()

    def changes(self, sandbox: BwrapSandbox) -> list[tuple[str, str]]:
        """Added/changed/deleted paths against the image layer (kind, mode, size, mtime,
        link target); mount points are left out."""
        skip = {"/" + "/".join(p) for p in layers.VIRTUAL} | set(sandbox.mount_points)
        before = scan_tree(os.path.join(sandbox.image, "layer"), skip)
        after = scan_tree(sandbox.root, skip)
        out = [("A", p) for p in after.keys() - before.keys()]
        out += [("D", p) for p in before.keys() - after.keys()]
        out += [("C", p) for p in after.keys() & before.keys() if after[p] != before[p]]
        return sorted(out, key=lambda change: change[1])

    def remove_image(self, image: str) -> None:
        if self.images_dir.resolve() not in Path(image).resolve().parents:
            raise SandboxError(f"{image} is not a bwrap image under {self.images_dir}")
        rmtree(Path(image))

    def reap(self, run_id: str | None = None) -> int:
        """Remove sandbox dirs (with their cgroups and processes) and snapshots of `run_id`, or
        of any run whose owning process on this host is dead, never a live other process's
        (`base.reapable`); returns how many."""
        removed = 0
        for path in _dirs(self.runs_dir) + _dirs(self.images_dir, "snap-"):
            try:
                owner = json.loads(Path(path, "owner.json" if path.parent == self.runs_dir
                                        else "meta.json").read_text())
                owner = owner.get("owner", owner)
            except (OSError, ValueError):
                owner = {}
            if _abandoned(owner, run_id):
                Cgroup(path.name).remove()
                rmtree(path)
                removed += 1
        for path in _dirs(self.images_dir, ".tmp-"):  # builds and snapshots cut short
            if run_id is None and _abandoned({"pid": path.name.split("-")[1]}, None):
                rmtree(path)
        return removed


def _abandoned(owner: dict, run_id: str | None) -> bool:
    return reapable(owner.get("run_id"), owner.get("host", socket.gethostname()),
                    owner.get("pid"), run_id)


def _dirs(parent: Path, prefix: str = "") -> list[Path]:
    return sorted(p for p in parent.glob(prefix + "*") if p.is_dir()) if parent.is_dir() else []
