"""Sandboxes for agent episodes: `make_backend` picks the implementation by name (here, so that
no backend module imports the module that chooses among them).

backend.py: the Backend protocol and SandboxSpec: build a task's environment once, then start
  many sandboxes from it or from another sandbox's snapshot.
base.py: the Sandbox protocol every backend implements, the limits a sandbox runs under, its
  results and errors.
bwrap.py: the bubblewrap sandbox: one persistent shell with Docker-like isolation and no daemon,
  for machines where Docker cannot run.
bwrap_backend.py: the bubblewrap backend: image layer dirs, sandboxes as bwrap processes,
  snapshots, and a reaper for what crashed runs leave.
docker.py: the Docker sandbox: one container per trial, no network, capped resources, one
  persistent shell.
docker_backend.py: the Docker backend: task images from Dockerfiles, containers, snapshots as
  committed images, and a reaper for what crashed runs leave.
dockerfile_subset.py: bwrap image layers built by interpreting a subset of the Dockerfile
  language, with no daemon; anything else fails naming the line.
images.py: task images built from Dockerfiles, cached by content hash, with public base images
  mapped to locally built stand-ins (no registry is reachable).
output.py: bounded head-and-tail capture of a command's output, and one way to clean it for a
  model.
overlay.py: a container's changes read from its overlayfs layers on disk, a cheaper `docker
  diff` for the verifier's tamper check.
shell.py: a persistent shell with sentinel-based completion, so `cd` and `export` last between
  commands and each command returns as soon as it ends.
shell_sandbox.py: what the Docker and bubblewrap sandboxes share: the shell, `exec` under the
  storage watchdog, and closing on every exit path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from t1jax.sandbox.backend import Backend


def make_backend(name: str, **options) -> Backend:
    """'docker' (default) or 'bwrap' (no daemon; for machines where Docker cannot run)."""
    if name == "docker":
        from t1jax.sandbox.docker_backend import DockerBackend
        return DockerBackend(**options)
    if name == "bwrap":
        from t1jax.sandbox.bwrap_backend import BwrapBackend
        return BwrapBackend(**options)
    raise ValueError(f"unknown sandbox backend {name!r} (config sandbox.backend): "
                     "use 'docker' or 'bwrap'")
