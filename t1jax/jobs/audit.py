"""Audit a task pool: quality scores and hard rejects for every task (configs/audit.py)."""

from __future__ import annotations

import functools
import time
from pathlib import Path

from absl import logging

from t1jax.jobs import UsageError, build


def run(config, workdir: Path) -> int:
    from t1jax.jobs.progress import job_progress

    from t1jax.curation.audit import DIMENSIONS, PROBES, AuditReport, audit_pool, llm_judge, \
        write_reports
    from t1jax.curation.llm import LLMConfig
    from t1jax.tasks.pool import load_pool
    from t1jax.verify.reward import pool_scale

    pool_dir = build.task_folder(config)
    loaded = load_pool(pool_dir, skip_invalid=True)  # a malformed task is a rejected task
    wanted = set(config.task_filter.split(",")) if config.task_filter else None
    invalid = {Path(err.task_dir).name: err for err in loaded.errors}
    tasks = [t for t in loaded.tasks if wanted is None or t.task_id in wanted]
    invalid = {tid: err for tid, err in invalid.items() if wanted is None or tid in wanted}
    if wanted and wanted - {t.task_id for t in tasks} - set(invalid):
        raise UsageError("--config.task_filter names unknown tasks: "
                         f"{sorted(wanted - {t.task_id for t in tasks} - set(invalid))}")
    if not tasks and not invalid:
        raise UsageError(f"no tasks found in {pool_dir}")
    judge = None
    if config.judge.base_url:
        judge = functools.partial(llm_judge, llm=LLMConfig.from_config(config.judge))
    backend = build.sandbox_backend(config.sandbox)
    run_id = config.run_id or f"{workdir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if reaped := build.reap_best_effort(backend):
        logging.info("removed %d sandboxes left behind by dead runs", reaped)
    reports = []
    if tasks:
        scale = pool_scale(tasks, config.verifier.scale_quantile, config.verifier.global_scale)
        with job_progress(info=False) as progress:
            bars = {"build": progress.add_task("build task images", total=len(tasks)),
                    "probe": progress.add_task("probe episodes", total=len(tasks) * len(PROBES))}
            if judge:
                bars["judge"] = progress.add_task("LLM judge", total=len(tasks))
            try:
                reports = audit_pool(
                    tasks, build.trial_site(config, backend, run_id=run_id, scale=scale),
                    progress=lambda kind, what: progress.advance(bars[kind]), judge=judge,
                    verifier=build.verifier_settings(config))
            finally:
                build.reap_best_effort(backend, run_id)  # what an interrupt left running
    zero = {f"{g}.{d}": 0.0 for g, ds in DIMENSIONS.items() for d in ds}
    reports += [AuditReport(tid, dict(zero), {g: 0.0 for g in DIMENSIONS}, 0.0, True,
                            [f"invalid task: {' '.join(str(err).split())}"], {})
                for tid, err in sorted(invalid.items())]
    write_reports(reports, workdir)
    print((workdir / "audit.md").read_text())
    print(f"wrote {workdir / 'audit.jsonl'}, {workdir / 'audit.md'} and {workdir / 'scores.json'}")
    return 1 if config.fail_on_reject and any(r.rejected for r in reports) else 0
