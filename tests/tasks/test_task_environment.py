"""A task's own environment, as Harbor gives it, on Docker and on bubblewrap: the image's WORKDIR
(or `[environment] workdir`) for the agent, the oracle and the verifier; `[environment.env]`
everywhere, `[verifier.env]` only for the tests, `[solution.env]` only for solve.sh; test.sh's
own set-up steps before its tests; and no variables of ours in the tests' environment."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from t1jax.tasks.task import load_task
from t1jax.curation.validate import run_episode
from t1jax.verify.reward import GlobalScale
from t1jax.rollout.trial import TrialSite

ROOTFS = os.environ.get("T1JAX_ROOTFS") or os.path.expanduser("~/.cache/t1jax/rootfs-bookworm")

TASK_TOML = """schema_version = "1.1"

[verifier]
timeout_sec = 60.0

[verifier.env]
ONLY_VERIFIER = "v"

[environment]
{workdir_key}

[environment.env]
EVERYWHERE = "e"

[solution.env]
ONLY_SOLUTION = "s"
"""
SOLVE_SH = """#!/bin/bash
echo "$EVERYWHERE ${ONLY_SOLUTION:-} $PWD" > answer.txt
"""
# set-up before the tests (as cancel-async-tasks copies a file into /app), a refusal to run from /
TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
if [ "$PWD" = "/" ]; then echo "Error: No working directory set."; exit 1; fi
cp /tests/helper.py "$PWD/helper.py"
python3 -m pytest -p no:cacheprovider -rA --junitxml=/logs/verifier/junit.xml /tests/test_outputs.py
if [ $? -eq 0 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
TESTS = """
import os
import subprocess
import sys

WORKDIR = {workdir!r}


def test_solution_saw_its_env_in_the_workdir():
    assert open(os.path.join(WORKDIR, "answer.txt")).read().split() == ["e", "s", WORKDIR]


def test_verifier_env_and_cwd():
    assert os.getcwd() == WORKDIR
    assert os.environ.get("ONLY_VERIFIER") == "v" and os.environ.get("EVERYWHERE") == "e"
    assert "ONLY_SOLUTION" not in os.environ


def test_invariant_no_variables_of_ours():
    # a subprocess importing a file test.sh set up in the working directory (PYTHONSAFEPATH,
    # once set by our verifier, broke exactly this)
    assert "PYTHONSAFEPATH" not in os.environ and "PYTHONNOUSERSITE" not in os.environ
    done = subprocess.run([sys.executable, "-c", "import helper; print(helper.X)"],
                          cwd=WORKDIR, capture_output=True, text=True)
    assert done.stdout.strip() == "42", done.stderr
"""


def write_task(root: Path, name: str, *, dockerfile_workdir: str, toml_workdir: str | None):
    d = root / name
    files = {
        "task.toml": TASK_TOML.format(workdir_key=f'workdir = "{toml_workdir}"'
                                      if toml_workdir else ""),
        "instruction.md": "Write answer.txt.\n",
        "environment/Dockerfile": f"FROM t1jax/base:bookworm\nWORKDIR {dockerfile_workdir}\n",
        "solution/solve.sh": SOLVE_SH,
        "tests/test.sh": TEST_SH,
        "tests/helper.py": "X = 42\n",
        "tests/test_outputs.py": TESTS.format(workdir=toml_workdir or dockerfile_workdir),
    }
    for rel, text in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return load_task(d)


@pytest.fixture(scope="module", params=["docker", "bwrap"])
def backend(request, tmp_path_factory):
    if request.param == "docker":
        return request.getfixturevalue("docker_backend")
    if shutil.which("bwrap") is None or not os.path.isfile(os.path.join(ROOTFS, "usr/bin/bash")):
        pytest.skip(f"bwrap or its rootfs ({ROOTFS}) missing")
    from t1jax.sandbox.bwrap_backend import BwrapBackend
    return BwrapBackend(rootfs=ROOTFS, cache_dir=tmp_path_factory.mktemp("bwrap-cache"))


@pytest.mark.parametrize("dockerfile_workdir, toml_workdir", [
    ("/workspace", None),  # the Dockerfile's WORKDIR, not /app
    ("/app", "/srv/work"),  # [environment] workdir overrides it
])
def test_task_environment_as_harbor_gives_it(backend, tmp_path, dockerfile_workdir, toml_workdir):
    task = write_task(tmp_path, "envtask", dockerfile_workdir=dockerfile_workdir,
                      toml_workdir=toml_workdir)
    site = TrialSite(backend, run_id="test-task-env", scale=GlobalScale(3, "test"))
    oracle = run_episode(task, "oracle", site)
    assert oracle.error is None, oracle.report and oracle.report.log
    assert {a.name.split("::")[-1]: a.status for a in oracle.report.assertions} == {
        "test_solution_saw_its_env_in_the_workdir": "passed",
        "test_verifier_env_and_cwd": "passed", "test_invariant_no_variables_of_ours": "passed"}
    nothing = run_episode(task, "nothing", site)
    statuses = {a.name.split("::")[-1]: a.status for a in nothing.report.assertions}
    assert statuses["test_solution_saw_its_env_in_the_workdir"] == "failed"
    assert statuses["test_invariant_no_variables_of_ours"] == "passed"


NET_TESTS = """
import os


def test_network_interfaces():
    assert sorted(os.listdir("/sys/class/net")) == {expected!r}
"""


@pytest.mark.parametrize("allow_network, allow_internet, mode, expected", [
    (True, True, "script", ["eth0", "lo"]),  # online: test.sh may download its tools
    (True, False, "script", ["lo"]),  # the task says no
    (False, True, "script", ["lo"]),  # the run says no (the default)
    (True, True, "offline", ["lo"]),  # offline: the stand-ins, never the network
])
def test_the_verifier_gets_the_network_as_harbor_gives_it(docker_backend, tmp_path,
                                                         allow_network, allow_internet, mode,
                                                         expected):
    """The tests run with the network exactly when the run and the task both allow it, as the
    agent does (Harbor runs test.sh in the task's container). The network here is an internal
    Docker network: nothing can leave the machine."""
    from t1jax.sandbox.docker_backend import DockerBackend
    from t1jax.verify.verifier import VerifierSettings
    client = docker_backend.client
    name = f"t1jax-test-internal-{os.getpid()}"
    network = client.networks.create(name, internal=True)
    try:
        backend = DockerBackend(network_name=name)
        d = tmp_path / "net"
        for rel, text in {
            "task.toml": f"[environment]\nallow_internet = {str(allow_internet).lower()}\n",
            "instruction.md": "Nothing.\n",
            "environment/Dockerfile": "FROM t1jax/base:bookworm\nWORKDIR /app\n",
            "tests/test.sh": TEST_SH.replace('cp /tests/helper.py "$PWD/helper.py"\n', ""),
            "tests/test_outputs.py": NET_TESTS.format(expected=expected),
        }.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)
        task = load_task(d)
        site = TrialSite(backend, run_id="test-task-net", allow_network=allow_network,
                         scale=GlobalScale(1, "t"))
        result = run_episode(task, "nothing", site, VerifierSettings(mode))
        assert result.error is None and result.report.solved, result.report.log[-2000:]
    finally:
        backend.reap("test-task-net")
        network.remove()
