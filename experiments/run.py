"""The one entry point: `python experiments/run.py --config configs/<name>.py [--config.x=y]`.

Each config names a `mode` (one job per mode). Modes so far: oracle (validate a task pool).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from absl import app, flags, logging
from ml_collections import config_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (default runs/<mode>).")


def run_oracle(config, workdir: Path) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
        TimeElapsedColumn, TimeRemainingColumn

    from t1jax.sandbox.backend import make_backend
    from t1jax.sandbox.base import Limits
    from t1jax.tasks.pool import default_pool_dir, load_pool
    from t1jax.tasks.validate import AGENTS, pool_scale, validate_pool

    pool_dir = Path(config.pool_dir) if config.pool_dir else default_pool_dir()
    loaded = load_pool(pool_dir, skip_invalid=config.skip_invalid_tasks)
    for err in loaded.errors:
        logging.warning("skipping %s", err)
    tasks = loaded.tasks
    if config.task_filter:
        wanted = set(config.task_filter.split(","))
        missing = wanted - {t.task_id for t in tasks}
        if missing:
            raise app.UsageError(f"--config.task_filter names unknown tasks: {sorted(missing)}")
        tasks = [t for t in tasks if t.task_id in wanted]
    if not tasks:
        raise app.UsageError(f"no tasks found in {pool_dir}")
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


MODES = {"oracle": run_oracle}


def _interrupt_on_sigterm() -> None:
    """SIGTERM (a scheduler's kill) unwinds like Ctrl-C, so every sandbox is removed."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, handler)


def main(argv) -> None:
    _interrupt_on_sigterm()
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    if config is None:
        raise app.UsageError("--config is required, e.g. --config configs/oracle.py")
    if config.mode not in MODES:
        raise app.UsageError(f"unknown mode {config.mode!r} in the config; known: {sorted(MODES)}")
    workdir = Path(_WORKDIR.value or os.path.join("runs", config.mode)).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    sys.exit(MODES[config.mode](config, workdir))


if __name__ == "__main__":
    app.run(main)
