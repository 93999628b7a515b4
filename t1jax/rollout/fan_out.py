"""Sandbox work over many tasks, written once: images built once, a bounded pool, the reap.

Why here: evaluation, the SFT oracle's episodes, pool validation, audit probes, synthesis, the
training rollouts and the probes and benchmarks all run trials over a list of tasks. Each had its
own copy of the build loop, thread pool, progress, interrupt handling and reap, and the copies
caught different exceptions during the build: one bad Dockerfile crashed one job and was a named
skip in another. Here, for every caller:
- a task's image is built once per run and one build at a time (builds are CPU-bound), shared
  by every trial of the task (`Images`);
- a task that cannot build is a named reason for that task (`build_failure`), tried once, and
  never sinks the other tasks;
- the work runs on at most `workers` threads, the caller hears of each job as it finishes, an
  interrupt or an error cancels the jobs not yet started without waiting for running ones, and
  the run's sandboxes are reaped on every exit (`fan_out`).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Callable, Iterable

log = logging.getLogger(__name__)

BUILD_FAILED = "image build failed"  # the reason's prefix; eval summaries count skips by it
MAX_REASON_CHARS = 600


class ImageBuildError(RuntimeError):
    """A task's environment could not be built; the message is the task's named reason."""


def build_failure(err: BaseException) -> str:
    """Why a task's image could not build, the same words for every caller (one line)."""
    text = " ".join(str(err).split())
    if len(text) > MAX_REASON_CHARS:
        text = text[:MAX_REASON_CHARS] + " ..."
    return f"{BUILD_FAILED}: {type(err).__name__}: {text}"


class Images:
    """Task id -> built image for one run (or many: pass the dict of an earlier run to reuse it).
    Every build happens under one lock and each task is tried once: a failure is remembered in
    `failed` (task id -> reason) and raised again as ImageBuildError for its next trial."""

    def __init__(self, backend, built: dict | None = None):
        self.backend = backend
        self.built = built if built is not None else {}
        self.failed: dict[str, str] = {}
        self._lock = threading.Lock()

    def get(self, task) -> str:
        """`task`'s image, built on first use; ImageBuildError (with the reason) if it cannot."""
        tid = task.task_id
        with self._lock:
            if tid in self.built:
                return self.built[tid]
            if tid in self.failed:
                raise ImageBuildError(self.failed[tid])
            try:
                self.built[tid] = self.backend.build(task)
            except Exception as err:  # noqa: BLE001 - one bad task must not sink the others
                self.failed[tid] = build_failure(err)
                raise ImageBuildError(self.failed[tid]) from err
            return self.built[tid]

    def build_all(self, tasks: Iterable, progress: Callable[[str], Any] | None = None
                  ) -> dict[str, str]:
        """Build each task's image now (one at a time, before any trial starts, so trials time
        their episodes, not builds); returns task id -> reason for the tasks that failed.
        progress(task_id) after each task."""
        failed = {}
        for task in tasks:
            try:
                self.get(task)
            except ImageBuildError as err:
                failed[task.task_id] = str(err)
            if progress:
                progress(task.task_id)
        return failed


def fan_out(jobs: Iterable, work: Callable[[Any], Any], *, workers: int,
            on_done: Callable[[Any, Any], Any] | None = None, backend=None,
            run_id: str | None = None, name: str = "fan-out") -> list:
    """`work(job)` for every job on at most `workers` threads; returns the results in job
    order. on_done(job, result) runs in the calling thread as each job finishes (progress,
    files written as the run goes). An exception from work or on_done, or an interrupt, cancels
    the jobs not yet started and is raised without waiting for the running ones. With a backend
    and run_id, the run's sandboxes are reaped on every exit, so nothing is left running."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    jobs = list(jobs)
    results: list = [None] * len(jobs)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
    try:
        futures = {pool.submit(work, job): i for i, job in enumerate(jobs)}
        for future in as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            if on_done is not None:
                on_done(jobs[i], results[i])
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    else:
        pool.shutdown()
    finally:
        if backend is not None and run_id is not None:
            try:
                backend.reap(run_id)
            except Exception as err:  # noqa: BLE001 - the next run's reap of dead runs retries
                log.warning("could not reap the sandboxes of run %s: %s", run_id, err)
    return results


__all__ = ["BUILD_FAILED", "ImageBuildError", "Images", "build_failure", "fan_out"]
