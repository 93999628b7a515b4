"""The training loop's live rollout source: each step, tasks drawn by the epoch sampler become
trial requests for the rollout scheduler, whose samples (also written to the workdir) the loop
trains on, and each new policy is published to the engine that samples them.

Why here and not in rl/: it builds the scheduler's requests and reads its results; training
sees only Samples, through the loop's RolloutSource protocol (t1jax/rl/loop.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import shutil
import threading
from pathlib import Path

from absl import logging

from t1jax import distributed
from t1jax.rollout.sample import mark_dataset_complete, save_dataset, save_samples, staleness
from t1jax.rollout.scheduler import StepResult, TrialRequest

_INSTANCES = itertools.count()


def check_reward_scale(recorded: float | None, current: float | None, where: str) -> None:
    """A ValueError when trials scored on one dense-reward scale would meet a critic or a run
    that learned on another (values 2.25x too large or small, no other symptom); None on
    either side (a checkpoint from before the scale was recorded, a job without one) passes."""
    if recorded is not None and current is not None and float(recorded) != float(current):
        raise ValueError(
            f"the dense reward's scale is {current:g} here but {recorded:g} in {where}: the "
            "critic's values are in units of the scale it learned on. Keep one pool (the scale "
            "is a quantile of its tasks' assertion counts) or fix it for every phase with "
            "--config.verifier.global_scale")


class GlobalAdmission:
    """Oversampled admission decided once for a multi-process step: the first `batch_size`
    trials to finish on any process are admitted. Each finished trial takes a ticket from a
    counter the coordination service keeps for the step (tickets 1..batch_size are admitted,
    the ticket is its sample's metadata["admission"]); the process that takes the last one
    raises the step's flag, and every process stops its running trials once it sees the flag
    (a watcher thread polls it) or takes a later ticket. The scheduler's CountedAdmission with
    a shared counter, in short."""

    POLL_S = 0.1

    def __init__(self, batch_size: int, key: str):
        self.batch_size, self.key = batch_size, key
        self._done = threading.Event()
        self._watcher: threading.Thread | None = None
        self._full = threading.Event()

    def start(self, on_full) -> None:
        def fill() -> None:
            if not self._full.is_set():
                self._full.set()
                on_full()
        self._fill = fill

        def watch() -> None:
            while not self._done.wait(self.POLL_S):
                if distributed.flag_raised(f"{self.key}/full"):
                    fill()
                    return
        self._watcher = threading.Thread(target=watch, name="admission", daemon=True)
        self._watcher.start()

    def admit(self, result) -> bool:
        ticket = distributed.increment(f"{self.key}/tickets")
        if ticket == self.batch_size:
            distributed.raise_flag(f"{self.key}/full")
        if ticket >= self.batch_size:
            self._fill()
        if ticket <= self.batch_size:
            result.sample.metadata["admission"] = ticket
            return True
        return False

    def stop(self) -> None:
        self._done.set()
        if self._watcher is not None:
            self._watcher.join()


class LiveRollouts:
    """Agent episodes for real: tasks drawn by the epoch sampler, run by the rollout scheduler
    (oversampling, carry-over), through an engine that gets each new policy published."""

    def __init__(self, scheduler, tasks: list, sampler, engine, *, batch_size: int,
                 oversample: float = 1.5, carry_over: bool = True, record_dir=None,
                 publish=None, group_size: int = 1, processes: tuple[int, int] = (0, 1),
                 reward_scale: float | None = None):
        """Why 12 parameters: the source joins four parts built apart (scheduler, tasks,
        sampler, engine) with the rollouts block's step shape (batch_size, oversample,
        carry_over, group_size) and the job's bookkeeping (record_dir, publish, processes,
        reward_scale); each is stored once and read by collect.

        group_size: trials of each drawn task per step (T1: 1); with more, a step holds
        batch_size / group_size tasks, and rl.baseline='task' compares each trial with its
        task's others. processes: (this process, of how many) in a multi-process job: every
        process draws the same requests, plays every processes-th of them, and receives
        everyone's samples, so all hold the same step in the same order. reward_scale: the
        dense reward's fixed denominator these trials are scored on, kept in every checkpoint
        (a resume on another is refused: the critic's values are in its units)."""
        if group_size < 1:
            raise ValueError(f"rollouts.group_size must be >= 1, got {group_size}")
        self.process, self.processes = processes
        # across processes with oversampling, each carries its own trials (their sandboxes and
        # partial episodes live there) and the step's admission is decided over all of them
        self.admitted_globally = self.processes > 1 and oversample > 1
        self._instance = next(_INSTANCES)  # the same on every process: names its exchanges
        self._states = 0  # state_dict calls (every process makes the same ones)
        self.scheduler, self.tasks, self.sampler, self.engine = scheduler, tasks, sampler, engine
        self.group_size = group_size
        self.reward_scale = reward_scale
        self.batch_size, self.oversample, self.carry_over = batch_size, oversample, carry_over
        self.record_dir = Path(record_dir) if record_dir else None
        self._publish = publish
        self._carried: list = []
        self._next_attempt = 0  # unique per trial of the run: (task, attempt) names a sample
        self.last_result = None
        # of the last collect: trials that raised (engine, sandbox or verifier outage; dropped)
        # and how stale the admitted ones were
        self.last_metrics: dict = {}

    def collect(self, step: int):
        carried = (distributed.exchange_objects(f"carried/{self._instance}/{step}",
                                                len(self._carried))
                   if self.admitted_globally else [len(self._carried)])
        want = max(0, math.ceil(self.batch_size * self.oversample) - sum(carried))
        fresh = []
        for i in self.sampler.take(math.ceil(want / self.group_size)):
            for _ in range(self.group_size):
                if len(fresh) < want:
                    fresh.append(TrialRequest(self.tasks[i].task_id, attempt=self._next_attempt))
                    self._next_attempt += 1
        requests = self._carried + fresh
        if self.admitted_globally:
            samples, failures = self._collect_admitted(step, fresh, carried)
        elif self.processes > 1:
            samples, failures = self._collect_split(step, requests)
        else:
            result = self.scheduler.collect(requests, self.batch_size,
                                            oversample=self.oversample,
                                            carry_over=self.carry_over)
            self._carried = result.carried
            self.last_result = result
            samples, failures = result.samples, len(result.failed)
            for failed in result.failed:
                logging.warning("trial failed (dropped, not trained): %s", failed.error)
        # infra failures (ours) are dropped; verifications the agent broke are trained as 0
        self.last_metrics = {"rollout/infra_failures": failures,
                             "rollout/verifier_broken": sum("verifier_broken" in s.metadata
                                                            for s in samples),
                             **staleness(samples, step)}
        if not samples:
            raise RuntimeError(f"step {step}: no trial finished ({failures} failed); "
                               "see the warnings above")
        if self.record_dir is not None and distributed.is_main():
            folder = self.record_dir / f"step_{step:05d}"
            if self.processes == 1:  # the whole step's folder: a rerun of a killed step
                save_dataset(samples, folder)  # leaves none of its trials
            else:  # every process wrote its own trials before the exchange (_share)
                mark_dataset_complete(folder, len(samples))
        return samples

    def _share(self, step: int, own: list) -> list:
        """This process's trials of a multi-process step, ready to exchange: written to the
        step's record folder (each process its own, after process 0 cleared it), and their
        routes left in the coordinator as SharedArrays, which only the processes that pack
        them into their rows read (rl/trainer.py make_batch): the other fields travel to
        every process."""
        if self.record_dir is not None:
            folder = self.record_dir / f"step_{step:05d}"
            if distributed.is_main():  # a rerun of a killed step leaves none of its trials
                shutil.rmtree(folder, ignore_errors=True)
            distributed.exchange_objects(f"records/{self._instance}/{step}", None)  # cleared
            save_samples(own, folder)
        return [dataclasses.replace(s, routes=distributed.SharedArray.put(
            f"routes/{self._instance}/{step}/{self.process}/{j}", s.routes))
            for j, s in enumerate(own)]

    def _collect_split(self, step: int, requests: list) -> tuple[list, int]:
        """This process plays its share (every processes-th request); the samples of all come
        back in request order, the same list on every process. With oversample 1 every trial
        that finishes is admitted, so no admission depends on another process's timing."""
        index = {r.key: i for i, r in enumerate(requests)}
        mine = requests[self.process::self.processes]
        result = (self.scheduler.collect(mine, len(mine), oversample=1.0,
                                         carry_over=self.carry_over)
                  if mine else StepResult([], [], [], []))
        if result.carried:  # cannot happen with every launched trial admitted
            raise RuntimeError(f"{len(result.carried)} trials carried over in a split step")
        self.last_result = result
        for failed in result.failed:
            logging.warning("trial failed (dropped, not trained): %s", failed.error)
        for r in result.admitted:  # who played it: where its sandbox and log lines were
            r.sample.metadata["process"] = self.process
        own = self._share(step, [r.sample for r in result.admitted])
        shares = distributed.exchange_objects(  # no XLA collective: one step off runs this
            f"samples/{self._instance}/{step}",   # beside the trainer's step
            ([(index[r.request.key], sample) for r, sample in zip(result.admitted, own)],
             len(result.failed)))
        ordered = sorted(((i, sample) for share, _ in shares for i, sample in share),
                         key=lambda pair: pair[0])
        return [sample for _, sample in ordered], sum(failed for _, failed in shares)

    def _collect_admitted(self, step: int, fresh: list, carried: list[int]) -> tuple[list, int]:
        """Oversampling across processes: every process draws the same fresh requests and
        takes those a fixed rule gives it (each to the process with the fewest trials so far,
        its own carried ones counted), plays them with its carried ones, and admits the first
        batch_size to finish over all processes (GlobalAdmission). Every process then holds
        the admitted samples of all, in admission order; late and stopped trials stay carried
        on the process that played them."""
        loads, mine = list(carried), []
        for request in fresh:
            target = min(range(self.processes), key=lambda q: (loads[q], q))
            loads[target] += 1
            if target == self.process:
                mine.append(request)
        requests = self._carried + mine
        admission = GlobalAdmission(self.batch_size, f"admission/{self._instance}/{step}")
        result = self.scheduler.collect(
            requests, self.batch_size, carry_over=self.carry_over, admission=admission,
            oversample=max(self.oversample, len(requests) / self.batch_size))
        self._carried = result.carried
        self.last_result = result
        for failed in result.failed:
            logging.warning("trial failed (dropped, not trained): %s", failed.error)
        for r in result.admitted:
            r.sample.metadata["process"] = self.process
        shares = distributed.exchange_objects(
            f"samples/{self._instance}/{step}",
            (self._share(step, [r.sample for r in result.admitted]), len(result.failed)))
        samples = sorted((sample for share, _ in shares for sample in share),
                         key=lambda sample: sample.metadata["admission"])
        return samples, sum(failed for _, failed in shares)

    def publish(self, trainer, version: str) -> None:
        if self._publish is not None:
            self._publish(trainer, version)
        else:  # an in-process engine: hand it the parameters directly
            self.engine.load_weights(trainer.actor_params(), version)

    def state_dict(self) -> dict:
        """The sampler's position and the carried trials by name: their sandboxes and partial
        episodes die with the process, so a resumed run starts them afresh (same task and
        attempt, so the same sampling seed), first in its next step, as they would have gone.
        Across processes each carries its own: every process calls it, and it holds all."""
        carried = [{"task_id": r.task_id, "attempt": r.attempt,
                    "carried_steps": r.carried_steps} for r in self._carried]
        if self.admitted_globally:
            self._states += 1
            carried = [c for share in distributed.exchange_objects(
                f"state/{self._instance}/{self._states}", carried) for c in share]
        return {"sampler": self.sampler.state_dict(), "next_attempt": self._next_attempt,
                "carried": carried, "reward_scale": self.reward_scale}

    def load_state_dict(self, state: dict) -> None:
        check_reward_scale(state.get("reward_scale"), self.reward_scale, "this run's checkpoint")
        if "sampler" in state:
            self.sampler.load_state_dict(state["sampler"])
        self._next_attempt = int(state.get("next_attempt", 0))
        known = {t.task_id for t in self.tasks}
        carried = state.get("carried", [])
        unknown = sorted({c["task_id"] for c in carried} - known)
        if unknown:
            raise ValueError(f"the checkpoint carries trials of task(s) {unknown} that this "
                             f"run's task list does not hold: resume with the same tasks")
        if self.admitted_globally:  # started afresh anyway: dealt out over the processes
            carried = carried[self.process::self.processes]
        self._carried = [TrialRequest(c["task_id"], attempt=int(c["attempt"]),
                                      carried_steps=int(c["carried_steps"])) for c in carried]
