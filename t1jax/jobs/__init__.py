"""One module per `mode` of experiments/run.py; each has `run(config, workdir) -> exit code`."""

MODES = {
    "oracle": "t1jax.jobs.oracle",
    "synth": "t1jax.jobs.synth",
    "audit": "t1jax.jobs.audit",
    "pool": "t1jax.jobs.pool",
    "train": "t1jax.jobs.train",
    "recipe": "t1jax.jobs.recipe",
    "eval": "t1jax.jobs.eval",
}


class UsageError(ValueError):
    """A config value that cannot work; experiments/run.py prints it as a usage error."""


def sandbox_backend(sandbox):
    """The backend a config's `sandbox` block names (configs/common.py sandbox_config)."""
    from t1jax.sandbox import make_backend
    options = {}
    if sandbox.backend == "docker":
        options = dict(runtime=sandbox.runtime or None, build_network=sandbox.build_network,
                       base_map=base_map(sandbox.get("base_map", "")),
                       registry=sandbox.get("registry", False))
    return make_backend(sandbox.backend, **options)


def base_map(text: str) -> dict:
    """config.sandbox.base_map ("public=local,...") over the default map of public bases."""
    from t1jax.sandbox.images import DEFAULT_BASE_MAP
    out = dict(DEFAULT_BASE_MAP)
    for item in filter(None, (p.strip() for p in text.split(","))):
        public, sep, local = item.partition("=")
        if not sep or not public.strip() or not local.strip():
            raise UsageError(f"config.sandbox.base_map: {item!r} is not PUBLIC=LOCAL (e.g. "
                             "python:3.12-slim=t1jax/base:bookworm; *=IMAGE maps every other)")
        out[public.strip()] = local.strip()
    return out


def sandbox_limits(sandbox):
    """Per-sandbox limits from the same block (a task's own limits are applied on top)."""
    from t1jax.sandbox.base import Limits
    return Limits(pids=sandbox.pids, max_output_bytes=sandbox.max_output_bytes,
                  default_timeout_s=sandbox.command_timeout_s,
                  episode_output_bytes=sandbox.episode_output_bytes)


def load_job_tasks(pool_dir, *, skip_invalid: bool, task_filter: str) -> list:
    """The tasks a job runs: the pool (malformed tasks reported, or skipped when asked),
    narrowed by `task_filter`; an unknown task id or an empty selection is a UsageError."""
    from absl import logging

    from t1jax.tasks.pool import load_pool, select_tasks
    loaded = load_pool(pool_dir, skip_invalid=skip_invalid)
    for err in loaded.errors:
        logging.warning("skipping %s", err)
    try:
        tasks = select_tasks(loaded.tasks, task_filter)
    except ValueError as err:
        raise UsageError(f"--config.{err}") from err
    if not tasks:
        raise UsageError(f"no tasks found in {pool_dir}")
    for line in grouped_warnings(tasks):
        logging.warning("%s", line)
    return tasks


def grouped_warnings(tasks) -> list[str]:
    """The loader's warnings once per run: each distinct warning with how many tasks gave it
    and the first few of them (89 official tasks give the same three, which one line each
    says, instead of 267 lines or none)."""
    by_text: dict[str, list[str]] = {}
    for task in tasks:
        for warning in task.warnings:
            by_text.setdefault(warning, []).append(task.task_id)
    lines = []
    for warning, ids in sorted(by_text.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        named = ", ".join(ids[:3]) + (f", ... ({len(ids)} tasks)" if len(ids) > 3 else "")
        lines.append(f"task loader: {warning} [{named}]")
    return lines
