"""Verifier tests on real containers: scoring (dense, partial, binary fallback, CTRF over JUnit),
the offline mode, timeouts, Terminal-Bench 1 tasks, verification in the agent's own container
(Harbor's way: a service the solution started answers the tests) and in a snapshot's (clean-up),
and the tamper defences: whatever an agent does to the tests, the results files or the test
toolchain, it gains nothing.

Each scenario does what an agent would (commands in its sandbox), then verifies the episode the
way `run_episode` does.
"""

from __future__ import annotations

import json
import re
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from t1jax.sandbox.backend import SandboxSpec
from t1jax.tasks.task import load_task
from t1jax.curation.validate import run_agent
from t1jax.verify.reward import INVARIANT, GlobalScale
from t1jax.verify.verifier import tampered_paths, verify
from t1jax.rollout.trial import TrialSite

SEED = Path(__file__).resolve().parents[2] / "t1jax" / "tasks" / "seed_tasks"
SCALE = GlobalScale(10, "test")
BASE_DOCKERFILE = "FROM t1jax/base:bookworm\nWORKDIR /app\n"
# The seed tasks' convention: the image's pytest, JUnit XML, reward.txt from the exit code.
SEED_TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
cd /app 2>/dev/null || cd /
PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -p no:cacheprovider -rA --junitxml=/logs/verifier/junit.xml /tests/test_outputs.py
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
# An official Terminal-Bench 2 test.sh: downloads uv and pytest, which an offline sandbox cannot.
# (The official ones first `apt-get install curl`; left out: offline, apt only adds ~15 s of retries.)
OFFICIAL_TB2_TEST_SH = """#!/bin/bash
curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh
source $HOME/.local/bin/env
uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
# The whole official shape (Terminal-Bench 2's canonical test.sh, in our words): apt for curl,
# uv's installer, a refusal to run from /, uvx fetching pytest and the CTRF plugin.
OFFICIAL_TB2_TEST_SH_FULL = """#!/bin/bash
apt-get update
apt-get install -y curl
curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh
source $HOME/.local/bin/env
if [ "$PWD" = "/" ]; then
  echo "Error: No working directory set. Please set a WORKDIR in your Dockerfile before running this script."
  exit 1
fi
uvx \\
  -p 3.13 \\
  -w pytest==8.4.1 \\
  -w pytest-json-ctrf==0.3.5 \\
  pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
THREE_FILES_TESTS = """
import os


def test_alpha_written():
    assert open("/app/alpha.txt").read().strip() == "alpha"


def test_beta_written():
    assert open("/app/beta.txt").read().strip() == "beta"


def test_gamma_written():
    assert open("/app/gamma.txt").read().strip() == "gamma"
"""
HELLO_TESTS = """
def test_hello_file():
    assert open("/app/hello.txt").read().strip() == "hello"


def test_hello_not_empty():
    assert open("/app/hello.txt").read()
"""


def write_tb2(root: Path, name: str, *, test_sh: str, tests: dict[str, str] | None = None,
              solve_sh: str | None = None, verifier_timeout: float = 30.0,
              dockerfile: str = BASE_DOCKERFILE) -> Path:
    """A Terminal-Bench 2 (Harbor) task directory under `root`."""
    d = root / name
    files = {
        "task.toml": f'schema_version = "1.1"\n\n[verifier]\ntimeout_sec = {verifier_timeout}\n',
        "instruction.md": f"Do the {name} task.\n",
        "environment/Dockerfile": dockerfile,
        "tests/test.sh": test_sh,
        **{f"tests/{k}": v for k, v in (tests or {}).items()},
    }
    if solve_sh is not None:
        files["solution/solve.sh"] = solve_sh
    for rel, text in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(textwrap.dedent(text) if rel.endswith(".py") else text)
    return d


@pytest.fixture(scope="module")
def built(docker_backend):
    """backend.build(task) with every image built for a tmp_path task removed afterwards."""
    made: list[str] = []

    def build(task):
        image = docker_backend.build(task)
        if not task.path.is_relative_to(SEED):
            made.append(image)
        return image

    yield build
    for image in made:
        try:
            docker_backend.client.images.remove(image, force=True)
        except Exception:
            pass


