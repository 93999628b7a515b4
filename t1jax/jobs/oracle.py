"""Validate a task pool: oracle and do-nothing agents on every task (configs/oracle.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from t1jax.jobs import build


def run(config, workdir: Path) -> int:
    from t1jax.jobs.progress import job_progress

    from t1jax.curation.validate import AGENTS, validate_pool

    pool_dir = build.task_folder(config)
    tasks = build.load_job_tasks(pool_dir, skip_invalid=config.skip_invalid_tasks,
                                 task_filter=config.task_filter)
    stack = build.task_stack(config, tasks)
    run_id = config.run_id or f"{workdir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    with job_progress(info=False) as progress:
        builds = progress.add_task("build task images", total=len(tasks))
        episodes = progress.add_task("oracle + do-nothing episodes", total=len(tasks) * len(AGENTS))

        def tick(kind: str, what: str) -> None:
            progress.advance(builds if kind == "build" else episodes)

        try:
            summary = validate_pool(tasks, stack.site(config, run_id), out_dir=workdir,
                                    verifier=build.verifier_settings(config), progress=tick)
        finally:
            stack.backend.reap(run_id)  # whatever an interrupt left running
    print((workdir / "results.md").read_text())
    print(json.dumps(summary, indent=2))
    print(f"wrote {workdir / 'results.jsonl'} and {workdir / 'results.md'}")
    return 0 if summary["pool_healthy"] else 1


