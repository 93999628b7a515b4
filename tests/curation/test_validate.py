"""Pool validation logic that needs no sandbox: network policy, health rules, scale."""

import dataclasses

from t1jax.sandbox.base import SandboxError
from t1jax.tasks.pool import default_pool_dir, load_pool
from t1jax.curation.validate import EpisodeResult, run_episode, summarize
from t1jax.rollout.fan_out import Images
from t1jax.rollout.trial import TrialSite
from t1jax.verify.results import Assertion
from t1jax.verify.reward import GlobalScale, pool_scale, static_assertion_count
from t1jax.verify.verifier import VerifierReport


class RecordingBackend:
    """Records the sandbox specs it is asked for and refuses to start them (a test double for
    the network policy only; real sandboxes are tested in test_sandbox_docker/test_bwrap)."""

    def __init__(self):
        self.specs = []

    def create(self, spec):
        self.specs.append(spec)
        raise SandboxError("recording only")


def seed(task_id):
    return next(t for t in load_pool(default_pool_dir()).tasks if t.task_id == task_id)


def test_network_needs_both_the_task_and_the_run_config():
    task = seed("organize-files")
    internet = dataclasses.replace(task, environment=dataclasses.replace(
        task.environment, allow_internet=True))
    offline = dataclasses.replace(task, environment=dataclasses.replace(
        task.environment, allow_internet=False))
    backend = RecordingBackend()
    for t, allow in ((internet, False), (offline, True), (internet, True)):
        site = TrialSite(backend, run_id="r", allow_network=allow, scale=GlobalScale(5, "t"),
                         images=Images(backend, {t.task_id: "img"}))
        result = run_episode(t, "nothing", site)
        assert result.report is None and "recording only" in result.error
    assert [s.network for s in backend.specs] == [False, False, True]
    assert backend.specs[0].limits.memory_mb == task.environment.memory_mb


def report(names_statuses, solved):
    assertions = [Assertion(n, s) for n, s in names_statuses]
    return VerifierReport("t", assertions, 1.0 if solved else 0.0, solved, 0.0, "dense", [], {},
                          0, False, "", {})


def test_health_rules_ignore_invariants_only():
    ok_oracle = EpisodeResult("a", "oracle", report([("x::test_goal", "passed"),
                                                     ("x::test_invariant_kept", "passed")], True),
                              0, 0)
    ok_nothing = EpisodeResult("a", "nothing", report([("x::test_goal", "failed"),
                                                       ("x::test_invariant_kept", "passed")],
                                                      False), 0, 0)
    leaky = EpisodeResult("b", "nothing", report([("x::test_goal", "passed")], False), 0, 0)
    partial = EpisodeResult("b", "oracle", report([("x::test_goal", "passed"),
                                                   ("x::test_other", "failed")], False), 0, 0)
    summary = summarize([ok_oracle, ok_nothing, leaky, partial], GlobalScale(2, "t"))
    assert summary["unhealthy"] == ["b"] and summary["healthy"] == 1
    assert not summary["pool_healthy"]


def test_outside_tasks_are_judged_without_our_naming():
    """An outside task names no invariants: doing nothing that passes some of its assertions
    (an input it leaves intact, under any name) is healthy and listed as a leak; doing nothing
    that passes all of them, or an oracle that fails one, is not."""
    oracle = lambda t, statuses: EpisodeResult(  # noqa: E731
        t, "oracle", report([(f"t::test_{i}", s) for i, s in enumerate(statuses)],
                            all(s == "passed" for s in statuses)), 0, 0)
    nothing = lambda t, statuses: EpisodeResult(  # noqa: E731
        t, "nothing", report([(f"t::test_{i}", s) for i, s in enumerate(statuses)], False), 0, 0)
    results = [oracle("some", ["passed"] * 3), nothing("some", ["passed", "failed", "failed"]),
               oracle("all", ["passed"] * 2), nothing("all", ["passed", "passed"]),
               oracle("none", ["passed"] * 2), nothing("none", ["failed", "failed"]),
               oracle("bad-oracle", ["passed", "failed"]), nothing("bad-oracle", ["failed"] * 2)]
    summary = summarize(results, GlobalScale(3, "t"))
    assert summary["unhealthy"] == ["all", "bad-oracle"]
    assert summary["nothing_leaks"] == ["some"]


def test_scale_comes_from_static_counts_or_config():
    tasks = load_pool(default_pool_dir()).tasks
    counts = sorted(static_assertion_count(t) for t in tasks)
    assert all(c >= 3 for c in counts)
    assert pool_scale(tasks, 1.0).value == counts[-1]
    assert pool_scale(tasks, fixed=7).value == 7
