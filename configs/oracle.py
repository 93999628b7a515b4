"""Validate a task pool: every task with its reference solution (oracle) and with a do-nothing
agent, in parallel sandboxes; writes results.jsonl and results.md to the workdir.

  python experiments/run.py --config configs/oracle.py --workdir runs/oracle
  python experiments/run.py --config configs/oracle.py --config.pool_dir=/path/to/terminal-bench \
      --config.verifier.mode=offline --config.sandbox.concurrency=8
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.mode = "oracle"
    config.run_id = ""  # default: derived from the workdir name and the time
    config.pool_dir = ""  # default: the bundled offline tasks (t1jax/tasks/seed_tasks)
    config.skip_invalid_tasks = False  # True: report malformed tasks and run the rest

    config.sandbox = ml_collections.ConfigDict()
    config.sandbox.backend = "docker"  # docker | bwrap (no daemon needed)
    config.sandbox.concurrency = 4  # sandboxes running at once
    config.sandbox.allow_network = False  # a task's allow_internet only counts when this is True
    config.sandbox.runtime = ""  # Docker runtime, e.g. runsc (gVisor); "" = the daemon's default
    config.sandbox.build_network = "none"  # network for `docker build` (host to apt-get in builds)
    config.sandbox.pids = 512
    config.sandbox.max_output_bytes = 10_000  # per command, head + tail kept (Terminus-2: 10 KB)
    config.sandbox.command_timeout_s = 180.0

    config.verifier = ml_collections.ConfigDict()
    config.verifier.mode = "script"  # script: tests/test.sh | offline: image pytest on test_*.py
    config.verifier.global_scale = 0.0  # > 0 fixes the dense reward's denominator
    config.verifier.scale_quantile = 0.9  # else: this quantile of the pool's assertion counts

    if arg == "smoke":  # two tasks, fast
        config.task_filter = "count-log-errors,organize-files"
    else:
        config.task_filter = ""  # comma-separated task ids; "" = all
    return config
