"""Audit a task pool: score every task on eight quality dimensions (verifier 45%, solution 25%,
instruction 20%, value 10%) and hard-reject broken, leaky or gameable tasks; writes audit.jsonl,
audit.md and scores.json (read by the TFDS pool builder) to the workdir.

  python experiments/run.py --config configs/audit.py --workdir runs/audit
  python experiments/run.py --config configs/audit.py --config.task_filter=count-log-errors \
      --config.judge.base_url=http://localhost:8000 --config.judge.model=Qwen/Qwen3-8B
"""

import ml_collections

from configs.common import check_variant, llm_config, sandbox_config, verifier_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    check_variant("audit", arg, ("smoke",))
    config = ml_collections.ConfigDict()
    config.mode = "audit"
    config.run_id = ""  # default: derived from the workdir name and the time
    config.tasks = ""  # a Harbor / Terminal-Bench task folder; "": the bundled seed tasks
    config.fail_on_reject = False  # True: exit 1 when any task is rejected (a CI gate)

    config.sandbox = sandbox_config()  # concurrency: probe episodes at once (4 per task)

    config.verifier = verifier_config()

    # an OpenAI-compatible server (base_url, e.g. http://localhost:8000; "" = off), its model,
    # api_key_env, sampling and timeout: configs/common.py llm_config
    config.judge = llm_config()
    config.judge.max_tokens = 400  # two scores and a sentence

    if arg == "smoke":
        config.task_filter = "count-log-errors,organize-files"
    else:
        config.task_filter = ""  # comma-separated task ids; "" = all
    return config
