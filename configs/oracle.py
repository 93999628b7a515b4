"""Validate a task pool: every task with its reference solution (oracle) and with a do-nothing
agent, in parallel sandboxes; writes results.jsonl and results.md to the workdir.

  python experiments/run.py --config configs/oracle.py --workdir runs/oracle
  python experiments/run.py --config configs/oracle.py --config.tasks=/path/to/terminal-bench \
      --config.verifier.mode=offline --config.sandbox.concurrency=8
"""

import ml_collections

from configs.common import check_variant, sandbox_config, verifier_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    check_variant("oracle", arg, ("smoke",))
    config = ml_collections.ConfigDict()
    config.mode = "oracle"
    config.run_id = ""  # default: derived from the workdir name and the time
    config.tasks = ""  # a Harbor / Terminal-Bench task folder; "": the bundled seed tasks
    config.skip_invalid_tasks = False  # True: report malformed tasks and run the rest

    config.sandbox = sandbox_config()

    config.verifier = verifier_config()

    if arg == "smoke":  # two tasks, fast
        config.task_filter = "count-log-errors,organize-files"
    else:
        config.task_filter = ""  # comma-separated task ids; "" = all
    return config