def episode(backend, build, task, actions=(), *, agent="nothing", mode="script",
            run_id: str | None = None, inspect=None, where="agent"):
    """Start a sandbox, run the scripted agent, then the agent's shell `actions` (each must
    succeed), and verify. `inspect(sandbox)` runs after verification, sandbox still alive."""
    image = build(task)
    with backend.create(SandboxSpec(image=image, workdir="/app",
                                    run_id=run_id or "test-verifier")) as sb:
        run_agent(agent, task, sb)
        for cmd in actions:
            result = sb.exec(cmd, timeout=60)
            assert result.exit_code == 0, f"agent action failed: {cmd}\n{result.output}"
        report = verify(task, sb, backend, SCALE, mode=mode, run_id=run_id or "test-verifier",
                        where=where)
        if inspect is not None:
            inspect(sb)
    return report


def statuses(report) -> dict[str, str]:
    return {a.name: a.status for a in report.assertions}


def goal(report) -> dict[str, str]:
    return {a.name: a.status for a in report.assertions if not INVARIANT.search(a.name)}


# --- count-log-errors: oracle, do-nothing, and the tamper attempts against it ------------------

@pytest.fixture(scope="module")
def log_task():
    return load_task(SEED / "count-log-errors")


@pytest.fixture(scope="module")
def nothing_report(docker_backend, built, log_task):
    return episode(docker_backend, built, log_task)


@pytest.mark.parametrize("where", ["agent", "snapshot"])
def test_oracle_passes_every_assertion_and_snapshot_is_removed(docker_backend, built, log_task,
                                                               where):
    """Both places give the same verdicts; in place no snapshot is made and no second
    container starts, from a snapshot the image is removed after."""
    run_id = f"test-verifier-{uuid.uuid4().hex[:8]}"
    client = docker_backend.client
    seen = {}

    def inspect(sb):
        seen["name"] = sb.container.name
        # the verifier's own sandbox is gone: only the agent's container remains for this run
        left = client.api.containers(all=True, filters={"label": f"t1jax.run={run_id}"})
        seen["containers"] = [c["Names"][0].lstrip("/") for c in left]

    report = episode(docker_backend, built, log_task, agent="oracle", run_id=run_id,
                     inspect=inspect, where=where)
    assert report.error is None, report.log
    assert report.total >= 4 and report.passed == report.total
    assert all(a.status == "passed" for a in report.assertions)
    assert report.solved and report.binary == 1.0
    assert report.reward == pytest.approx(report.passed / 10)
    assert report.reward_mode == "dense"
    assert report.tampered == []
    assert set(report.test_checksums) == set(log_task.test_files())
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in report.test_checksums.values())
    assert {"start_s", "run_s", "total_s"} <= set(report.timings)
    assert ("snapshot_s" in report.timings) == (where == "snapshot")
    assert report.to_dict()["passed"] == report.passed
    # the snapshot image of the agent's container was removed after verification
    assert seen["containers"] == [seen["name"]]
    snapshots = [t for img in client.images.list(name="t1jax-snapshot") for t in img.tags]
    assert f"t1jax-snapshot:{seen['name']}" not in snapshots


@pytest.mark.slow
def test_oracle_and_tamper_under_each_runtime(docker_backend, built, log_task, runtime):
    """The whole trial path (task image, agent sandbox, snapshot, verifier sandbox with the
    read-only tests) under each runtime: the oracle scores every assertion, and rewritten tests
    are caught."""
    from t1jax.sandbox.docker_backend import DockerBackend
    backend = DockerBackend(runtime=runtime)
    report = episode(backend, built, log_task, agent="oracle")
    assert report.error is None and report.total >= 4 and report.passed == report.total
    tampered = episode(backend, built, log_task, actions=[
        "mkdir -p /tests && printf 'def test_fake():\\n    pass\\n' > /tests/test_outputs.py"])
    assert tampered.tampered and not tampered.solved


