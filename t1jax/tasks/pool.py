"""A pool: every task directory under a root, loaded and validated together.

Why: training samples from a pool, so every bad task should be reported in one pass
(not one per restart), and two tasks sharing a task_id must never silently shadow
each other in logs, checkpoints or curricula.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from t1jax.tasks.task import Task, TaskFormatError, load_task

_MARKERS = ("task.toml", "task.yaml")


class PoolLoadError(ValueError):
    """One or more tasks in a pool are invalid; the message lists all of them."""

    def __init__(self, errors):
        super().__init__(list(errors))
        self.errors = list(errors)

    def __str__(self) -> str:
        lines = [" ".join(str(e).splitlines()) for e in self.errors]
        return f"{len(lines)} invalid task(s):\n" + "\n".join(f"  - {line}" for line in lines)


@dataclass
class PoolLoadResult:
    tasks: list[Task] = field(default_factory=list)
    errors: list[TaskFormatError] = field(default_factory=list)


def default_pool_dir() -> Path:
    """The seed tasks bundled with t1jax."""
    return Path(__file__).resolve().parent / "seed_tasks"


def _is_task_dir(path: Path) -> bool:
    return any((path / m).is_file() for m in _MARKERS)


def find_task_dirs(root: str | os.PathLike) -> list[Path]:
    """Task dirs under root (root itself counts), sorted; hidden dirs and task subdirs skipped."""
    root = Path(os.path.abspath(os.fspath(root)))
    if not root.is_dir():
        raise FileNotFoundError(f"task pool root is not a directory: {root}")
    found: list[Path] = []
    seen: set[Path] = set()  # resolved dirs, so symlink loops cannot recurse forever

    def walk(d: Path) -> None:
        real = d.resolve()
        if real in seen:
            return
        seen.add(real)
        if _is_task_dir(d):
            found.append(d)
            return
        for child in sorted(d.iterdir()):
            if child.is_dir() and not child.name.startswith("."):
                walk(child)

    walk(root)
    return sorted(found)


def load_pool(root: str | os.PathLike, *, skip_invalid: bool = False) -> PoolLoadResult:
    """Load every task under root; raise PoolLoadError listing all bad ones unless skip_invalid."""
    result = PoolLoadResult()
    dirs = find_task_dirs(root)
    by_id: dict[str, list[Path]] = {}
    for d in dirs:
        by_id.setdefault(d.name, []).append(d)
        try:
            result.tasks.append(load_task(d))
        except TaskFormatError as e:
            result.errors.append(e)
    dupes = {tid: paths for tid, paths in by_id.items() if len(paths) > 1}
    for tid, paths in dupes.items():
        result.errors.append(TaskFormatError(
            paths[0], None, f"duplicate task_id {tid!r} in "
            + " and ".join(str(p) for p in paths) + "; task dir names must be unique"))
    result.tasks = [t for t in result.tasks if t.task_id not in dupes]  # ambiguous: keep none
    if result.errors and not skip_invalid:
        raise PoolLoadError(result.errors)
    return result


def select_tasks(tasks: list[Task], task_filter: str) -> list[Task]:
    """The tasks named in a comma-separated `task_filter` ("" = all); an unknown name is an
    error listing it (a typo must not silently shrink a run)."""
    if not task_filter:
        return list(tasks)
    wanted = {t for t in task_filter.split(",") if t}
    missing = wanted - {t.task_id for t in tasks}
    if missing:
        raise ValueError(f"task_filter names unknown tasks: {sorted(missing)}")
    return [t for t in tasks if t.task_id in wanted]
