"""Recursive task synthesis: extend each accepted task's workflow with one more executable step
(offline operators, or a model through llm.base_url), validate every new task in sandboxes, and
let the accepted ones seed the next round. Writes round-<r>/<task>/, rejected/<task>/ (with
reason.txt), summary.md and lineage.jsonl to the workdir.

  python experiments/run.py --config configs/synth.py --workdir runs/synth
  python experiments/run.py --config configs/synth.py --config.task_filter=count-log-errors \
      --config.rounds=1 --config.llm.base_url=http://127.0.0.1:30000
"""

import ml_collections

from configs.common import check_variant, llm_config, sandbox_config, verifier_config

OFFLINE_OPERATORS = "checksum_manifest,archive_outputs,summary_json,readonly_publish"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    check_variant("synth", arg)
    config = ml_collections.ConfigDict()
    config.mode = "synth"
    config.run_id = ""  # default: derived from the workdir name and the time
    config.tasks = ""  # a Harbor / Terminal-Bench task folder; "": the bundled seed tasks
    config.skip_invalid_tasks = False  # True: report malformed tasks and use the rest
    config.task_filter = ""  # comma-separated seed task ids; "" = all

    config.rounds = 2  # round r extends the tasks accepted in round r - 1 (round 0: the pool)
    config.per_round_limit = 8  # new tasks attempted per round, at most
    config.seed = 0  # picks the parents a limit keeps and each parent's operator
    config.operators = OFFLINE_OPERATORS  # comma-separated; llm_rewrite joins when llm is set

    # an OpenAI-compatible server (base_url, e.g. http://127.0.0.1:30000; "" = off), its model,
    # api_key_env, sampling and timeout: configs/common.py llm_config
    config.llm = llm_config()
    config.llm.max_tokens = 4096  # a rewritten task's tests and instruction in one reply

    config.sandbox = sandbox_config()

    config.verifier = verifier_config()
    return config