def test_do_nothing_fails_every_goal_assertion(nothing_report):
    report = nothing_report
    assert report.error is None, report.log
    assert report.total >= 4 and goal(report)
    assert set(goal(report).values()) == {"failed"}
    # the invariant (logs left intact) holds without the agent doing anything
    assert [s for n, s in statuses(report).items() if INVARIANT.search(n)] == ["passed"]
    assert not report.solved and report.binary == 0.0
    assert report.reward == pytest.approx(1 / 10)
    assert report.tampered == []


SERVE_SOLVE = """#!/bin/bash
cat > /app/server.py <<'EOF'
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8765))
s.listen()
while True:
    c, _ = s.accept()
    c.sendall(b"pong\\n")
    c.close()
EOF
nohup python3 /app/server.py > /app/server.log 2>&1 &
for i in $(seq 50); do
  python3 -c "import socket; socket.create_connection(('127.0.0.1', 8765))" 2>/dev/null && exit 0
  sleep 0.1
done
exit 1
"""
SERVE_TESTS = """
import socket
from pathlib import Path


def test_server_written():
    assert Path("/app/server.py").is_file()


def test_server_answers():
    with socket.create_connection(("127.0.0.1", 8765), timeout=5) as c:
        assert c.recv(16) == b"pong\\n"
"""
FRESH_EXEC_TESTS = """
import os


def test_no_agent_variable_and_the_workdir():
    assert "AGENT_SECRET" not in os.environ and os.getcwd() == "/app"
"""
# a process the agent leaves behind that rewrites the tests while they run
TEST_REWRITER = ("nohup sh -c 'while :; do [ -d /tests ] && echo \"def test_x(): pass\" "
                 "> /tests/test_outputs.py 2>/dev/null; sleep 0.2; done' >/dev/null 2>&1 &")


@pytest.mark.parametrize("where", ["agent", "snapshot"])
def test_a_service_the_solution_started_answers_the_tests_in_place(docker_backend, built,
                                                                   tmp_path, where):
    """kv-store-grpc's shape: the reference solution starts a server and the tests talk to
    it. Verified in the agent's container (Harbor's way, the default) the server is alive and
    the task is solved; in a snapshot's fresh container (the opt-in hardening) processes are
    gone and the test of the server fails: the cost BUILD.md states."""
    task = load_task(write_tb2(tmp_path, "serve-pong", test_sh=SEED_TEST_SH,
                               tests={"test_outputs.py": SERVE_TESTS}, solve_sh=SERVE_SOLVE))
    report = episode(docker_backend, built, task, agent="oracle", where=where)
    got = {name.split("::")[-1]: status for name, status in statuses(report).items()}
    if where == "agent":
        assert report.solved and report.tampered == [], report.log[-2000:]
        assert got == {"test_server_written": "passed", "test_server_answers": "passed"}
    else:
        assert not report.solved
        assert got == {"test_server_written": "passed", "test_server_answers": "failed"}


def test_in_place_the_tests_run_without_the_agent_shells_state(docker_backend, built, tmp_path):
    """The agent's shell exported a variable and changed directory: the tests run in a fresh
    exec (no such variable, the image's WORKDIR). A process the agent left that rewrites
    /tests/test_outputs.py every 0.2 s is caught by the checksums after the run."""
    task = load_task(write_tb2(tmp_path, "fresh-exec", test_sh=SEED_TEST_SH,
                               tests={"test_outputs.py": FRESH_EXEC_TESTS}))
    clean = episode(docker_backend, built, task, actions=["export AGENT_SECRET=1", "cd /tmp"])
    assert clean.solved and clean.tampered == [], clean.log[-2000:]
    raced = episode(docker_backend, built, task, actions=[TEST_REWRITER])
    assert raced.reward == 0 and raced.reward_mode == "tampered", raced.log[-2000:]
    assert any("checksums changed" in t for t in raced.tampered), raced.tampered


OUT_TESTS = """
from pathlib import Path


def test_out_written():
    assert Path("/app/out.txt").read_text().strip() == "out"
"""
# what an agent can do to its sandbox so that its tests cannot give a verdict
SABOTAGE = {
    "fifo": ["mkfifo /app/out.txt"],  # the test's open() blocks: the verifier times out
    "deleted_python": ["rm -f /usr/bin/python3* /usr/local/bin/python3*"],
    "killed_verifier": ["nohup sh -c 'while :; do pkill -9 -f pytest; sleep 0.05; done' "
                        ">/dev/null 2>&1 &"],
}


