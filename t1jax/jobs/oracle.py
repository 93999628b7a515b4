"""Validate a task pool: oracle and do-nothing agents on every task (configs/oracle.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from absl import logging

from t1jax.jobs import UsageError


def run(config, workdir: Path) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
        TimeElapsedColumn, TimeRemainingColumn

    from t1jax.sandbox.backend import make_backend
    from t1jax.sandbox.base import Limits
    from t1jax.tasks.pool import default_pool_dir, load_pool, select_tasks
    from t1jax.tasks.validate import AGENTS, pool_scale, validate_pool

    pool_dir = Path(config.pool_dir) if config.pool_dir else default_pool_dir()
    loaded = load_pool(pool_dir, skip_invalid=config.skip_invalid_tasks)
    for err in loaded.errors:
        logging.warning("skipping %s", err)
    tasks = loaded.tasks
    try:
        tasks = select_tasks(tasks, config.task_filter)
    except ValueError as err:
        raise UsageError(f"--config.{err}") from err
    if not tasks:
        raise UsageError(f"no tasks found in {pool_dir}")
    options = {}
    if config.sandbox.backend == "docker":
        options = dict(runtime=config.sandbox.runtime or None,
                       build_network=config.sandbox.build_network)
    backend = make_backend(config.sandbox.backend, **options)
    run_id = config.run_id or f"{workdir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    reaped = backend.reap()
    if reaped:
        logging.info("removed %d sandboxes left behind by dead runs", reaped)
    limits = Limits(pids=config.sandbox.pids, max_output_bytes=config.sandbox.max_output_bytes,
                    default_timeout_s=config.sandbox.command_timeout_s)
    scale = pool_scale(tasks, config.verifier.scale_quantile, config.verifier.global_scale)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns) as progress:
        builds = progress.add_task("build task images", total=len(tasks))
        episodes = progress.add_task("oracle + do-nothing episodes", total=len(tasks) * len(AGENTS))

        def tick(kind: str, what: str) -> None:
            progress.advance(builds if kind == "build" else episodes)

        try:
            summary = validate_pool(tasks, backend, out_dir=workdir,
                                    concurrency=config.sandbox.concurrency, limits=limits,
                                    verifier_mode=config.verifier.mode, run_id=run_id,
                                    scale=scale, progress=tick,
                                    allow_network=config.sandbox.allow_network)
        finally:
            backend.reap(run_id)  # whatever an interrupt left running
    print((workdir / "results.md").read_text())
    print(json.dumps(summary, indent=2))
    print(f"wrote {workdir / 'results.jsonl'} and {workdir / 'results.md'}")
    return 0 if summary["pool_healthy"] else 1


