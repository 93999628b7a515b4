"""Verify a finished episode in a fresh sandbox, never in the one the agent controlled.

The agent's sandbox is snapshotted; a new sandbox starts from the snapshot, in the image's own
WORKDIR with the task's `[environment.env]` and `[verifier.env]` (as Harbor runs test.sh), the
task's tests mounted read-only at /tests (checksummed before and after) and an empty
/logs/verifier. The agent cannot change that sandbox's environment variables, so none of ours are
added: tests see what they would see under Harbor (a PYTHONSAFEPATH of ours once broke tests that
start Python subprocesses). What the agent could plant on disk is detected instead: the
snapshot's diff against the task image is checked for changes to the test toolchain (python,
pytest, sitecustomize, *.pth, user site-packages, modules that would shadow pytest from the
working directory, root-level pytest config), and a tampered episode scores zero. The T1 report
names verifier integrity as an open limitation.

Modes: 'script' runs tests/test.sh as written (it may fetch uv and pytest: that needs the
network); 'offline' runs it as written too, with offline stand-ins for the tools it would fetch
first on PATH (t1jax/verify/offline: apt-get, curl, uv/uvx, pip), so its own set-up steps run;
'pytest' skips test.sh and runs the task's test_*.py with the image's pytest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import tempfile
import time
from pathlib import Path

from t1jax.sandbox.backend import Backend, SandboxSpec
from t1jax.sandbox.base import Limits, SandboxError
from t1jax.tasks.task import resolve_env
from t1jax.verify.reward import GlobalScale, dense_reward
from t1jax.verify.results import (Assertion, ResultsFormatError, parse_binary_reward, parse_ctrf,
                                  parse_junit, parse_pytest_summary)

LOGS = "/logs/verifier"
VERIFIER_LOG_BYTES = 1_000_000  # keep the verifier's own output nearly whole
# Signs that a test.sh tried to fetch its tools (uv, pytest) from the network and could not.
_NEEDS_NETWORK = re.compile(r"command not found|Could not resolve host|curl: \(\d+\)|"
                            r"Temporary failure in name resolution|Network is unreachable")
# the system's and the user's (~/.local, which comes before the system's on sys.path)
_PY_SITE = (r"(?:/usr/(?:local/)?lib|^/root/\.local/lib|^/home/[^/]+/\.local/lib)"
            r"/python3[^/]*/(?:site|dist)-packages")
_TOOLCHAIN = r"(?:_?pytest|pluggy|py|iniconfig|packaging)"
PROTECTED = [re.compile(p) for p in (
    r"^/tests(/|$)",
    r"^/(?:usr/)?(?:local/)?s?bin/(?:python[0-9.]*|pytest[0-9.-]*|py\.test|bash|sh|dash|env)$",
    _PY_SITE + "/" + _TOOLCHAIN + r"(?:/|\.py$|-)",
    r"(?:^|/)(?:sitecustomize|usercustomize)\.py$",
    r"^/usr/(?:local/)?lib/python3[^/]*/.*\.pth$",
    _PY_SITE + r"/[^/]+\.pth$",
    r"^/usr/lib/python3\.[0-9]+/[^/]+\.py$",
    r"^/(?:pytest\.ini|tox\.ini|setup\.cfg|pyproject\.toml|conftest\.py)$",
)]
# pytest's own modules anywhere but in a site-packages: `python -m pytest` run from the working
# directory would import them first
_SHADOW = re.compile(r"(?:^|/)(?:_?pytest|pluggy)(?:/__init__\.py|\.py)$")
_IN_SITE = re.compile(r"/(?:site|dist)-packages/")
OFFLINE_TOOLS = Path(__file__).resolve().parent / "offline"
OFFLINE_MOUNT = "/opt/t1jax-offline"
STAND_IN_ERRORS = "t1jax-stand-in-errors.txt"  # in LOGS: the stand-ins append what they lacked
# in LOGS, in the order tried: per-assertion results, then the binary outcome
ASSERTION_FILES = (("ctrf.json", parse_ctrf), ("junit.xml", parse_junit))
BINARY_FILES = (("reward.txt", parse_binary_reward), ("reward.json", parse_binary_reward))
RESULT_FILES = tuple(name for name, _ in ASSERTION_FILES + BINARY_FILES)  # read at once
# offline mode only: the stand-in tools first on PATH, and the --ctrf plugin in every pytest
OFFLINE_PREFIX = (f"PATH={OFFLINE_MOUNT}/bin:$PATH PYTEST_PLUGINS=t1jax_ctrf "
                  f"PYTHONPATH={OFFLINE_MOUNT}/py${{PYTHONPATH:+:$PYTHONPATH}} ")
VERIFIER_MODES = ("script", "offline", "pytest")


@dataclasses.dataclass
class VerifierReport:
    """Everything the verifier learned about one episode; JSON-serialisable via `to_dict`."""
    task_id: str
    assertions: list[Assertion]
    binary: float | None
    solved: bool
    reward: float
    reward_mode: str
    tampered: list[str]
    test_checksums: dict[str, str]
    exit_code: int | None
    timed_out: bool
    log: str
    timings: dict[str, float]
    error: str | None = None
    # what the offline stand-ins could not provide (t1jax/verify/offline): the run was unfaithful
    stand_in_errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def failed(self) -> bool:
        """The verification itself failed (no assertion ran: results missing or unreadable, a
        tool the offline mode cannot stand in for, a timeout before any result): not a reward,
        whatever reward.txt says; or the offline stand-ins could not provide what test.sh asked
        for, so its results are not what Harbor would give. Training drops such a trial;
        evaluation counts it apart."""
        return bool(self.stand_in_errors) or (bool(self.error) and not self.assertions
                                              and not self.tampered)

    @property
    def passed(self) -> int:
        return sum(a.status == "passed" for a in self.assertions)

    @property
    def total(self) -> int:
        return len(self.assertions)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.update(passed=self.passed, total=self.total, failed=self.failed)
        return data


def tampered_paths(changes: list[tuple[str, str]]) -> list[str]:
    """Paths of the test toolchain the agent added, changed or deleted."""
    return sorted({f"{kind} {path}" for kind, path in changes
                   if any(p.search(path) for p in PROTECTED)
                   or (_SHADOW.search(path) and not _IN_SITE.search(path))})


def sha256_tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def verify(task, agent_sandbox, backend: Backend, scale: GlobalScale, *, mode: str = "script",
           run_id: str = "adhoc", limits: Limits | None = None,
           allow_network: bool = False) -> VerifierReport:
    """Snapshot `agent_sandbox`, run the task's tests in a fresh sandbox, and score them.

    mode 'script' runs the task's tests/test.sh (run-tests.sh for Terminal-Bench 1) as written;
    'offline' runs it as written with the offline tool stand-ins first on PATH; 'pytest' runs
    only the task's test_*.py with the image's own pytest. allow_network: the run lets
    sandboxes reach the network (online); the tests get it when the task allows it too, as
    under Harbor, where test.sh downloads its tools."""
    if mode not in VERIFIER_MODES:
        raise ValueError(f"unknown verifier mode {mode!r} (config verifier.mode): "
                         + "|".join(VERIFIER_MODES))
    t0 = time.monotonic()
    tampered = tampered_paths(backend.changes(agent_sandbox))
    snapshot = agent_sandbox.snapshot()
    timings = {"snapshot_s": time.monotonic() - t0}
    staging = Path(tempfile.mkdtemp(prefix=f"t1jax-tests-{task.task_id}-"))
    try:
        for rel, host in task.test_files().items():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(host, staging / rel)
        before = sha256_tree(staging)
        env = {**resolve_env(task, task.environment.env, "environment.env"),
               **resolve_env(task, task.verifier.env, "verifier.env")}
        if task.layout == "tb1":  # Terminal-Bench 1's harness set it; run-tests.sh reads it
            env["TEST_DIR"] = "/tests"
        limits = limits or Limits()
        limits = dataclasses.replace(
            limits, max_output_bytes=max(limits.max_output_bytes, VERIFIER_LOG_BYTES))
        mounts = ((str(staging), "/tests"),)
        if mode == "offline":
            mounts += ((str(OFFLINE_TOOLS), OFFLINE_MOUNT),)
        spec = SandboxSpec(
            image=snapshot, limits=limits, workdir=task.environment.workdir,
            user=task.verifier.user,
            network=allow_network and task.environment.allow_internet and mode != "offline",
            readonly_mounts=mounts, environment=tuple(env.items()), run_id=run_id)
        t1 = time.monotonic()
        with backend.create(spec) as sandbox:
            timings["start_s"] = time.monotonic() - t1
            # the agent may have pre-written results, or made /logs a link elsewhere
            reset = sandbox.exec(f"rm -rf {LOGS} /tmp/.t1jax_shell_env; [ -L /logs ] && rm -f /logs;"
                                 f" mkdir -p {LOGS}", timeout=60)
            if reset.exit_code != 0:
                raise SandboxError(f"task {task.task_id}: could not prepare {LOGS}: {reset.output}")
            t2 = time.monotonic()
            result = sandbox.exec(_command(task, mode), timeout=task.verifier.timeout_sec)
            timings["run_s"] = time.monotonic() - t2
            files = {name: data.decode("utf-8", errors="replace") for name, data in
                     sandbox.get_files(LOGS, RESULT_FILES + (STAND_IN_ERRORS,)).items()}
            assertions, binary, error = _read_results(files, task, result)
            stand_in = files.get(STAND_IN_ERRORS) if mode == "offline" else None
            stand_in_errors = stand_in.splitlines() if stand_in else []
        after = sha256_tree(staging)
        if after != before:
            tampered.append("C /tests (checksums changed during verification)")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        try:
            backend.remove_image(snapshot)
        except Exception:  # a leftover snapshot is reaped later; never mask the real outcome
            pass
    if stand_in_errors:
        error = (error + "; " if error else "") + "offline stand-ins: " + "; ".join(
            stand_in_errors)
    if result.timed_out:
        error = (error + "; " if error else "") + \
            f"verifier timed out after {task.verifier.timeout_sec:.0f} s ([verifier] timeout_sec)"
    reward, reward_mode = dense_reward(assertions, binary, scale)
    solved = binary > 0 if binary is not None else bool(assertions) and all(
        a.status == "passed" for a in assertions)
    if tampered:
        reward, solved, reward_mode = 0.0, False, "tampered"
    timings["total_s"] = time.monotonic() - t0
    return VerifierReport(task_id=task.task_id, assertions=assertions, binary=binary, solved=solved,
                          reward=reward, reward_mode=reward_mode, tampered=tampered,
                          test_checksums=before, exit_code=result.exit_code,
                          timed_out=result.timed_out, log=result.output, timings=timings,
                          error=error, stand_in_errors=stand_in_errors)


def _command(task, mode: str) -> str:
    if mode == "script":
        return f"bash /tests/{task.test_script.name} 2>&1"
    if mode == "offline":
        return f"{OFFLINE_PREFIX}bash /tests/{task.test_script.name} 2>&1"
    tests = sorted(f"/tests/{rel}" for rel in task.test_files()
                   if re.search(r"(^|/)test_[^/]*\.py$|_test\.py$", rel))
    if not tests:
        raise SandboxError(f"task {task.task_id}: pytest verifier mode found no test_*.py in "
                           f"{task.tests_dir}")
    ini = "/tests/pytest.ini" if "pytest.ini" in task.test_files() else "/dev/null"
    return ("python3 -P -m pytest -p no:cacheprovider --rootdir=/tests --confcutdir=/tests "
            f"-c {ini} -rA --junitxml={LOGS}/junit.xml " + " ".join(tests)
            + f"; rc=$?; if [ $rc -eq 0 ]; then echo 1; else echo 0; fi > {LOGS}/reward.txt")


def _read_results(files: dict[str, str], task, result):
    """Per-assertion results (CTRF first, then JUnit XML, then the pytest summary in the
    output, which is how Terminal-Bench 1 graded) and the binary outcome. files: what
    /logs/verifier held, by name."""
    errors = []

    def first_parsed(parsers):
        """The first of (file, parser) under /logs/verifier that exists and parses; a file
        that does not parse is an error, and the next one is tried."""
        for name, parse in parsers:
            text = files.get(name)
            if text is None:
                continue
            try:
                return parse(text, f"{task.task_id}:{LOGS}/{name}")
            except ResultsFormatError as err:
                errors.append(str(err))
        return None

    assertions = first_parsed(ASSERTION_FILES) or []
    if not assertions:
        assertions = parse_pytest_summary(result.output, f"{task.task_id}:verifier output")
    binary = first_parsed(BINARY_FILES)
    if not assertions and _NEEDS_NETWORK.search(result.output):
        errors.append(f"task {task.task_id}: tests/{task.test_script.name} ran no tests; it "
                      "seems to fetch its tools from the network, which sandboxes do not have: "
                      "use --config.verifier.mode=offline")
    elif not assertions and binary is None:
        errors.append(f"task {task.task_id}: the verifier wrote no results to {LOGS} "
                      f"(exit code {result.exit_code})")
    return assertions, binary, "; ".join(errors) or None


def report_json(report: VerifierReport) -> str:
    return json.dumps(report.to_dict(), default=str)
