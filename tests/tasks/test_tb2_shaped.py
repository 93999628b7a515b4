"""Terminal-Bench 2.x as its users run it, offline: the bundled tasks in the official layout
(t1jax/tasks/tb2_shaped: our content, the official shapes and features) build on the stand-in
bases, and their oracle and a do-nothing agent give exactly the per-assertion results their
tests mean, with test.sh run as written through the offline stand-ins. Then the evaluation job
runs every one of them and says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from t1jax.tasks.pool import load_pool
from t1jax.curation.validate import run_episode
from t1jax.verify.reward import GlobalScale
from t1jax.verify.verifier import VerifierSettings
from t1jax.rollout.trial import TrialSite

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "t1jax" / "tasks" / "tb2_shaped"
# test function -> passes when the agent does nothing (the rest are goal assertions)
NOTHING_PASSES = {
    "fix-config-port": {"test_other_settings_unchanged"},
    "git-restore-commit": set(),  # main~1 does not exist before the fix: that test fails too
    "word-count-table": {"test_input_untouched"},
    "triple-module": set(),
    "env-greeting": set(),
    "tb1-count-lines": set(),
    "sort-numbers-pip": {"test_input_kept"},
    "make-tree": set(),
    "gzip-archive": {"test_original_kept"},
    "run-built-tool": {"test_secret_kept"},
    "serve-kv": set(),  # the service is not running: every test fails, the file test too
}
# what each task exercises (the official features issue #29 lists), checked on the loaded tasks
FEATURES = {
    "schema 1.0 (TB2.0: version, memory = '2G')": lambda t: t["git-restore-commit"].schema_version == "1.0",
    "schema 1.1": lambda t: t["fix-config-port"].schema_version == "1.1",
    "schema 1.2 (environment.os)": lambda t: t["env-greeting"].schema_version == "1.2",
    "Terminal-Bench 1 (task.yaml)": lambda t: t["tb1-count-lines"].layout == "tb1",
    "allow_internet = true": lambda t: t["fix-config-port"].environment.allow_internet,
    "allow_internet = false": lambda t: not t["gzip-archive"].environment.allow_internet,
    "[environment.env] + [verifier.env]": lambda t: (t["env-greeting"].environment.env
                                                     and t["env-greeting"].verifier.env),
    "WORKDIR other than /app": lambda t: "WORKDIR /workspace" in
    t["env-greeting"].dockerfile.read_text(),
    "python:3.13-slim-bookworm": lambda t: "python:3.13-slim" in
    t["fix-config-port"].dockerfile.read_text(),
    "ubuntu:24.04": lambda t: "ubuntu:24.04" in t["make-tree"].dockerfile.read_text(),
    "apt at build time": lambda t: "apt-get install" in
    t["git-restore-commit"].dockerfile.read_text(),
    "pip at build time": lambda t: "pip install" in t["word-count-table"].dockerfile.read_text(),
    "test.sh sets up before pytest": lambda t: "cp /tests/runner.py" in
    t["triple-module"].test_script.read_text(),
    "a service the solution starts, which the tests call (alive into the verifier)":
    lambda t: "nohup" in t["serve-kv"].solution_script.read_text(),
}


@pytest.fixture(scope="module")
def corpus():
    loaded = load_pool(CORPUS)
    assert not loaded.errors
    return {t.task_id: t for t in loaded.tasks}


def test_the_corpus_uses_every_official_feature(corpus):
    assert set(corpus) == set(NOTHING_PASSES)
    missing = [name for name, has in FEATURES.items() if not has(corpus)]
    assert not missing
    # official task.toml files load without a warning (every loader warning is a real one)
    assert {tid: t.warnings for tid, t in corpus.items() if t.warnings} == {}


@pytest.fixture(scope="module")
def network_backend(docker_backend):
    """The Docker backend, building with the host's network: two tasks apt/pip-install at build
    time, from the package mirrors this machine reaches (sandboxes themselves get none)."""
    from t1jax.sandbox.docker_backend import DockerBackend
    return DockerBackend(build_network="host")


@pytest.mark.slow
def test_oracle_and_do_nothing_offline(corpus, network_backend):
    site = TrialSite(network_backend, run_id="test-tb2-shaped", scale=GlobalScale(3, "test"))
    out = {}
    for tid, task in sorted(corpus.items()):
        for agent in ("oracle", "nothing"):
            result = run_episode(task, agent, site, VerifierSettings("offline"))
            assert result.error is None, (tid, agent, result.error,
                                          result.report and result.report.log[-3000:])
            out[tid, agent] = {a.name.split("::")[-1].split(".")[-1]: a.status
                               for a in result.report.assertions}
            assert not result.report.stand_in_errors and not result.report.tampered
    for tid in corpus:
        oracle, nothing = out[tid, "oracle"], out[tid, "nothing"]
        assert oracle and set(oracle.values()) == {"passed"}, (tid, oracle)
        assert set(nothing) == set(oracle), tid
        assert {n for n, s in nothing.items() if s == "passed"} == NOTHING_PASSES[tid], tid


@pytest.mark.slow
def test_eval_job_runs_every_task_and_says_so(corpus, network_backend, tmp_path):
    """The documented offline command: every task evaluated (none skipped), one attempt of an
    untrained policy, exit 0, and a summary that counts them."""
    workdir = tmp_path / "eval"
    done = subprocess.run(
        [sys.executable, "experiments/run.py", "--config", "configs/eval.py:offline",
         "--workdir", str(workdir), f"--config.tasks={CORPUS}", "--config.eval.attempts=1",
         "--config.rollouts.max_turns=1", "--config.rollouts.max_new_tokens=8",
         "--config.harness=tools",
         "--config.sandbox.build_network=host", "--config.sandbox.concurrency=3"],
        cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["tasks"] == len(corpus) and summary["skipped"] == []
    assert summary["trials"] == len(corpus)
    rows = [json.loads(line) for line in (workdir / "trials.jsonl").read_text().splitlines()]
    assert {r["task_id"] for r in rows} == set(corpus)
    # an untrained policy solves nothing, and every verification ran
    assert all(r["failure_mode"] not in ("verifier_error", "verifier_broken", "infra_error")
               for r in rows), [
        (r["task_id"], r.get("verifier_error")) for r in rows]
