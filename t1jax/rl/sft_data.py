"""SFT data on disk and from rollouts: rejection-filtered trials, one `.npz` per sample, and
whole datasets that a killed run can never leave half written. The oracle episodes that make the
warm start's data are t1jax.rollout.oracle_data (they drive sandboxes; training never does).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from t1jax.rollout.sample import Sample


# -- rollouts as SFT data ------------------------------------------------------------------------
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


def sample_filename(sample: Sample) -> str:
    tid = sample.metadata.get("task_id")
    if not tid:
        raise ValueError("sample has no metadata['task_id']; cannot name its file")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", str(tid))
    return f"{safe}--attempt{int(sample.metadata.get('attempt', 0)):04d}.npz"


def save_samples(samples, directory) -> list[Path]:
    """Write each sample to `directory/<task_id>--attempt<NNNN>.npz` (atomically; an existing
    file of the same name is replaced). Returns the paths in input order."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = [sample_filename(s) for s in samples]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"samples share a (task_id, attempt): {dupes[:5]}")
    paths = []
    for s, name in zip(samples, names):
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                s.to_npz(f)
            os.replace(tmp, directory / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        paths.append(directory / name)
    return paths


DATASET_COMPLETE = "COMPLETE"


def save_dataset(samples, directory, **info) -> None:
    """Replace `directory` with `samples` and, written last, a COMPLETE marker (with `info`):
    a run killed while saving leaves no marker, so its partial set is never trained on."""
    directory = Path(directory)
    shutil.rmtree(directory, ignore_errors=True)
    save_samples(samples, directory)
    (directory / DATASET_COMPLETE).write_text(json.dumps({"samples": len(samples), **info})
                                              + "\n")


def dataset_complete(directory) -> bool:
    return (Path(directory) / DATASET_COMPLETE).is_file()


def load_samples(directory) -> list[Sample]:
    """Every *.npz sample in `directory`, sorted by file name (task id, then attempt)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no SFT sample directory at {directory}")
    out = []
    for path in sorted(directory.glob("*.npz")):
        try:
            out.append(Sample.from_npz(path))
        except Exception as err:  # noqa: BLE001 - name the bad file
            raise ValueError(f"{path}: not a readable Sample: {type(err).__name__}: {err}") \
                from err
    return out


__all__ = ["dataset_complete", "filter_rollouts", "is_resolved", "load_samples",
           "sample_filename", "save_dataset", "save_samples"]