@pytest.mark.parametrize("sabotage", sorted(SABOTAGE))
def test_a_sabotaged_verification_scores_zero_in_evaluation_and_training(
        docker_backend, built, tmp_path, sabotage):
    """Each way an agent can keep its tests from a verdict lands in a scored bucket at 0,
    never in the infrastructure bucket that would drop it: in evaluation its failure mode
    (eval_summary.failure_mode, scored) and in training the reward the scheduler trains on
    (blame "agent": 0; tampered: 0)."""
    from t1jax.rollout.eval_summary import NOT_SCORED, failure_mode
    task = load_task(write_tb2(tmp_path, f"sabotage-{sabotage}", test_sh=SEED_TEST_SH,
                               tests={"test_outputs.py": OUT_TESTS}, verifier_timeout=8.0))
    report = episode(docker_backend, built, task, actions=SABOTAGE[sabotage])
    mode = failure_mode("done", report)
    assert mode not in NOT_SCORED and report.blame != "infra", (mode, report.error)
    assert report.reward == 0 and not report.solved, report.log[-2000:]
    assert mode == {"fifo": "verifier_broken", "deleted_python": "tampered",
                    "killed_verifier": "unresolved"}[sabotage], (mode, report.error)
    if sabotage == "fifo":
        assert report.timed_out and report.blame == "agent"


def test_a_failed_oracle_says_what_its_solve_sh_said(docker_backend, built, tmp_path):
    """The oracle job names why a reference solution failed: solve.sh's exit code and the
    tail of its output, in results.jsonl, results.md and the summary (count-dataset-tokens'
    solution needs the network; offline it showed only "unhealthy")."""
    from t1jax.curation.validate import validate_pool
    solve = "#!/bin/bash\necho 'fetching the tokenizer from huggingface.co...'\nexit 3\n"
    task = load_task(write_tb2(tmp_path / "tasks", "needs-net", test_sh=SEED_TEST_SH,
                               tests={"test_outputs.py": OUT_TESTS}, solve_sh=solve))
    built(task)
    out = tmp_path / "out"
    summary = validate_pool([task], TrialSite(docker_backend, run_id="test-oracle-why",
                                              concurrency=1), out_dir=out)
    assert summary["unhealthy"] == ["needs-net"]
    row = next(r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())
               if r["agent"] == "oracle")
    assert row["solve_exit"] == 3 and "huggingface.co" in row["solve_tail"]
    assert "solve.sh exited 3: ...fetching the tokenizer from huggingface.co" in \
        (out / "results.md").read_text()


def test_in_place_a_container_whose_processes_all_died_is_started_again(docker_backend, built,
                                                                        log_task):
    """An agent that ends with `kill -9 -1` as root stops its own container: verified in place,
    it is started again (its files kept, its processes gone, as a shell that exited is
    replaced) and the tests give their verdict on what it left."""
    image = built(log_task)
    with docker_backend.create(SandboxSpec(image=image, workdir="/app",
                                           run_id="test-verifier")) as sb:
        run_agent("oracle", log_task, sb)
        sb.container.kill()
        report = verify(log_task, sb, docker_backend, SCALE, run_id="test-verifier")
    assert report.error is None and report.solved and report.tampered == [], report.log[-2000:]


def assert_gains_nothing(report, nothing_report):
    """The real tests ran (the task's own assertion names) and the goal was not met."""
    assert statuses(report) == statuses(nothing_report), report.log
    assert not report.solved


def test_tamper_overwritten_tests_are_replaced_and_flagged(docker_backend, built, log_task,
                                                          nothing_report):
    fake_tests = "\n".join(f"def {n.split('::')[-1]}():\n    pass\n" for n in statuses(nothing_report))
    report = episode(docker_backend, built, log_task, actions=[
        "mkdir -p /tests",
        f"cat > /tests/test_outputs.py <<'EOF'\n{fake_tests}\nEOF",
        "printf '#!/bin/bash\\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\\n'"
        " > /tests/test.sh",
    ])
    assert_gains_nothing(report, nothing_report)
    assert set(goal(report).values()) == {"failed"}
    assert report.tampered and all("/tests" in t for t in report.tampered)
    assert report.reward == 0 and report.reward_mode == "tampered"


