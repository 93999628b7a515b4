"""Progress of a job: rich bars on a terminal, plain lines anywhere else.

Why: off a terminal (`| tee log`, nohup, CI) rich draws nothing until the job ends, so the
37-minute main job printed nothing between its set-up and its report. There each bar prints a
line when it starts, at most every `interval_s` while it moves, and when it completes: what,
how far, the rate, elapsed and remaining time, and its `info` field.
"""

from __future__ import annotations

import os
import sys
import time

INTERVAL_S = 30.0


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s" if hours else \
        f"{rest // 60}m{rest % 60:02d}s"


class PlainProgress:
    """The part of rich.progress.Progress the jobs use (add_task, update, advance, as a
    context manager), printed as lines."""

    def __init__(self, interval_s: float = INTERVAL_S, out=None, clock=time.monotonic):
        self.interval_s, self.out, self.clock = interval_s, out or sys.stdout, clock
        self.tasks: list[dict] = []

    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, *exc) -> None:
        for task_id, task in enumerate(self.tasks):  # what an interruption left half done
            if not task["closed"] and task["completed"] != task["printed_at"]:
                self._print(task_id)

    def add_task(self, description: str, total: float | None = None, **fields) -> int:
        now = self.clock()
        self.tasks.append(dict(description=description, total=total, completed=0.0,
                               info=str(fields.get("info", "")), start=now, last=now,
                               printed_at=None, closed=False, base=None))
        self._print(len(self.tasks) - 1)
        return len(self.tasks) - 1

    def update(self, task_id: int, *, total=None, completed=None, advance=None, info=None,
               **_) -> None:
        task = self.tasks[task_id]
        if total is not None:
            task["total"] = total
        if completed is not None:
            task["completed"] = float(completed)
        if advance is not None:
            task["completed"] += float(advance)
        if info is not None:
            task["info"] = str(info)
        if task["base"] is None:  # rates count from here: a resumed stage starts mid-way
            task["base"] = (self.clock(), task["completed"])
        done = task["total"] is not None and task["completed"] >= task["total"]
        if done and not task["closed"]:
            task["closed"] = True
            self._print(task_id)
        elif not done and self.clock() - task["last"] >= self.interval_s:
            self._print(task_id)

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def line(self, task_id: int) -> str:
        task = self.tasks[task_id]
        now, done, total = self.clock(), task["completed"], task["total"]
        elapsed = now - task["start"]
        parts = [f"{done:g}/{total:g}" if total else f"{done:g}"]
        if total:
            parts[0] += f" ({100 * done / total:.0f}%)"
        rate = None
        if task["base"] is not None and done > task["base"][1] and now > task["base"][0]:
            rate = (done - task["base"][1]) / (now - task["base"][0])
            parts.append(f"{rate:.2f}/s" if rate >= 0.1 else f"{60 * rate:.2f}/min")
        parts.append(f"elapsed {_clock(elapsed)}")
        if total and rate and done < total:
            parts.append(f"ETA {_clock((total - done) / rate)}")
        if task["info"]:
            parts.append(task["info"])
        return f"[progress] {task['description']}: " + " | ".join(parts)

    def _print(self, task_id: int) -> None:
        task = self.tasks[task_id]
        print(self.line(task_id), file=self.out, flush=True)
        task["last"], task["printed_at"] = self.clock(), task["completed"]


def job_progress(info: bool = True):
    """Bars for a job: rich's on a terminal, PlainProgress elsewhere. info: a column for each
    bar's `info` field (its latest metric, what it is doing). In a multi-process job only
    process 0 prints: the others' bars go nowhere."""
    from rich.console import Console

    from t1jax import distributed
    if not distributed.is_main():
        return PlainProgress(out=open(os.devnull, "w"))
    if not Console().is_terminal:
        return PlainProgress()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
        TimeElapsedColumn, TimeRemainingColumn
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn()]
    if info:
        columns.append(TextColumn("{task.fields[info]}"))
    return Progress(*columns)


def metric_bar(bars, name: str, total: int, key: str, digits: int = 3):
    """A bar for a training stage: tick(step, metrics) moves it to `step` and shows `key`'s
    latest value. bars None (no job_progress() active): a tick that does nothing."""
    if bars is None:
        return lambda step, metrics: None
    task = bars.add_task(name, total=total, info="")

    def tick(step, metrics):
        bars.update(task, completed=step,
                    info=f"{key} {metrics.get(key, float('nan')):.{digits}f}")
    return tick


def count_bar(bars, name: str, total: int, counted: tuple[str, ...] = ()):
    """A bar for episodes: tick(kind, what) advances unless `counted` leaves `kind` out (the
    pool and eval helpers also report image builds). bars None: no tick (None)."""
    if bars is None:
        return None
    task = bars.add_task(name, total=total, info="")

    def tick(kind, what=""):
        if counted and kind not in counted:
            return
        bars.update(task, advance=1, info="" if what is None else str(what)[:40])
    return tick
