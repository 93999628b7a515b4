"""Materialise a training pool: refuse it if it overlaps a held-out suite, then write the TFDS
(array_record) dataset in quality-rank order with the dense reward's fixed global scale."""

from __future__ import annotations

import json
from pathlib import Path

from t1jax.jobs import UsageError, build


def run(config, workdir: Path) -> int:
    from t1jax.tasks.decontam import ContaminationError, check_pool
    from t1jax.tasks.pool import load_pool
    from t1jax.curation.tfds_pool import build_pool_dataset, load_pool_dataset

    pool_dir = build.task_folder(config)
    tasks = load_pool(pool_dir).tasks
    heldout = [d for d in config.heldout_dirs.split(",") if d]
    if heldout:
        try:
            checked = check_pool(tasks, heldout)
        except ContaminationError as err:
            raise UsageError(f"the pool {pool_dir} overlaps a held-out suite: {err}") from err
        print(f"decontamination: clean against {checked}")
    scores = config.scores_path or None
    data_dir = workdir / "tfds"
    version_dir = build_pool_dataset(pool_dir, data_dir, scores)
    source, scale = load_pool_dataset(data_dir)
    summary = {"dataset": str(version_dir), "tasks": len(source), "global_scale": scale.value,
               "global_scale_rule": scale.source, "ranked_by": scores or "task_id (no scores)",
               "top": [source[i]["task_id"] for i in range(min(5, len(source)))]}
    (workdir / "pool.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0
