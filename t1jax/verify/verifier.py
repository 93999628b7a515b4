"""Verify a finished episode where Harbor does: in the agent's own sandbox, after it finished.

Default (`where="agent"`, Harbor's way): the services the agent started are still running when
the tests run (a task that checks a server it was asked to start can pass). The task's tests are
copied in at verification time (read-only modes, an empty /logs/verifier; whatever the agent left
at /tests or /logs/verifier is removed first, and /tests is checksummed before and after the
run), and test.sh runs in a fresh `docker exec` of its own (`Sandbox.fresh_exec`): the image's
WORKDIR and environment with the task's `[environment.env]` and `[verifier.env]`, none of the
agent shell's variables, functions or directory. The agent cannot change that exec's
environment, so none of ours are added: tests see what they would see under Harbor (a
PYTHONSAFEPATH of ours once broke tests that start Python subprocesses).

`where="snapshot"` (opt-in hardening, e.g. for training): the agent's sandbox is snapshotted and
the tests run in a fresh sandbox started from the snapshot, the tests a read-only mount. Nothing
the agent left running can touch the tests while they run, but no process survives into the
verifier either: a task that checks a running service cannot pass, and a snapshot costs a
`docker commit` per trial (BENCHMARKS.md).

In both, what the agent could plant on disk is detected: the sandbox's diff against the task
image is checked for changes to the test toolchain (python, pytest, sitecustomize, *.pth, user
site-packages, modules that would shadow pytest from the working directory, root-level pytest
config, the offline stand-ins' folder), and a tampered episode scores zero. What the in-place
verifier cannot rule out, as under Harbor: a process the agent left running that rewrites a test
and restores it before the run ends. The T1 report names verifier integrity as an open
limitation.

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
import shlex
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
NETWORK_HINT = "seems to fetch its tools from the network"
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
    r"^/opt/t1jax-offline(/|$)",  # the offline stand-ins, first on the tests' PATH
)]
# pytest's own modules anywhere but in a site-packages: `python -m pytest` run from the working
# directory would import them first
_SHADOW = re.compile(r"(?:^|/)(?:_?pytest|pluggy)(?:/__init__\.py|\.py)$")
_IN_SITE = re.compile(r"/(?:site|dist)-packages/")
OFFLINE_TOOLS = Path(__file__).resolve().parent / "offline"
OFFLINE_MOUNT = "/opt/t1jax-offline"
STAND_IN_ERRORS = "t1jax-stand-in-errors.txt"  # in LOGS: the stand-ins append what they lacked
STAND_IN_NOTES = "t1jax-stand-in-notes.txt"  # and the versions they used other than asked for
# in LOGS, in the order tried: per-assertion results, then the binary outcome
ASSERTION_FILES = (("ctrf.json", parse_ctrf), ("junit.xml", parse_junit))
BINARY_FILES = (("reward.txt", parse_binary_reward), ("reward.json", parse_binary_reward))
RESULT_FILES = tuple(name for name, _ in ASSERTION_FILES + BINARY_FILES)  # read at once
# offline mode only: the stand-in tools first on PATH, and the --ctrf plugin in every pytest
OFFLINE_PREFIX = (f"PATH={OFFLINE_MOUNT}/bin:$PATH PYTEST_PLUGINS=t1jax_ctrf "
                  f"PYTHONPATH={OFFLINE_MOUNT}/py${{PYTHONPATH:+:$PYTHONPATH}} ")
VERIFIER_MODES = ("script", "offline", "pytest")
VERIFY_WHERE = ("agent", "snapshot")  # Harbor's way (services alive) | a fresh sandbox


@dataclasses.dataclass(frozen=True)
class VerifierSettings:
    """How every trial of a job is verified: the mode (VERIFIER_MODES: test.sh as written, with
    the offline stand-ins, or the tests' pytest alone) and where (VERIFY_WHERE: in the agent's
    own sandbox as Harbor does, services alive, or a snapshot's fresh one). One value from
    config.verifier (jobs/build.py verifier_settings), handed to run_trial by every caller."""
    mode: str = "script"
    where: str = "agent"

    def __post_init__(self):
        if self.mode not in VERIFIER_MODES:
            raise ValueError(f"verifier mode {self.mode!r}; choose one of {VERIFIER_MODES}")
        if self.where not in VERIFY_WHERE:
            raise ValueError(f"verifier where {self.where!r}; choose one of {VERIFY_WHERE}")


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
    # versions the stand-ins used other than test.sh asked for (Python 3.11 for -p 3.13,
    # another pytest): the tests ran, on another toolchain than Harbor's
    stand_in_notes: list[str] = dataclasses.field(default_factory=list)
    # why a failed verification is ours, not the agent's ("" when it is the agent's): the
    # stand-ins lacked something, or test.sh could not download its tools (no network here)
    infra_cause: str = ""

    @property
    def failed(self) -> bool:
        """The verification itself failed (no assertion ran: results missing or unreadable, a
        tool the offline mode cannot stand in for, a timeout before any result): not a reward,
        whatever reward.txt says; or the offline stand-ins could not provide what test.sh asked
        for, so its results are not what Harbor would give. Whose failure it is: `blame`."""
        return bool(self.stand_in_errors) or (bool(self.error) and not self.assertions
                                              and not self.tampered)

    @property
    def blame(self) -> str | None:
        """None when the verification did not fail; "infra" when it failed for a reason of ours
        (infra_cause: excluded from scores and from training, like a sandbox that would not
        start); "agent" when the tests started in what the agent left and could not finish
        (they timed out, wrote no results, found their interpreter gone): scored 0 in
        evaluation and trained as reward 0, so making the tests hang is never a way out."""
        if not self.failed:
            return None
        return "infra" if self.infra_cause else "agent"

    @property
    def passed(self) -> int:
        return sum(a.status == "passed" for a in self.assertions)

    @property
    def total(self) -> int:
        return len(self.assertions)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.update(passed=self.passed, total=self.total, failed=self.failed, blame=self.blame)
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
           allow_network: bool = False, where: str = "agent") -> VerifierReport:
    """Run the task's tests on what the agent left, and score them.

    mode 'script' runs the task's tests/test.sh (run-tests.sh for Terminal-Bench 1) as written;
    'offline' runs it as written with the offline tool stand-ins first on PATH; 'pytest' runs
    only the task's test_*.py with the image's own pytest. where: 'agent' in the agent's own
    sandbox (Harbor's way, its processes alive), 'snapshot' in a fresh sandbox from a snapshot
    of its filesystem. allow_network: the run lets sandboxes reach the network (online); the
    snapshot's tests get it when the task allows it too, as under Harbor, where test.sh
    downloads its tools (in place, the tests have the agent's network)."""
    if mode not in VERIFIER_MODES:
        raise ValueError(f"unknown verifier mode {mode!r} (config verifier.mode): "
                         + "|".join(VERIFIER_MODES))
    if where not in VERIFY_WHERE:
        raise ValueError(f"unknown verifier place {where!r} (config verifier.where): "
                         + "|".join(VERIFY_WHERE))
    t0 = time.monotonic()
    tampered = tampered_paths(backend.changes(agent_sandbox))
    snapshot = agent_sandbox.snapshot() if where == "snapshot" else None
    timings = {"snapshot_s": time.monotonic() - t0} if snapshot else {}
    staging = Path(tempfile.mkdtemp(prefix=f"t1jax-tests-{task.task_id}-"))
    try:
        tests = staging / "tests"
        for rel, host in task.test_files().items():
            (tests / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(host, tests / rel)
        before = sha256_tree(tests)
        env = {**resolve_env(task, task.environment.env, "environment.env"),
               **resolve_env(task, task.verifier.env, "verifier.env")}
        if task.layout == "tb1":  # Terminal-Bench 1's harness set it; run-tests.sh reads it
            env["TEST_DIR"] = "/tests"
        limits = limits or Limits()
        log_bytes = max(limits.max_output_bytes, VERIFIER_LOG_BYTES)
        # the agent may have pre-written results, or made /logs a link elsewhere
        reset = (f"rm -rf {LOGS} /tmp/.t1jax_shell_env; [ -L /logs ] && rm -f /logs;"
                 f" mkdir -p {LOGS}")
        if snapshot is None:
            result, files = _run_in_place(task, agent_sandbox, mode, tests, env, reset,
                                          log_bytes, timings)
            after = {rel: hashlib.sha256(data).hexdigest()
                     for rel, data in _read_back(agent_sandbox, before).items()}
        else:
            result, files = _run_in_snapshot(
                task, backend, snapshot, mode, tests, env, reset, timings, run_id,
                dataclasses.replace(limits, max_output_bytes=log_bytes),
                network=allow_network and task.environment.allow_internet and mode != "offline")
            after = sha256_tree(tests)
        assertions, binary, error = _read_results(files, task, result)
        stand_in = files.get(STAND_IN_ERRORS) if mode == "offline" else None
        stand_in_errors = stand_in.splitlines() if stand_in else []
        notes = files.get(STAND_IN_NOTES) if mode == "offline" else None
        stand_in_notes = sorted(set(notes.splitlines())) if notes else []
        if after != before:
            tampered.append("C /tests (checksums changed during verification)")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if snapshot is not None:
            try:
                backend.remove_image(snapshot)
            except Exception:  # a leftover snapshot is reaped later; never mask the outcome
                pass
    infra_cause = ""
    if stand_in_errors:
        error = (error + "; " if error else "") + "offline stand-ins: " + "; ".join(
            stand_in_errors)
        infra_cause = "the offline stand-ins could not provide what test.sh asked for"
    elif error and NETWORK_HINT in error:
        infra_cause = "test.sh could not download its tools (no network in this run)"
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
                          error=error, stand_in_errors=stand_in_errors,
                          stand_in_notes=stand_in_notes, infra_cause=infra_cause)


def _run_in_place(task, sandbox, mode: str, tests: Path, env: dict, reset: str,
                  log_bytes: int, timings: dict):
    """The tests in the agent's own sandbox (fresh execs as the verifier's user): whatever the
    agent left at /tests, /logs/verifier and the stand-ins' folder replaced by ours, written
    from inside the sandbox (a gVisor sandbox does not see files the host adds where it has
    looked before) with read-only modes, then test.sh. Returns (its ExecResult, the result
    files)."""
    t1 = time.monotonic()
    user = task.verifier.user
    copies = [(tests, "/tests")] + ([(OFFLINE_TOOLS, OFFLINE_MOUNT)] if mode == "offline" else [])
    if mode == "offline":  # the stand-ins, never the network (the agent may have had it)
        sandbox.cut_network()
    script = "set -e\n" + "".join(_copy_script(src, dest) for src, dest in copies) + reset
    prep = sandbox.fresh_exec(script, environment={}, user=user, timeout=120,
                              max_output_bytes=log_bytes)
    if prep.exit_code != 0:
        raise SandboxError(f"task {task.task_id}: could not copy the tests in or prepare "
                           f"{LOGS}: {prep.output[-2000:]}")
    timings["start_s"] = time.monotonic() - t1
    t2 = time.monotonic()
    result = sandbox.fresh_exec(_command(task, mode), environment=env, user=user,
                                timeout=task.verifier.timeout_sec, max_output_bytes=log_bytes)
    timings["run_s"] = time.monotonic() - t2
    files = {name: data.decode("utf-8", errors="replace") for name, data in
             sandbox.get_files(LOGS, RESULT_FILES + (STAND_IN_ERRORS, STAND_IN_NOTES)).items()}
    return result, files


COPY_IN_BYTES = 64 * 2**20  # the tests travel inside a shell command: a sane cap


def _copy_script(src: Path, dest: str) -> str:
    """Shell lines that replace `dest` by a copy of the host folder `src` (files r--, or r-x
    where they were executable, folders r-x), decoded from base64 by the sandbox's shell."""
    import base64
    files = sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    if sum(p.stat().st_size for p in files) > COPY_IN_BYTES:
        raise SandboxError(f"{src} holds more than {COPY_IN_BYTES >> 20} MiB of tests")
    lines = [f"rm -rf {dest}", f"mkdir -p {dest}"]
    for d in sorted({p.parent for p in files} - {src}):
        lines.append(f"mkdir -p {shlex.quote(f'{dest}/{d.relative_to(src).as_posix()}')}")
    for p in files:
        target = shlex.quote(f"{dest}/{p.relative_to(src).as_posix()}")
        data = base64.encodebytes(p.read_bytes()).decode()
        lines.append(f"base64 -d > {target} <<'T1JAX_EOF'\n{data}T1JAX_EOF")
        lines.append(f"chmod {'555' if p.stat().st_mode & 0o111 else '444'} {target}")
    lines.append(f"find {dest} -type d -exec chmod 555 {{}} +")
    return "\n".join(lines) + "\n"


def _run_in_snapshot(task, backend, snapshot: str, mode: str, tests: Path, env: dict,
                     reset: str, timings: dict, run_id: str, limits: Limits, network: bool):
    """The tests in a fresh sandbox from the snapshot, /tests a read-only mount. Why 11
    parameters: verify's own state at the point of the call, passed through once."""
    mounts = ((str(tests), "/tests"),)
    if mode == "offline":
        mounts += ((str(OFFLINE_TOOLS), OFFLINE_MOUNT),)
    spec = SandboxSpec(image=snapshot, limits=limits, workdir=task.environment.workdir,
                       user=task.verifier.user, network=network, readonly_mounts=mounts,
                       environment=tuple(env.items()), run_id=run_id)
    t1 = time.monotonic()
    with backend.create(spec) as sandbox:
        timings["start_s"] = time.monotonic() - t1
        prep = sandbox.exec(reset, timeout=60)
        if prep.exit_code != 0:
            raise SandboxError(f"task {task.task_id}: could not prepare {LOGS}: {prep.output}")
        t2 = time.monotonic()
        result = sandbox.exec(_command(task, mode), timeout=task.verifier.timeout_sec)
        timings["run_s"] = time.monotonic() - t2
        files = {name: data.decode("utf-8", errors="replace") for name, data in
                 sandbox.get_files(LOGS, RESULT_FILES + (STAND_IN_ERRORS, STAND_IN_NOTES)).items()}
    return result, files


def _read_back(sandbox, expected: dict) -> dict[str, bytes]:
    """The test files as they are in the sandbox now (missing ones left out)."""
    out = {}
    for rel in expected:
        try:
            out[rel] = sandbox.get(f"/tests/{rel}")
        except (FileNotFoundError, IsADirectoryError, SandboxError):
            pass
    return out


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
                      f"{NETWORK_HINT}, which sandboxes do not have: "
                      "use --config.verifier.mode=offline")
    elif not assertions and binary is None:
        errors.append(f"task {task.task_id}: the verifier wrote no results to {LOGS} "
                      f"(exit code {result.exit_code})")
    return assertions, binary, "; ".join(errors) or None


def report_json(report: VerifierReport) -> str:
    return json.dumps(report.to_dict(), default=str)
