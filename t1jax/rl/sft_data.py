"""SFT data from rollouts: which trials are good enough to imitate (rejection sampling). The
oracle episodes that make the warm start's data are t1jax.rollout.oracle_data (they drive
sandboxes; training never does); the datasets on disk are t1jax.rollout.sample's, one `.npz`
per sample, which a killed run can never leave half written.
"""

from __future__ import annotations

import numpy as np

from t1jax.rollout.sample import Sample


def is_resolved(sample: Sample) -> bool:
    """The verifier said solved (binary success, or every assertion passed, not tampered)."""
    report = sample.metadata.get("verifier") or {}
    return bool(report.get("solved"))


def filter_rollouts(samples, *, min_reward: float | None = None,
                    resolved_only: bool = True) -> list[Sample]:
    """Rejection sampling for SFT: keep resolved trials (resolved_only) and/or those with
    reward >= min_reward (both when both are given); samples with nothing to train on are
    dropped. Sorted by (task_id, attempt), ties in input order."""
    keep = []
    for i, s in enumerate(samples):
        if resolved_only and not is_resolved(s):
            continue
        if min_reward is not None and not s.reward >= min_reward:
            continue
        if not np.any(s.loss_mask):
            continue
        keep.append((str(s.metadata.get("task_id", "")), int(s.metadata.get("attempt", 0)), i, s))
    keep.sort(key=lambda x: x[:3])
    return [x[3] for x in keep]


__all__ = ["filter_rollouts", "is_resolved"]
