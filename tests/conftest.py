"""Shared fixtures: a Docker backend for the real-container tests.

Where no Docker engine is reachable those tests skip, except in CI (T1JAX_REQUIRE_DOCKER=1),
where a missing engine is a failure rather than a silently green run.
"""

import os

# Before anything imports JAX: tests of sharded code see 8 host devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a slow test (real containers, long runs)")


@pytest.fixture(scope="session")
def docker_backend():
    from t1jax.sandbox.base import SandboxError
    try:
        from t1jax.sandbox.docker_backend import DockerBackend
        return DockerBackend()
    except (SandboxError, ImportError) as err:
        reason = f"Docker is unreachable: {err}"
        if os.environ.get("T1JAX_REQUIRE_DOCKER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
