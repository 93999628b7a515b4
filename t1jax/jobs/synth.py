"""Grow a task pool by recursive task synthesis (configs/synth.py): rounds of rewrites, each new
task validated in sandboxes; writes the tasks, summary.md and lineage.jsonl to the workdir."""

from __future__ import annotations

import time
from pathlib import Path

from absl import logging

from t1jax.jobs import UsageError, build


def _select(config):
    """The seed tasks: the pool, filtered. A malformed task only stops the run when selected."""
    from t1jax.tasks.pool import PoolLoadError, load_pool

    pool_dir = build.task_folder(config)
    loaded = load_pool(pool_dir, skip_invalid=True)
    wanted = {t.strip() for t in config.task_filter.split(",") if t.strip()}
    errors = [e for e in loaded.errors if not wanted or Path(e.task_dir).name in wanted]
    if errors and not config.skip_invalid_tasks:
        raise PoolLoadError(errors)
    for err in loaded.errors:
        logging.warning("skipping %s", err)
    tasks = loaded.tasks
    if wanted:
        missing = wanted - {t.task_id for t in tasks} - {Path(e.task_dir).name for e in errors}
        if missing:
            raise UsageError(f"--config.task_filter names unknown tasks: {sorted(missing)}")
        tasks = [t for t in tasks if t.task_id in wanted]
    if not tasks:
        raise UsageError(f"no tasks found in {pool_dir}")
    return tasks


def _operators(config):
    from t1jax.curation.llm import LLMConfig
    from t1jax.curation.synth_operators import make_operators

    names = [n.strip() for n in config.operators.split(",") if n.strip()]
    llm = None
    if config.llm.base_url:
        llm = LLMConfig.from_config(config.llm)
        if names and "llm_rewrite" not in names:
            names.append("llm_rewrite")  # a model endpoint enables the LLM rewriter
    try:
        make_operators(names, llm)
    except ValueError as err:
        raise UsageError(f"--config.operators: {err}") from err
    return names, llm


def run(config, workdir: Path) -> int:
    from t1jax.jobs.progress import job_progress

    from t1jax.curation.synth import synthesize

    if config.rounds < 1 or config.per_round_limit < 1:
        raise UsageError("--config.rounds and --config.per_round_limit must be >= 1")
    tasks = _select(config)
    names, llm = _operators(config)
    backend = build.sandbox_backend(config.sandbox)
    run_id = config.run_id or f"{workdir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    reaped = build.reap_best_effort(backend)
    if reaped:
        logging.info("removed %d sandboxes left behind by dead runs", reaped)
    with job_progress(info=False) as progress:
        bar = {}

        def tick(kind: str, what: str, n: int = 0) -> None:
            if kind == "round":  # parents' outputs, then each new task's validation
                bar.update(id=progress.add_task(f"{what}: outputs + validation", total=n),
                           total=n)
            elif kind == "grow":
                bar["total"] += n
                progress.update(bar["id"], total=bar["total"])
            elif kind == "step":
                progress.advance(bar["id"])
            else:  # round_done: parents with no feasible operator never became steps
                progress.update(bar["id"], total=bar["total"], completed=bar["total"])

        try:
            report = synthesize(tasks, build.trial_site(config, backend, run_id=run_id),
                                workdir, rounds=config.rounds, seed=config.seed,
                                operators=names, per_round_limit=config.per_round_limit, llm=llm,
                                verifier=build.verifier_settings(config), progress=tick)
        finally:
            build.reap_best_effort(backend, run_id)  # whatever an interrupt left running
    print((workdir / "summary.md").read_text())
    print(f"wrote {len(report.accepted)} new task(s) under {workdir}/round-*/, "
          f"{workdir / 'summary.md'} and {workdir / 'lineage.jsonl'}")
    return 0 if report.accepted else 1
