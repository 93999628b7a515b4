"""Audit a task pool: score every task on eight quality dimensions (verifier 45%, solution 25%,
instruction 20%, value 10%) and hard-reject broken, leaky or gameable tasks; writes audit.jsonl,
audit.md and scores.json (read by the TFDS pool builder) to the workdir.

  python experiments/run.py --config configs/audit.py --workdir runs/audit
  python experiments/run.py --config configs/audit.py --config.task_filter=count-log-errors \
      --config.judge.base_url=http://localhost:8000 --config.judge.model=Qwen/Qwen3-8B
"""

import ml_collections

from configs.common import check_variant, sandbox_config, verifier_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    check_variant("audit", arg, ("smoke",))
    config = ml_collections.ConfigDict()
    config.mode = "audit"
    config.run_id = ""  # default: derived from the workdir name and the time
    config.tasks = ""  # a Harbor / Terminal-Bench task folder; "": the bundled seed tasks
    config.fail_on_reject = False  # True: exit 1 when any task is rejected (a CI gate)

    config.sandbox = sandbox_config()
    config.sandbox.concurrency = 4  # probe episodes running at once (4 per task)

    config.verifier = verifier_config()

    config.judge = ml_collections.ConfigDict()
    config.judge.base_url = ""  # an OpenAI-compatible server, e.g. http://localhost:8000; "" = off
    config.judge.model = "default"
    config.judge.api_key_env = ""  # name of an environment variable holding the API key, if any
    config.judge.timeout_s = 120.0

    if arg == "smoke":
        config.task_filter = "count-log-errors,organize-files"
    else:
        config.task_filter = ""  # comma-separated task ids; "" = all
    return config