def test_tamper_prewritten_readonly_results_are_discarded(docker_backend, built, log_task,
                                                         nothing_report):
    ctrf = ('{"results": {"tool": {"name": "pytest"}, "tests": ['
            '{"name": "test_fake", "status": "passed", "duration": 1}]}}')
    junit = ('<testsuites><testsuite name="pytest"><testcase classname="test_outputs" '
             'name="test_fake" time="0.1"/></testsuite></testsuites>')
    report = episode(docker_backend, built, log_task, actions=[
        "mkdir -p /logs/verifier",
        "echo 1 > /logs/verifier/reward.txt",
        f"cat > /logs/verifier/ctrf.json <<'EOF'\n{ctrf}\nEOF",
        f"cat > /logs/verifier/junit.xml <<'EOF'\n{junit}\nEOF",
        "chmod 444 /logs/verifier/* && chmod 555 /logs/verifier /logs",
    ])
    assert report.error is None, report.log
    assert_gains_nothing(report, nothing_report)
    assert set(goal(report).values()) == {"failed"}
    assert report.binary == 0.0 and report.reward == pytest.approx(1 / 10)
    assert report.tampered == []


def test_tamper_replaced_pytest_and_python_score_zero(docker_backend, built, log_task):
    fake = "#!/bin/sh\\necho 5 passed\\nexit 0\\n"
    report = episode(docker_backend, built, log_task, actions=[
        f"printf '{fake}' > /usr/local/bin/pytest && chmod +x /usr/local/bin/pytest",
        f"printf '{fake}' > /usr/local/bin/python3 && chmod +x /usr/local/bin/python3",
        "python3 --version | grep -q passed",  # the agent's fakes shadow the real ones
    ])
    assert "A /usr/local/bin/python3" in report.tampered
    assert "A /usr/local/bin/pytest" in report.tampered
    assert report.reward == 0 and report.reward_mode == "tampered"
    assert not report.solved


FAKE_PYTEST_MODULE = """
import os
os.makedirs("/logs/verifier", exist_ok=True)
open("/logs/verifier/junit.xml", "w").write(
    '<testsuite name="x"><testcase classname="fake" name="test_planted_module"/></testsuite>')
print("1 passed")
raise SystemExit(0)
"""
FAKE_CONFTEST = """
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
"""


def test_tamper_planted_pytest_module_scores_zero(docker_backend, built, log_task):
    """A pytest module planted where `python3 -m pytest` would import it from the working
    directory is flagged, and the episode scores zero. (The tests run without a PYTHONSAFEPATH
    of ours, as under Harbor: it leaked into their subprocesses.)"""
    report = episode(docker_backend, built, log_task, actions=[
        f"cat > /app/pytest.py <<'EOF'\n{FAKE_PYTEST_MODULE}\nEOF",
        f"cat > /app/conftest.py <<'EOF'\n{FAKE_CONFTEST}\nEOF",
        # the plant is live for a naive `python3 -m pytest` run from /app
        "cd /app && python3 -m pytest --version | grep -q '1 passed'",
    ])
    assert report.tampered == ["A /app/pytest.py"]
    assert report.reward == 0 and not report.solved and report.reward_mode == "tampered"


def test_tamper_root_pytest_ini_is_flagged(docker_backend, built, log_task, nothing_report):
    report = episode(docker_backend, built, log_task, actions=[
        f"cat > /app/conftest.py <<'EOF'\n{FAKE_CONFTEST}\nEOF",
        "printf '[pytest]\\naddopts = -p no:terminal\\n' > /pytest.ini",
    ])
    assert report.tampered == ["A /pytest.ini"]
    assert report.reward == 0 and not report.solved
    # the genuine pytest ran the task's real tests (the ini moved the rootdir to /, so the
    # module part of each name changes: compare the test functions)
    def functions(r):
        return {n.split("::")[-1]: s for n, s in statuses(r).items()}
    assert functions(report) == functions(nothing_report), report.log


