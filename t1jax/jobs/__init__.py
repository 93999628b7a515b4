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
    from t1jax.sandbox.backend import make_backend
    options = {}
    if sandbox.backend == "docker":
        options = dict(runtime=sandbox.runtime or None, build_network=sandbox.build_network)
    return make_backend(sandbox.backend, **options)


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
    return tasks
