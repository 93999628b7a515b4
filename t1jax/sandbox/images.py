"""Task images: built from a task's Dockerfile, cached by content hash, with public base images
mapped to locally built ones (no registry is reachable from a training cluster's sandbox hosts,
nor from this machine). The stand-ins are substituted in a rewritten Dockerfile at build time,
never tagged with the public names they stand in for: a later online run on the same daemon
must find (or pull) the real images.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path

from t1jax.sandbox.base import LABEL_OWNER, SandboxError

LOCAL_BASE_IMAGE = "t1jax/base:bookworm"  # Debian 12: Python 3.11, pytest, pip, `python`
TRIXIE_BASE_IMAGE = "t1jax/base:trixie"  # Debian 13: Python 3.13, pytest, pip, `python`
NOBLE_BASE_IMAGE = "t1jax/base:noble"  # Ubuntu 24.04: Python 3.12, pytest 7.4, pip, `python`
# Public bases common in Terminal-Bench 2.x tasks -> the local image that stands in for them
# (scripts/setup.sh builds them): the distribution and Python version the image names, a
# `python` command as the official python images have, and pytest for the offline verifier.
# "*" maps any other unresolvable base; set it to None to fail.
_PY313 = ("python:3.13", "python:3.13-slim", "python:3.13-slim-bookworm", "python:3.13-bookworm",
          "python:3.13-slim-trixie", "python:3.13-trixie", "debian:trixie", "debian:trixie-slim",
          "ghcr.io/laude-institute/t-bench/python-3-13:20250620")
_BOOKWORM = ("ubuntu:22.04", "debian:bookworm", "debian:bookworm-slim",
             "python:3.11", "python:3.11-slim", "python:3.11-slim-bookworm")
_UBUNTU_2404 = ("ubuntu:24.04", "ubuntu:noble",
                "ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624")
_PY312 = ("python:3.12", "python:3.12-slim", "python:3.12-slim-bookworm", "python:3.12-bookworm")
DEFAULT_BASE_MAP = {**{ref: TRIXIE_BASE_IMAGE for ref in _PY313},
                    **{ref: LOCAL_BASE_IMAGE for ref in _BOOKWORM},
                    **{ref: NOBLE_BASE_IMAGE for ref in _UBUNTU_2404 + _PY312}}
# The Ubuntu stand-in is built from archive.ubuntu.com, which a machine may not reach: where
# scripts/setup.sh could not build it, these Debian ones stand in, with a warning (and the
# verifier's stand-in notes name any Python version a test.sh asks for and does not get)
NOBLE_FALLBACK = {**{ref: LOCAL_BASE_IMAGE for ref in _UBUNTU_2404},
                  **{ref: TRIXIE_BASE_IMAGE for ref in _PY312}}
STAND_IN_BASES = (LOCAL_BASE_IMAGE, TRIXIE_BASE_IMAGE, NOBLE_BASE_IMAGE)
log = logging.getLogger(__name__)
_WARNED: set = set()
# what apt, pip, curl and git print when a build has no network
_NO_NETWORK = re.compile(r"Temporary failure resolving|Could not resolve|Name or service not "
                         r"known|Network is unreachable|Failed to establish a new connection|"
                         r"No address associated with hostname|Temporary failure in name "
                         r"resolution|unable to access 'https?://", re.I)
_FROM = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", re.I | re.M)


def base_images(dockerfile_text: str) -> list[str]:
    """External images a Dockerfile builds FROM (stage names excluded, ARG-free refs only)."""
    stages, bases = set(), []
    for match in _FROM.finditer(dockerfile_text):
        ref, alias = match.group(1), match.group(2)
        if ref.lower() not in stages and "$" not in ref:
            bases.append(ref)
        if alias:
            stages.add(alias.lower())
    return bases


def context_hash(context_dir: Path, dockerfile: Path, base_map: dict) -> str:
    """sha256 over every file (path, mode, bytes) of the build context, the Dockerfile and the
    base map, so any change to what would be built gives a new tag."""
    digest = hashlib.sha256()
    digest.update(json.dumps(base_map, sort_keys=True).encode())
    digest.update(b"dockerfile\0" + dockerfile.read_bytes())
    for path in sorted(p for p in Path(context_dir).rglob("*") if p.is_file()):
        rel = path.relative_to(context_dir).as_posix()
        digest.update(f"{rel}\0{os.stat(path).st_mode & 0o777}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _image_exists(client, ref: str) -> bool:
    import docker.errors
    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def _our_stand_in(client, ref: str) -> bool:
    """Whether `ref` in this daemon is one of our stand-in bases under a public name: what
    t1jax before issue #45 wrote (it tagged stand-ins with the names they stand in for).
    Such a tag is never used as the public image."""
    import docker.errors
    try:
        image_id = client.images.get(ref).id
    except docker.errors.ImageNotFound:
        return False
    ours = set()
    for stand_in in STAND_IN_BASES:
        if ref != stand_in and _image_exists(client, stand_in):
            ours.add(client.images.get(stand_in).id)
    return image_id in ours


def pull_missing(client, ref: str, where: str) -> None:
    """`ref` present locally, pulled from its registry if not (or if the local one is our
    stand-in under its name); a failed pull names the image and the offline alternative."""
    import docker.errors
    if _image_exists(client, ref) and not _our_stand_in(client, ref):
        return
    try:
        client.images.pull(ref)
    except docker.errors.APIError as err:
        raise SandboxError(f"{where}: pulling {ref!r} failed ({err}); on a machine without the "
                           "registry use the offline way: --config.sandbox.registry=False "
                           "(builds the Dockerfile on a local stand-in base)") from err


def stand_ins(client, dockerfile_text: str, base_map: dict, where: str) -> dict[str, str]:
    """{public base: the local image that stands in for it} for every FROM image that is not
    present locally (or is only our stand-in under its name). Nothing is tagged: the build
    substitutes them (build_task_image), so a public name in the user's daemon is never
    written or shadowed, and a later online run pulls the real image. Fails naming the
    Dockerfile and the image."""
    out = {}
    for ref in base_images(dockerfile_text):
        if _image_exists(client, ref) and not _our_stand_in(client, ref):
            continue
        target = base_map.get(ref, base_map.get("*"))
        if target is None:
            raise SandboxError(
                f"{where}: base image {ref!r} is not present locally and no registry is reachable;"
                f" build or load it, or map it to a local stand-in: "
                f"--config.sandbox.base_map={ref}={LOCAL_BASE_IMAGE} (Debian bookworm with "
                f"python3 and pytest; '*={LOCAL_BASE_IMAGE}' maps every unknown base)")
        if target == NOBLE_BASE_IMAGE and ref in NOBLE_FALLBACK \
                and not _image_exists(client, target):
            if (ref, target) not in _WARNED:  # once per run, not once per trial's build
                _WARNED.add((ref, target))
                log.warning("%s: base image %r maps to %s, which scripts/setup.sh could not "
                            "build here (archive.ubuntu.com unreachable?); %s stands in, with "
                            "another distribution and Python", where, ref, target,
                            NOBLE_FALLBACK[ref])
            target = NOBLE_FALLBACK[ref]
        if not _image_exists(client, target):
            raise SandboxError(f"{where}: base image {ref!r} maps to {target!r}, which is missing;"
                               " run scripts/setup.sh to build the sandbox base image")
        out[ref] = target
    return out


def substituted(dockerfile_text: str, replaced: dict[str, str]) -> str:
    """The Dockerfile with each replaced FROM image swapped for its stand-in (nothing else
    changes: stage names, platforms, the rest of the file)."""
    def swap(match: re.Match) -> str:
        ref = match.group(1)
        if ref not in replaced:
            return match.group(0)
        start, end = match.span(1)
        return (match.group(0)[:start - match.start()] + replaced[ref]
                + match.group(0)[end - match.start():])
    return _FROM.sub(swap, dockerfile_text)


def build_task_image(client, task_id: str, context_dir: Path, dockerfile: Path, *,
                     base_map: dict | None = None, network_mode: str = "none",
                     timeout_s: float = 600.0, pull: bool = False) -> str:
    """Build (or reuse) the image for a task; returns its tag `t1jax-task/<id>:<hash12>`.
    pull=True fetches missing bases from their registry instead of mapping them."""
    base_map = DEFAULT_BASE_MAP if base_map is None else base_map
    where = str(dockerfile)
    text = dockerfile.read_text()
    replaced = {}
    if pull:
        for ref in base_images(text):
            pull_missing(client, ref, where)
    else:
        replaced = stand_ins(client, text, base_map, where)
    # the base images' ids enter the hash: a rebuilt base invalidates every task image on it
    base_ids = {ref: client.images.get(replaced.get(ref, ref)).id for ref in base_images(text)}
    digest = context_hash(context_dir, dockerfile, {**base_map, "__base_ids__": base_ids})
    tag = f"t1jax-task/{_slug(task_id)}:{digest[:12]}"
    if _image_exists(client, tag):
        return tag
    relative = dockerfile.resolve().relative_to(Path(context_dir).resolve()).as_posix()
    import tempfile
    with tempfile.TemporaryDirectory(prefix="t1jax-dockerfile-") as scratch:
        if replaced:  # outside the context: docker-py adds it under a name .dockerignore hides
            relative = str(Path(scratch) / "Dockerfile")
            Path(relative).write_text(substituted(text, replaced))
        return _build(client, task_id, where, context_dir, relative, tag, network_mode,
                      timeout_s)


def _build(client, task_id: str, where: str, context_dir, dockerfile: str, tag: str,
           network_mode: str, timeout_s: float) -> str:
    import docker.errors
    try:
        client.images.build(path=str(context_dir), dockerfile=dockerfile, tag=tag,
                            rm=True, forcerm=True, pull=False, network_mode=network_mode,
                            labels={LABEL_OWNER: "t1jax", "t1jax.task": task_id},
                            timeout=int(timeout_s))
    except docker.errors.BuildError as err:
        log = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in err.build_log)
        hint = ""
        if network_mode == "none" and _NO_NETWORK.search(log + err.msg):
            hint = ("; the build reached for the network, which builds do not get by default: "
                    "--config.sandbox.build_network=host lets `docker build` use the host's")
        raise SandboxError(f"task {task_id}: building {where} failed: {err.msg}{hint}\n"
                           f"{log[-2000:]}")
    except docker.errors.APIError as err:
        raise SandboxError(f"task {task_id}: building {where} failed: {err}") from err
    return tag


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", text.lower()).strip("-.") or "task"