@pytest.mark.parametrize("target", ["/tmp", "/dev/null"])
def test_tamper_logs_symlink_still_gives_real_results(docker_backend, built, log_task,
                                                      nothing_report, target):
    actions = ["rm -rf /logs", f"ln -s {target} /logs"]
    if target == "/tmp":  # results planted where the link points
        actions += ["mkdir -p /tmp/verifier", "echo 1 > /tmp/verifier/reward.txt",
                    "printf '{\"results\": {\"tests\": [{\"name\": \"t\", \"status\": \"passed\"}]}}'"
                    " > /tmp/verifier/ctrf.json"]
    report = episode(docker_backend, built, log_task, actions=actions)
    assert report.error is None, report.log
    assert_gains_nothing(report, nothing_report)
    assert report.binary == 0.0 and report.reward == pytest.approx(1 / 10)


def test_tampered_paths_flags_only_the_toolchain():
    changes = [("A", "/usr/local/bin/pytest"), ("C", "/usr"), ("A", "/app/out.txt"),
               ("A", "/usr/lib/python3/dist-packages/_pytest/foo.py"),
               ("A", "/etc/python3.11/sitecustomize.py")]
    assert tampered_paths(changes) == [
        "A /etc/python3.11/sitecustomize.py",
        "A /usr/lib/python3/dist-packages/_pytest/foo.py",
        "A /usr/local/bin/pytest",
    ]
    # a task's own outputs, scratch files, or pytest installed into a project's venv, are
    # never tampering
    assert tampered_paths([("A", "/app/conftest.py"), ("C", "/tmp"), ("A", "/root/.cache/pip/x"),
                           ("A", "/app/.venv/lib/python3.11/site-packages/pytest/__init__.py"),
                           ("A", "/app/src/mypytest.py")]) == []
    # what `python3 -m pytest` would import before the real one: a module in the working
    # directory, or anything of the toolchain (or a .pth) in the user's site-packages
    assert tampered_paths([("A", "/app/pytest.py"), ("A", "/work/_pytest/__init__.py"),
                           ("A", "/root/.local/lib/python3.11/site-packages/pytest/__init__.py"),
                           ("A", "/home/u/.local/lib/python3.13/site-packages/x.pth")]) == [
        "A /app/pytest.py", "A /home/u/.local/lib/python3.13/site-packages/x.pth",
        "A /root/.local/lib/python3.11/site-packages/pytest/__init__.py",
        "A /work/_pytest/__init__.py"]
    assert tampered_paths([("D", "/usr/bin/python3"), ("A", "/tests"),
                           ("C", "/usr/lib/python3.11/os.py")]) == [
        "A /tests", "C /usr/lib/python3.11/os.py", "D /usr/bin/python3"]


# --- scoring on tasks written here ---------------------------------------------------------------

def test_partial_credit_counts_each_assertion(docker_backend, built, tmp_path):
    task = load_task(write_tb2(tmp_path, "three-files", test_sh=SEED_TEST_SH,
                               tests={"test_outputs.py": THREE_FILES_TESTS}))
    report = episode(docker_backend, built, task, actions=[
        "echo alpha > /app/alpha.txt", "echo gamma > /app/gamma.txt"])
    assert report.error is None, report.log
    assert statuses(report) == {"test_outputs::test_alpha_written": "passed",
                                "test_outputs::test_beta_written": "failed",
                                "test_outputs::test_gamma_written": "passed"}
    assert (report.passed, report.total) == (2, 3)
    assert report.reward == pytest.approx(2 / SCALE.value) and report.reward_mode == "dense"
    assert not report.solved


@pytest.fixture(scope="module")
def official_task(tmp_path_factory):
    return load_task(write_tb2(tmp_path_factory.mktemp("tb2"), "official-tb2",
                               test_sh=OFFICIAL_TB2_TEST_SH,
                               tests={"test_outputs.py": HELLO_TESTS}))


@pytest.fixture(scope="module")
def official_script_report(docker_backend, built, official_task):
    return episode(docker_backend, built, official_task, actions=["echo hello > hello.txt"],
                   mode="script")


def test_official_tb2_script_cannot_run_offline(official_script_report):
    report = official_script_report
    assert "uvx" in report.log  # it got as far as running the downloaded tools
    assert report.assertions == []
    assert report.reward == 0 and not report.solved
    assert report.reward_mode == "binary_fallback"


