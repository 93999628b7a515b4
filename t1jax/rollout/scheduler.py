"""Oversampled rollout steps with partial-rollout carry-over.

Why: T1 launches more trials than a step needs and admits the first to finish, which silently
drops the longest trials (a bias against long tasks). Here the stragglers are told to stop
between turns and, with carry_over, continue in the next step from where they stopped: their
turns so far are kept (each tagged with the weight version that sampled it, so the trainer can
see the off-policy part), and later turns are sampled by the newer policy.

Resuming without touching the agent loop: an episode's state is its open sandbox plus a log of
every generate call (compact: LoggedCall) and every command it served. The resumed run replays
that log (recorded completions and observations, byte-identical, so the token record is rebuilt
exactly) and then goes live on the same sandbox, whose files already hold the earlier commands'
effects.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import threading
import time
import traceback
from typing import Any, Callable

import numpy as np

from t1jax.rollout.agent import run_agent_episode
from t1jax.rollout.engine import call_seed, generate_in_session
from t1jax.rollout.fan_out import fan_out
from t1jax.rollout.harness import RolloutError
from t1jax.rollout.sample import make_sample
from t1jax.rollout.settings import EpisodeSettings
from t1jax.rollout.trial import TrialSite, run_trial

DONE, STOPPED, FAILED = "done", "stopped", "failed"


@dataclasses.dataclass
class TrialRequest:
    task_id: str
    attempt: int = 0
    state: Any = None  # a stopped trial's resumable state (the trial function's own type)
    carried_steps: int = 0  # how many step boundaries this trial has crossed
    ready: "TrialResult | None" = None  # finished after its step was full: admit next step
    meta: dict = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int]:
        return self.task_id, self.attempt


@dataclasses.dataclass
class TrialResult:
    request: TrialRequest
    status: str  # DONE | STOPPED | FAILED
    sample: Any = None  # DONE: what the trainer consumes
    state: Any = None  # STOPPED: what the next step resumes from (None: nothing to resume)
    error: str | None = None  # FAILED: the exception, with the task id
    duration_s: float = 0.0


@dataclasses.dataclass
class StepResult:
    samples: list  # the admitted results' samples, in launch order
    admitted: list[TrialResult]  # at most batch_size, DONE only
    dropped: list[TrialResult]  # stopped or late trials thrown away (carry_over=False)
    carried: list[TrialRequest]  # put these first in the next step's requests
    failed: list[TrialResult] = dataclasses.field(default_factory=list)
    unlaunched: list[TrialRequest] = dataclasses.field(default_factory=list)


class TrialStopped(Exception):
    """Raised inside a trial at a turn boundary once its step no longer needs it."""


TrialFn = Callable[[TrialRequest, threading.Event], TrialResult]


class CountedAdmission:
    """Which finished trials a step admits: the first `batch_size` to finish, counted here.
    A multi-process job counts them over every process instead (rollout/source.py's
    GlobalAdmission, the same two methods), so the step is decided once, not per process."""

    def __init__(self, batch_size: int):
        self.batch_size, self.count, self._on_full = batch_size, 0, None

    def start(self, on_full: Callable[[], None]) -> None:
        """on_full(): called once the step is full (stop the trials still running)."""
        self._on_full = on_full

    def admit(self, result: "TrialResult") -> bool:
        """Whether a trial that just finished is admitted (called under the step's lock)."""
        self.count += 1
        if self.count == self.batch_size:
            self._on_full()
        return self.count <= self.batch_size

    def stop(self) -> None:
        """Every launched trial has returned."""


class RolloutScheduler:
    """Runs trials on a bounded thread pool; one `collect` call is one RL step's rollouts."""

    def __init__(self, run_trial: TrialFn, *, max_concurrency: int):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.run_trial, self.max_concurrency = run_trial, max_concurrency

    def collect(self, requests: list[TrialRequest], batch_size: int, *, oversample: float = 1.5,
                carry_over: bool = True, admission=None) -> StepResult:
        """Launch up to ceil(batch_size * oversample) trials (carried ones first), admit the
        first batch_size that finish, stop the rest and carry or drop them. Blocks until every
        launched trial has returned (a trial notices the stop at its next turn boundary).
        The admitted trials come in launch order, whatever order they finished in, so a step
        whose trials are the same packs the same batch; with oversample > 1 which trials are
        admitted depends on timing (the point of oversampling), so a seeded run repeats only
        with oversample = 1. admission: who decides (default: CountedAdmission(batch_size))."""
        if batch_size < 1 or oversample < 1.0:
            raise ValueError(f"need batch_size >= 1 and oversample >= 1, got {batch_size}, "
                             f"{oversample}")
        keys = [r.key for r in requests]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate (task_id, attempt) in requests")
        order = sorted(requests, key=lambda r: (r.ready is None, r.state is None))
        n = min(len(order), math.ceil(batch_size * oversample))
        launch, out = order[:n], StepResult([], [], [], [], unlaunched=order[n:])
        stops = {r.key: threading.Event() for r in launch}
        lock = threading.Lock()
        admission = admission if admission is not None else CountedAdmission(batch_size)
        admission.start(lambda: [ev.set() for ev in stops.values()])

        def settle(result: TrialResult) -> None:
            req = result.request
            with lock:
                if result.status == DONE and admission.admit(result):
                    out.admitted.append(result)
                    out.samples.append(result.sample)
                elif result.status == FAILED:
                    out.failed.append(result)
                elif not carry_over:
                    _close(result.state if result.status == STOPPED else None)
                    out.dropped.append(result)
                elif result.status == DONE:  # finished after the batch was full
                    out.carried.append(dataclasses.replace(
                        req, ready=result, carried_steps=req.carried_steps + 1))
                else:
                    state = result.state if result.state is not None else req.state
                    out.carried.append(dataclasses.replace(
                        req, state=state, carried_steps=req.carried_steps + 1))

        try:
            for req in launch:  # finished last step: no thread needed
                if req.ready is not None:
                    settle(dataclasses.replace(req.ready,
                                               request=dataclasses.replace(req, ready=None)))
            fan_out([r for r in launch if r.ready is None],
                    lambda r: self._guarded(r, stops[r.key]), workers=self.max_concurrency,
                    on_done=lambda r, result: settle(result), name="trial")
        finally:
            admission.stop()
        rank = {r.key: i for i, r in enumerate(launch)}
        out.admitted.sort(key=lambda result: rank[result.request.key])
        out.samples[:] = [result.sample for result in out.admitted]
        return out

    def _guarded(self, request: TrialRequest, stop: threading.Event) -> TrialResult:
        """Never raises: a trial's exception becomes a FAILED result naming its task."""
        t0 = time.monotonic()
        if stop.is_set():  # the step filled up before this one got a worker
            return TrialResult(request, STOPPED, state=request.state)
        try:
            result = self.run_trial(request, stop)
            if not isinstance(result, TrialResult) or result.status not in (DONE, STOPPED,
                                                                             FAILED):
                raise TypeError(f"run_trial returned {result!r}, not a TrialResult")
        except TrialStopped:
            return TrialResult(request, STOPPED, state=request.state,
                               duration_s=time.monotonic() - t0)
        except Exception as err:  # noqa: BLE001 - one bad trial must not sink the step
            _close(request.state)
            tb = traceback.format_exc(limit=3)
            return TrialResult(request, FAILED, error=f"task {request.task_id} attempt "
                               f"{request.attempt}: {type(err).__name__}: {err}\n{tb}",
                               duration_s=time.monotonic() - t0)
        result.request = request
        result.duration_s = result.duration_s or time.monotonic() - t0
        return result


def _close(state) -> None:
    close = getattr(state, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # noqa: BLE001 - cleanup of a dropped trial; the run_id reap covers it
            pass


@dataclasses.dataclass
class EpisodeState:
    """A stopped episode: its live sandbox and every generate call and command so far."""
    sandbox: Any
    calls: list = dataclasses.field(default_factory=list)  # LoggedCall, one per generate
    execs: list = dataclasses.field(default_factory=list)  # (command, ExecResult)
    time_left_s: float = 1800.0  # the episode's wall-clock budget not yet used

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None


def _digest(prompt) -> bytes:
    return hashlib.blake2b(np.asarray(prompt, np.int64).tobytes(), digest_size=16).digest()


@dataclasses.dataclass(frozen=True)
class LoggedCall:
    """One generate call as the episode log keeps it. A call whose routes cover its whole
    prompt (an engine that returns them all) kept as it came would make the log grow with the
    sum of all prompts, quadratic in the turns; the log keeps the prompt's digest and the routes
    as their difference from the previous call's: the rows that changed and the new rows. A
    call that returned only new positions' routes (routes_start > 0) is kept as it came."""
    prompt_len: int
    digest: bytes
    result: Any  # the GenerateResult without its routes
    shared: int  # leading rows taken from the previous call's routes
    changed: np.ndarray  # indices (< shared) whose rows differ from the previous call's
    changed_rows: np.ndarray
    tail: np.ndarray  # rows [shared:]

    @classmethod
    def of(cls, prompt, res, previous: np.ndarray | None) -> "LoggedCall":
        routes = np.asarray(res.routed_experts)
        shared = 0
        if previous is not None and previous.shape[1:] == routes.shape[1:] \
                and not res.routes_start:
            shared = min(len(previous), len(routes))
        changed = np.flatnonzero(np.any(previous[:shared] != routes[:shared],
                                        axis=tuple(range(1, routes.ndim)))) if shared else \
            np.zeros(0, np.int64)
        if len(changed) > shared // 2:  # a new chunk: not worth a difference
            shared, changed = 0, np.zeros(0, np.int64)
        return cls(len(prompt), _digest(prompt), dataclasses.replace(res, routed_experts=None),
                   shared, changed, routes[changed].copy(), routes[shared:].copy())

    def routes(self, previous: np.ndarray | None) -> np.ndarray:
        out = self.tail if not self.shared else np.concatenate([previous[:self.shared],
                                                                self.tail])
        if len(self.changed):
            out = out.copy()
            out[self.changed] = self.changed_rows
        return out

    def matches(self, prompt) -> bool:
        return len(prompt) == self.prompt_len and _digest(prompt) == self.digest


class _LoggedEngine:
    """Replays the state's recorded generate calls, then calls the real engine, checking the
    stop event before each live call (a turn boundary) and logging what it returns. With a
    seed_key (seed, task_id, attempt), each live call samples with its call_seed."""

    def __init__(self, engine, state: EpisodeState, stop: threading.Event,
                 seed_key: tuple | None = None):
        self.engine, self.state, self.stop, self.i = engine, state, stop, 0
        self.seed_key = seed_key
        self.max_len = getattr(engine, "max_len", 32768)
        self.weight_version = getattr(engine, "weight_version", "")
        self.last_routes = None  # the previous call's routes, whole

    def generate(self, prompts, sampling):
        (prompt,) = prompts
        i, self.i = self.i, self.i + 1
        if i < len(self.state.calls):
            call = self.state.calls[i]
            if not call.matches(prompt):
                raise RolloutError(f"resumed episode diverged from its log at call {i}")
            self.last_routes = call.routes(self.last_routes)
            return [dataclasses.replace(call.result, routed_experts=self.last_routes)]
        if self.stop.is_set():
            raise TrialStopped()
        if self.seed_key is not None:
            sampling = dataclasses.replace(sampling, seed=call_seed(*self.seed_key, i))
        session = None if self.seed_key is None else "/".join(map(str, self.seed_key))
        (res,) = generate_in_session(self.engine, [prompt], sampling, session)
        self.state.calls.append(LoggedCall.of(prompt, res, self.last_routes))
        self.last_routes = np.asarray(res.routed_experts)
        return [res]


class _LoggedSandbox:
    """Replays the state's recorded command results, then runs commands for real."""

    def __init__(self, state: EpisodeState):
        self.state, self.i = state, 0

    def exec(self, cmd, timeout=None):
        i, self.i = self.i, self.i + 1
        if i < len(self.state.execs):
            recorded, res = self.state.execs[i]
            if cmd != recorded:
                raise RolloutError(f"resumed episode diverged from its log at command {i}")
            return res
        res = self.state.sandbox.exec(cmd, timeout=timeout)
        self.state.execs.append((cmd, res))
        return res

    def __getattr__(self, name):
        return getattr(self.state.sandbox, name)


def episode_trial(site: TrialSite, engine, tokenizer, tasks: dict, *,
                  episode: EpisodeSettings = EpisodeSettings(),
                  seed: int | None = None) -> TrialFn:
    """The real trial: agent episode in a task sandbox at `site` (images built once, graded
    on site.scale, sandboxes labelled site.run_id), verification, Sample.

    seed: None draws every call's sampling seed afresh; an int makes the run's rollouts
    repeatable (call_seed per trial and call).

    engine: an Engine shared by all trials (it must accept concurrent generate calls), or a
    callable request -> Engine. episode: how each episode plays and is verified (the job's one
    EpisodeSettings; its timeout_s is the trial's wall clock over every step it runs in). A
    stopped episode keeps its sandbox open in its EpisodeState; the scheduler closes it if the
    trial is dropped."""
    if site.scale is None:
        raise ValueError("episode_trial grades every trial: give the site a scale")
    episode = episode.with_limits(site.limits)

    def run(request: TrialRequest, stop: threading.Event) -> TrialResult:
        task = tasks[request.task_id]
        inner = engine if hasattr(engine, "generate") else engine(request)
        state = request.state
        if state is None:
            box = site.start(task)
            state = EpisodeState(box, time_left_s=float(
                episode.timeout_s if episode.timeout_s is not None else task.agent.timeout_sec))
        t0 = time.monotonic()
        seed_key = None if seed is None else (seed, request.task_id, request.attempt)
        logged = _LoggedEngine(inner, state, stop, seed_key)

        def play(sandbox):
            return run_agent_episode(task, logged, tokenizer, _LoggedSandbox(state),
                                     episode.replace(timeout_s=max(state.time_left_s, 0.0)))

        try:
            outcome = run_trial(task, site, play, sandbox=state.sandbox,
                                verifier=episode.verifier, grade_failed_play=False,
                                keep_open_on=(TrialStopped,))
        except TrialStopped:  # the sandbox stays open: the next step resumes the episode
            state.time_left_s -= time.monotonic() - t0
            return TrialResult(request, STOPPED, state=state)
        except BaseException:
            state.sandbox = None  # closed by run_trial
            raise
        state.sandbox = None
        if outcome.play_error is not None:
            raise outcome.play_error
        if outcome.verify_error is not None:  # a verification that could not run (SandboxError,
            # OSError): the trial FAILS and is dropped, never trained as reward 0 for our outage
            raise outcome.verify_error
        traj, report = outcome.played, outcome.report
        if report.blame == "infra":  # ours (stand-ins, no network): dropped, not a reward
            return TrialResult(request, FAILED, error=f"task {task.task_id} attempt "
                               f"{request.attempt}: the verification failed "
                               f"({report.infra_cause}): {report.error}")
        sample = make_sample(traj, report, task.task_id, request.attempt,
                             task.category or "")
        if report.blame == "agent":  # its tests hung or wrote nothing in what it left: 0
            sample.reward = 0.0
            sample.metadata["verifier_broken"] = report.error
        sample.metadata["carried_steps"] = request.carried_steps
        sample.metadata["retokenized_drift"] = traj.retokenized_drift
        # what its log-probs are: "full" (log_softmax(logits / T), the trainer's) or "truncated"
        sample.metadata["logprobs"] = getattr(inner, "logprobs", "full")
        return TrialResult(request, DONE, sample=sample)

    return run
