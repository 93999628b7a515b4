"""The oversampling scheduler with fast fake trials (a sleep-based test double for episodes:
each "turn" sleeps, and the trial checks the stop event between turns), then one real episode
trial: scripted engines on the `count-log-errors` sandbox, batch 2 of 3 launched, the straggler
carried into the next step and finished there by a newer "policy".
"""

from __future__ import annotations

import dataclasses
import threading
import time
import types
import uuid

import numpy as np
import pytest

from t1jax.rollout.harness import RolloutError
from t1jax.rollout.chat import IM_END, render_tool_call
from t1jax.rollout.engine import FINISH_STOP, GenerateResult, SamplingParams
from t1jax.rollout.settings import EpisodeSettings
from t1jax.rollout.scheduler import (DONE, STOPPED, EpisodeState, RolloutScheduler, TrialRequest,
                                     TrialResult, TrialStopped, episode_trial)
from t1jax.rollout.tokenizer import train_tokenizer
from t1jax.rollout.trial import TrialSite
from t1jax.sandbox.base import SandboxError
from t1jax.tasks.task import load_task
from t1jax.verify.reward import GlobalScale
from conftest import COUNT_LOG_SOLVE, COUNT_LOG_TASK

TURN_S = 0.02


class FakeTrials:
    """A test double for episodes: request.meta["turns"] turns of TURN_S each; the state is the
    list of turns done so far, so a carried trial resumes where it stopped. Tracks concurrency."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running = self.max_running = 0
        self.stopped: list[tuple] = []

    def __call__(self, req: TrialRequest, stop: threading.Event) -> TrialResult:
        with self.lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            if req.meta.get("raise"):
                raise ValueError("boom")
            done = list(req.state or [])
            while len(done) < req.meta["turns"]:
                if stop.is_set():
                    with self.lock:
                        self.stopped.append(req.key)
                    return TrialResult(req, STOPPED, state=done)
                time.sleep(TURN_S)
                done.append(req.carried_steps)  # which step ran this turn
            return TrialResult(req, DONE, sample={"key": req.key, "turns": done})
        finally:
            with self.lock:
                self.running -= 1


def requests(turns, **meta):
    return [TrialRequest(f"t{i}", 0, meta={"turns": n, **meta}) for i, n in enumerate(turns)]


def all_keys(step):
    keys = ([r.request.key for r in step.admitted + step.dropped + step.failed]
            + [r.key for r in step.carried + step.unlaunched])
    assert len(keys) == len(set(keys)), "a trial was duplicated"
    return sorted(keys)


def test_admits_exactly_batch_size_fastest_and_carries_stragglers():
    fake = FakeTrials()
    reqs = requests([1, 40, 2, 60, 3, 50])  # 3 fast, 3 slow
    step = RolloutScheduler(fake, max_concurrency=6).collect(reqs, 3, oversample=2.0)
    assert len(step.admitted) == len(step.samples) == 3
    assert {s["key"][0] for s in step.samples} == {"t0", "t2", "t4"}
    assert sorted(r.task_id for r in step.carried) == ["t1", "t3", "t5"]
    assert sorted(k[0] for k in fake.stopped) == ["t1", "t3", "t5"]
    assert not step.dropped and not step.failed and not step.unlaunched
    assert all_keys(step) == sorted(r.key for r in reqs)
    for r in step.carried:  # partial progress kept, counted as one step boundary
        assert r.carried_steps == 1 and 0 < len(r.state) < r.meta["turns"]

    # Next step: carried trials go first and finish from where they stopped.
    fresh = requests([1, 1, 1])
    fresh = [TrialRequest(f"n{i}", 0, meta=r.meta) for i, r in enumerate(fresh)]
    step2 = RolloutScheduler(fake, max_concurrency=3).collect(step.carried + fresh, 3,
                                                             oversample=1.0)
    assert sorted(s["key"][0] for s in step2.samples) == ["t1", "t3", "t5"]
    for s in step2.samples:  # turns from both steps, each tagged with the step that ran it
        assert set(s["turns"]) == {0, 1} and s["turns"] == sorted(s["turns"])
    assert sorted(r.task_id for r in step2.unlaunched) == ["n0", "n1", "n2"]


def test_carried_trials_survive_a_resume_and_start_afresh():
    """A checkpoint taken with trials carried over names them; a resumed run (new process:
    new scheduler, sampler and source) launches them first in its next step, from turn 0 with
    the same task and attempt, instead of losing them."""
    import json

    from t1jax.rollout.source import LiveRollouts
    from t1jax.tasks.sampler import EpochSampler
    turns = {"t0": 1, "t1": 40, "t2": 2, "t3": 60, "t4": 3, "t5": 50}
    tasks = [types.SimpleNamespace(task_id=t) for t in turns]
    fake = FakeTrials()

    def trial(req, stop):  # the turn count comes from the task: a checkpoint keeps no meta
        result = fake(dataclasses.replace(req, meta={"turns": turns[req.task_id]}), stop)
        if result.sample is not None:
            result.sample = types.SimpleNamespace(metadata={}, **result.sample)
        return result

    def source():
        return LiveRollouts(RolloutScheduler(trial, max_concurrency=6), tasks,
                            EpochSampler(len(tasks), 0), engine=None, batch_size=3,
                            oversample=2.0, carry_over=True)

    before = source()
    assert len(before.collect(0)) == 3
    carried = [r.key for r in before.last_result.carried]
    assert sorted(k[0] for k in carried) == ["t1", "t3", "t5"]
    state = json.loads(json.dumps(before.state_dict()))  # as the checkpoint's meta holds it

    after = source()
    after.load_state_dict(state)
    after.collect(1)
    step = after.last_result
    launched = all_keys(step)
    assert set(carried) <= set(launched), "a carried trial was lost on resume"
    assert sorted(k[1] for k in launched) == sorted([k[1] for k in carried] + [6, 7, 8]), \
        "attempts were reused or skipped"
    for result in step.admitted + step.dropped:
        if result.request.key in carried:  # restarted: every turn ran in this step
            assert set(result.sample.turns) == {1}
    for request in step.carried:
        if request.key in carried:
            assert request.carried_steps == 2 and set(request.state) == {1}

    state["carried"][0]["task_id"] = "gone"
    with pytest.raises(ValueError, match="gone"):
        source().load_state_dict(state)


def test_admitted_trials_come_in_launch_order_whatever_order_they_finish():
    """A step whose trials are the same packs the same batch: the slowest-first requests
    finish fastest-first, and the samples still come in request order."""
    step = RolloutScheduler(FakeTrials(), max_concurrency=4).collect(
        requests([8, 6, 4, 2]), 4, oversample=1.0)
    assert [s["key"][0] for s in step.samples] == ["t0", "t1", "t2", "t3"]
    assert [r.request.key[0] for r in step.admitted] == ["t0", "t1", "t2", "t3"]


def test_carry_over_false_drops_stragglers():
    fake = FakeTrials()
    reqs = requests([1, 1, 40, 40])
    step = RolloutScheduler(fake, max_concurrency=4).collect(reqs, 2, oversample=2.0,
                                                            carry_over=False)
    assert len(step.admitted) == 2 and not step.carried
    assert sorted(r.request.task_id for r in step.dropped) == ["t2", "t3"]
    assert all(r.status == STOPPED for r in step.dropped)
    assert all_keys(step) == sorted(r.key for r in reqs)


def test_launch_count_and_concurrency_bound():
    fake = FakeTrials()
    reqs = requests([2] * 10)
    step = RolloutScheduler(fake, max_concurrency=2).collect(reqs, 4, oversample=1.5)
    assert len(step.admitted) == 4
    assert len(step.unlaunched) == 4  # ceil(4 * 1.5) = 6 launched
    assert fake.max_running <= 2
    # The two launched beyond the batch are stopped before their last turn (or before starting).
    assert len(step.carried) == 2 and all(len(r.state or []) < 2 for r in step.carried)
    assert all_keys(step) == sorted(r.key for r in reqs)


def test_raising_trial_is_a_failed_result():
    fake = FakeTrials()
    reqs = requests([1, 1, 1])
    reqs[1].meta = {"turns": 1, "raise": True}
    step = RolloutScheduler(fake, max_concurrency=3).collect(reqs, 3, oversample=1.0)
    assert len(step.admitted) == 2
    (bad,) = step.failed
    assert bad.request.task_id == "t1" and "task t1" in bad.error and "boom" in bad.error
    assert all_keys(step) == sorted(r.key for r in reqs)


def test_late_finisher_is_carried_ready_and_admitted_next_step():
    """A trial that finishes after the batch filled (no turn boundary left) is not admitted
    twice, nor lost: it is carried ready and admitted first next step without rerunning."""
    started = threading.Event()

    def trial(req, stop):
        if req.task_id == "late":
            started.set()
            assert stop.wait(5)
        else:
            assert started.wait(5)
        return TrialResult(req, DONE, sample=req.task_id)

    reqs = [TrialRequest("fast"), TrialRequest("late")]
    step = RolloutScheduler(trial, max_concurrency=2).collect(reqs, 1, oversample=2.0)
    assert step.samples == ["fast"]
    (late,) = step.carried
    assert late.ready is not None
    step2 = RolloutScheduler(lambda r, s: pytest.fail("reran"), max_concurrency=1).collect(
        [late], 1)
    assert step2.samples == ["late"] and step2.admitted[0].request.ready is None


def test_bad_arguments():
    sched = RolloutScheduler(FakeTrials(), max_concurrency=1)
    with pytest.raises(ValueError, match="duplicate"):
        sched.collect([TrialRequest("a"), TrialRequest("a")], 1)
    with pytest.raises(ValueError):
        RolloutScheduler(FakeTrials(), max_concurrency=0)


# ---- one real trial on Docker ----------------------------------------------------------------

TASK_DIR = COUNT_LOG_TASK
LAYERS, K = 3, 2
SOLVE = COUNT_LOG_SOLVE


class Scripted:
    """A test double for the model: pre-written completions, fake log-probs and routes of the
    contract's shape; `hold` makes a call wait until the given event is set (a long generation
    still running when the step fills up)."""

    def __init__(self, tok, texts, version, hold=None):
        self.tok, self.texts, self.weight_version, self.hold = tok, list(texts), version, hold

    def generate(self, prompts, sampling):
        (prompt,) = prompts
        if self.hold is not None and len(self.texts) == 1:
            assert self.hold.wait(30), "the step never stopped this trial"
        ids = self.tok.encode(self.texts.pop(0), add_special_tokens=False).ids + \
            [self.tok.token_to_id(IM_END)]
        rows = len(prompt) + len(ids) - 1
        routes = (np.arange(rows * LAYERS * K) % 7).reshape(rows, LAYERS, K).astype(np.int32)
        return [GenerateResult(ids, [-0.5] * len(ids), routes, FINISH_STOP, self.weight_version)]


@pytest.mark.slow
def test_episode_trial_batch_two_of_three_carries_the_straggler(docker_backend):
    tok, task = train_tokenizer(), load_task(TASK_DIR)
    run_id = f"test-sched-{uuid.uuid4().hex[:8]}"
    stops: dict[int, threading.Event] = {}
    solve = [render_tool_call(SOLVE), "Done."]

    def engine_for(req):
        if req.attempt < 2:
            return Scripted(tok, solve, "v0")
        if req.carried_steps == 0:  # the straggler: one quick turn, then a held one
            return Scripted(tok, [render_tool_call("echo partial-$((6*7)) > /app/p.txt"),
                                  render_tool_call("ls /app")], "v0", hold=stops[2])
        # Resumed after a weight update, in the same sandbox: turn 1's file is still there.
        return Scripted(tok, [render_tool_call("cat /app/p.txt"), *solve], "v1")

    trial = episode_trial(TrialSite(docker_backend, run_id=run_id, scale=GlobalScale(5, "test")),
                          engine_for, tok, {task.task_id: task},
                          episode=EpisodeSettings(max_new_tokens=256, max_tokens=8192))

    def run(req, stop):
        stops[req.attempt] = stop
        return trial(req, stop)

    stops[2] = threading.Event()
    reqs = [TrialRequest(task.task_id, a) for a in range(3)]
    sched = RolloutScheduler(run, max_concurrency=3)
    try:
        step = sched.collect(reqs, 2, oversample=1.5)
        assert sorted(r.request.attempt for r in step.admitted) == [0, 1]
        for s in step.samples:
            assert s.reward > 0 and s.metadata["verifier"]["solved"]
            assert s.metadata["weight_versions"] == ["v0", "v0"]
        (carried,) = step.carried
        assert carried.attempt == 2 and isinstance(carried.state, EpisodeState)
        assert len(carried.state.calls) == 2 and carried.state.sandbox is not None
        assert not step.dropped and not step.failed

        step2 = sched.collect([carried], 1, oversample=1.0)
        (sample,) = step2.samples
        meta = sample.metadata
        assert meta["verifier"]["solved"] and meta["turns"] == 5, meta
        assert meta["weight_versions"] == ["v0", "v0", "v1", "v1", "v1"]
        assert "partial-42" in tok.decode(sample.tokens.tolist())
        assert meta["carried_steps"] == 1 and carried.state.sandbox is None  # closed
    finally:
        docker_backend.reap(run_id)


STAND_IN_GAP = "uvx: numpy is not in the image"


@pytest.mark.slow
@pytest.mark.parametrize("outage", [SandboxError("the daemon went away"),
                                    OSError(28, "No space left on device"),
                                    "stand-ins", "no-results"],
                         ids=["sandbox", "os", "stand-ins", "no-results"])
def test_a_verification_outage_drops_the_trial_and_a_broken_one_trains_as_zero(
        docker_backend, monkeypatch, outage):
    """Two real trials that both solve the task; the first one's verification fails, injected
    at the verifier's boundary. Ours (the daemon, the disk, an offline stand-in that lacks a
    package): that trial FAILS, named, and is dropped and counted; the other is the step's
    sample, and nothing is trained as reward 0 for our outage. The agent's (its tests ran in
    what it left and wrote no results): that trial is the step's sample, at reward 0, counted
    in rollout/verifier_broken: making the tests hang or write nothing is never a way out."""
    from t1jax.rollout.source import LiveRollouts
    from t1jax.rollout import trial as trial_lib
    from t1jax.tasks.sampler import EpochSampler
    tok, task = train_tokenizer(), load_task(TASK_DIR)
    run_id = f"test-outage-{uuid.uuid4().hex[:8]}"
    real_verify, calls = trial_lib.verify, []

    def verify(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            if outage == "no-results":  # reward.txt may still say 0
                report = real_verify(*args, **kwargs)
                return dataclasses.replace(report, assertions=[], binary=0.0,
                                           error="the verifier wrote no results")
            if outage == "stand-ins":
                report = real_verify(*args, **kwargs)
                return dataclasses.replace(report, stand_in_errors=[STAND_IN_GAP],
                                           error=STAND_IN_GAP, infra_cause="stand-ins")
            raise outage
        return real_verify(*args, **kwargs)

    monkeypatch.setattr(trial_lib, "verify", verify)
    trial = episode_trial(TrialSite(docker_backend, run_id=run_id, scale=GlobalScale(5, "test")),
                          lambda req: Scripted(tok, [render_tool_call(SOLVE), "Done."], "v0"),
                          tok, {task.task_id: task},
                          episode=EpisodeSettings(max_new_tokens=256, max_tokens=8192))
    source = LiveRollouts(RolloutScheduler(trial, max_concurrency=1), [task], EpochSampler(1, 0),
                          engine=None, batch_size=1, oversample=2.0, carry_over=False)
    try:
        (sample,) = source.collect(0)
        if outage == "no-results":
            assert sample.reward == 0 and sample.metadata["verifier_broken"]
            assert source.last_metrics["rollout/verifier_broken"] == 1
            assert source.last_metrics["rollout/infra_failures"] == 0
            assert not source.last_result.failed
            return
        assert sample.reward > 0 and sample.metadata["verifier"]["solved"]
        assert source.last_metrics["rollout/infra_failures"] == 1 and len(calls) == 2
        assert source.last_metrics["rollout/verifier_broken"] == 0
        # "v0" is no step number: no staleness is made up for it
        assert not any(key.startswith("staleness/") for key in source.last_metrics)
        (failed,) = source.last_result.failed
        assert task.task_id in failed.error
        assert (STAND_IN_GAP if outage == "stand-ins" else str(outage)) in failed.error
    finally:
        docker_backend.reap(run_id)


def test_episode_log_keeps_routes_as_differences_and_replays_them_exactly():
    """The log of a long episode grows with its tokens, not with the sum of its prompts: each
    call's routes are kept as the rows it changed and added; a resumed episode gets every
    call's routes back whole, bit for bit, across a compaction (a prompt that does not extend
    the last) and a call that routed earlier positions differently."""
    from t1jax.rollout.scheduler import LoggedCall, _LoggedEngine
    rng = np.random.RandomState(0)

    class Growing:
        weight_version = "v"

        def __init__(self):
            self.rows = None

        def generate(self, prompts, sampling):
            (prompt,) = prompts
            rows = len(prompt) + 4 - 1
            fresh = rng.randint(0, 8, (rows, LAYERS, K)).astype(np.int32)
            if self.rows is not None and len(prompt) > 40:  # the same chunk: earlier rows kept
                n = min(len(self.rows), rows)
                fresh[:n] = self.rows[:n]
                fresh[n // 2] = (fresh[n // 2] + 1) % 8  # one position re-routed
            self.rows = fresh
            return [GenerateResult([1, 2, 3, 4], [-0.5] * 4, fresh, FINISH_STOP, "v")]

    prompts, prompt = [], list(range(30))
    for turn in range(60):
        prompt = prompt + [7] * 20 if turn % 20 else list(range(30))  # a new chunk every 20
        prompts.append(list(prompt))
    state, originals = EpisodeState(sandbox=None), []
    live = _LoggedEngine(Growing(), state, threading.Event())
    for p in prompts:
        originals.append(live.generate([p], SamplingParams())[0].routed_experts)
    assert all(isinstance(c, LoggedCall) for c in state.calls)
    kept = sum(c.tail.nbytes + c.changed_rows.nbytes for c in state.calls)
    whole = sum(r.nbytes for r in originals)
    assert kept < whole / 5, (kept, whole)  # ~1/10 here; the sum of prompts would be all
    stop = threading.Event()
    stop.set()  # a replay never reaches the engine
    replay = _LoggedEngine(None, state, stop)
    for p, want in zip(prompts, originals):
        np.testing.assert_array_equal(replay.generate([p], SamplingParams())[0].routed_experts,
                                      want)
    with pytest.raises(TrialStopped):
        replay.generate([prompts[-1] + [9]], SamplingParams())
    diverged = _LoggedEngine(None, state, stop)
    with pytest.raises(RolloutError, match="diverged from its log at call 0"):
        diverged.generate([[5] + prompts[0][1:]], SamplingParams())


def test_seeded_trials_repeat_their_draws_and_carry_over_keeps_them():
    """rollouts.sampling_seed: every live call gets its own seed from (seed, task, attempt,
    call); a trial resumed from its log goes on with the seeds the uninterrupted trial would
    have used; other attempts and other seeds draw other streams; no seed leaves the params."""
    from t1jax.rollout.engine import call_seed
    from t1jax.rollout.scheduler import _LoggedEngine

    class Seeds:
        weight_version = "v"

        def __init__(self):
            self.seen = []

        def generate(self, prompts, sampling):
            self.seen.append(sampling.seed)
            return [GenerateResult([1], [-0.5], np.zeros((len(prompts[0]), LAYERS, K), np.int32),
                                   FINISH_STOP, "v")]

    prompts = [list(range(5 + i)) for i in range(6)]

    def run(seed_key, state=None, calls=6):
        engine = Seeds()
        logged = _LoggedEngine(engine, state or EpisodeState(sandbox=None), threading.Event(),
                               seed_key)
        for p in prompts[:calls]:
            logged.generate([p], SamplingParams(seed=None))
        return engine.seen

    whole = run((7, "task-a", 3))
    assert whole == [call_seed(7, "task-a", 3, i) for i in range(6)]
    assert len(set(whole)) == 6 and all(0 <= s < 2**31 for s in whole)
    assert run((7, "task-a", 3)) == whole
    state = EpisodeState(sandbox=None)
    assert run((7, "task-a", 3), state, calls=2) == whole[:2]
    assert run((7, "task-a", 3), state) == whole[2:]  # two replayed, four live
    for other in [(7, "task-a", 4), (7, "task-b", 3), (8, "task-a", 3)]:
        assert not set(run(other)) & set(whole), other
    assert run(None) == [None] * 6


def test_live_rollouts_group_size_draws_each_task_that_many_times():
    """rollouts.group_size=k: a step's batch holds batch_size / k tasks, k trials of each, with
    distinct attempts (the per-task baseline compares them)."""
    from t1jax.rollout.source import LiveRollouts
    from t1jax.rollout.scheduler import StepResult
    from t1jax.tasks.sampler import EpochSampler

    class Recorder:
        def collect(self, requests, batch_size, *, oversample, carry_over):
            self.requests = list(requests)
            samples = [types.SimpleNamespace(metadata={"task_id": r.task_id}) for r in requests]
            return StepResult(samples, [], [], [])

    tasks = [types.SimpleNamespace(task_id=f"t{i}") for i in range(10)]
    recorder = Recorder()
    source = LiveRollouts(recorder, tasks, EpochSampler(len(tasks), 0), engine=None,
                          batch_size=8, oversample=1.0, carry_over=False, group_size=4)
    source.collect(0)
    ids = [r.task_id for r in recorder.requests]
    assert len(ids) == 8 and len(set(ids)) == 2 and all(ids.count(t) == 4 for t in set(ids))
    assert len({r.attempt for r in recorder.requests}) == 8
    with pytest.raises(ValueError, match="group_size"):
        LiveRollouts(recorder, tasks, EpochSampler(len(tasks), 0), engine=None, batch_size=8,
                     group_size=0)