def test_official_tb2_script_offline_failure_is_reported(official_script_report):
    assert official_script_report.error


def test_offline_mode_runs_official_test_sh_with_stand_ins(docker_backend, built, tmp_path):
    """Offline, the official test.sh runs as written: apt-get, uv's installer and uvx are stood
    in for, pytest writes CTRF through the stand-in plugin, and the per-assertion results and
    reward.txt come from the task's own script."""
    task = load_task(write_tb2(tmp_path, "official-full", test_sh=OFFICIAL_TB2_TEST_SH_FULL,
                               tests={"test_outputs.py": HELLO_TESTS}))
    report = episode(docker_backend, built, task, actions=["echo hello > hello.txt"],
                     mode="offline")
    assert report.error is None, report.log
    assert "t1jax offline" in report.log and "No working directory" not in report.log
    assert set(statuses(report).values()) == {"passed"} and report.total == 2
    assert all("test_hello" in n for n in statuses(report))
    assert report.solved and report.binary == 1.0 and report.reward == pytest.approx(2 / 10)
    assert report.reward_mode == "dense"
    # the toolchain it ran on instead of the one test.sh asked for: kept, for the summary
    notes = " ".join(report.stand_in_notes)
    assert "Python 3.13 requested; using the image's Python 3.11" in notes, notes
    assert "pytest==8.4.1: using the image's pytest" in notes, notes
    # not solved: per-assertion failures, read from the CTRF file (the stand-in's)
    report = episode(docker_backend, built, task, mode="offline")
    assert (report.passed, report.total) == (0, 2) and not report.solved and report.binary == 0


@pytest.mark.slow
def test_offline_stand_ins_fail_clearly_on_what_the_image_lacks(docker_backend, built, tmp_path):
    """A package test.sh would fetch and the image lacks is a verifier error naming it, never
    a silent pass or a silent zero; pytest mode still runs the test files alone."""
    test_sh = OFFICIAL_TB2_TEST_SH_FULL.replace("-w pytest==8.4.1", "-w pytest==8.4.1 \\\n"
                                                "  -w no-such-package==1.0")
    task = load_task(write_tb2(tmp_path, "needs-package", test_sh=test_sh,
                               tests={"test_outputs.py": HELLO_TESTS}))
    report = episode(docker_backend, built, task, actions=["echo hello > hello.txt"],
                     mode="offline")
    assert "'no-such-package==1.0' is not installed in this image" in report.log
    assert report.assertions == [] and not report.solved
    # not a reward, and ours: dropped from training, an infra_error (excluded) in evaluation
    assert report.failed and "no-such-package==1.0" in report.error
    assert report.blame == "infra" and "stand-ins" in report.infra_cause
    assert any("no-such-package==1.0" in e for e in report.stand_in_errors)
    report = episode(docker_backend, built, task, actions=["echo hello > hello.txt"],
                     mode="pytest")
    assert report.error is None and report.solved and report.total == 2


@pytest.mark.slow
def test_binary_only_verifier_falls_back_to_binary_reward(docker_backend, built, tmp_path):
    task = load_task(write_tb2(tmp_path, "binary-only", test_sh=(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "if [ -f /app/done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n")))
    report = episode(docker_backend, built, task, actions=["touch /app/done"])
    assert report.error is None, report.log
    assert report.assertions == [] and report.binary == 1.0
    assert report.reward_mode == "binary_fallback" and report.reward > 0 and report.solved
    report = episode(docker_backend, built, task)
    assert report.reward_mode == "binary_fallback" and report.reward == 0 and not report.solved


