"""Sandboxes for agent episodes: `make_backend` picks the implementation by name (here, so that
no backend module imports the module that chooses among them)."""

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
