"""Materialise the training pool as a TFDS dataset (quality-rank order, fixed reward scale).

  python experiments/run.py --config configs/pool.py --workdir runs/pool \
      --config.scores_path=runs/audit/scores.json --config.heldout_dirs=/data/terminal-bench-2.1
"""

import ml_collections

from configs.common import check_variant


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    check_variant("pool", arg)
    config = ml_collections.ConfigDict()
    config.mode = "pool"
    config.tasks = ""  # a Harbor / Terminal-Bench task folder; "": the bundled seed tasks
    config.scores_path = ""  # audit scores.json (from configs/audit.py); "" = rank by task id
    config.heldout_dirs = ""  # comma-separated benchmark dirs the pool must not overlap
    return config