def test_ctrf_is_preferred_over_junit(docker_backend, built, tmp_path):
    task = load_task(write_tb2(tmp_path, "ctrf-and-junit", test_sh="""#!/bin/bash
mkdir -p /logs/verifier
cat > /logs/verifier/ctrf.json <<EOF
{"results": {"tool": {"name": "pytest"}, "tests": [
  {"name": "test_outputs.py::test_one", "status": "passed", "duration": 12},
  {"name": "test_outputs.py::test_two", "status": "passed", "duration": 3},
  {"name": "test_outputs.py::test_three", "status": "failed", "duration": 5, "message": "boom"}
]}}
EOF
cat > /logs/verifier/junit.xml <<EOF
<testsuites><testsuite name="pytest"><testcase classname="junit" name="test_only"/></testsuite></testsuites>
EOF
echo 0 > /logs/verifier/reward.txt
"""))
    report = episode(docker_backend, built, task)
    assert report.error is None, report.log
    assert statuses(report) == {"test_outputs.py::test_one": "passed",
                                "test_outputs.py::test_two": "passed",
                                "test_outputs.py::test_three": "failed"}
    assert report.assertions[0].duration_s == pytest.approx(0.012)
    assert report.reward == pytest.approx(2 / 10) and report.reward_mode == "dense"
    assert not report.solved


@pytest.mark.slow
def test_verifier_timeout(docker_backend, built, tmp_path):
    task = load_task(write_tb2(tmp_path, "slow-verifier", verifier_timeout=2,
                               test_sh="#!/bin/bash\nsleep 100\necho 1 > /logs/verifier/reward.txt\n"))
    t0 = time.monotonic()
    report = episode(docker_backend, built, task)
    assert time.monotonic() - t0 < 30
    assert report.timed_out
    assert "timed out" in report.error and "timeout_sec" in report.error
    assert report.reward == 0 and not report.solved


# --- Terminal-Bench 1 ----------------------------------------------------------------------------

def write_tb1(root: Path, name: str, run_tests: str) -> Path:
    d = root / name
    files = {
        "task.yaml": "instruction: Write hello to /app/hello.txt.\nmax_test_timeout_sec: 60\n"
                     "parser_name: pytest\n",
        "Dockerfile": BASE_DOCKERFILE,
        "docker-compose.yaml": "services: {}\n",
        "run-tests.sh": run_tests,
        "tests/test_outputs.py": textwrap.dedent(HELLO_TESTS),
        "solution.sh": "#!/bin/bash\necho hello > /app/hello.txt\n",
    }
    for rel, text in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return d


# A TB1 run-tests.sh adapted to leave a report in /logs/verifier.
TB1_RUN_TESTS_JUNIT = """#!/bin/bash
mkdir -p /logs/verifier
cd /app
python3 -m pytest -p no:cacheprovider -rA --junitxml=/logs/verifier/junit.xml $TEST_DIR/test_outputs.py
if [ $? -eq 0 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
# A TB1 run-tests.sh as Terminal-Bench 1 wrote them: its harness parsed pytest's -rA stdout.
TB1_RUN_TESTS_STDOUT = """#!/bin/bash
cd /app
python3 -m pytest $TEST_DIR/test_outputs.py -rA
"""


@pytest.mark.slow
def test_tb1_oracle_is_solved_with_per_assertion_results(docker_backend, built, tmp_path):
    task = load_task(write_tb1(tmp_path, "legacy-hello", TB1_RUN_TESTS_JUNIT))
    assert task.layout == "tb1" and task.solution_script is not None
    report = episode(docker_backend, built, task, agent="oracle")
    assert report.error is None, report.log
    assert report.total == 2 and report.passed == 2
    assert report.solved and report.reward == pytest.approx(2 / 10)
    assert set(report.test_checksums) == {"run-tests.sh", "test_outputs.py"}
    report = episode(docker_backend, built, task)
    assert (report.passed, report.total) == (0, 2) and not report.solved


def test_tb1_stdout_only_task_pytest_mode(docker_backend, built, tmp_path):
    task = load_task(write_tb1(tmp_path, "legacy-stdout", TB1_RUN_TESTS_STDOUT))
    report = episode(docker_backend, built, task, agent="oracle", mode="pytest")
    assert report.error is None, report.log
    assert (report.passed, report.total) == (2, 2) and report.solved


def test_tb1_stdout_only_task_script_mode(docker_backend, built, tmp_path):
    task = load_task(write_tb1(tmp_path, "legacy-stdout2", TB1_RUN_TESTS_STDOUT))
    report = episode(docker_backend, built, task, agent="oracle", mode="script")
    assert "2 passed" in report.log
    assert report.solved and report.passed == 2
