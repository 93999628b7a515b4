"""The training pool as a TFDS dataset (array_record, random access; no TensorFlow).

Why: the trainer needs a fixed, versioned snapshot of the pool it trains on: which tasks,
in which order, with which audit scores and lineage, and the dense reward's global scale.
Records are written in quality-rank order (descending audit score, ties by task_id) with
shuffling disabled, so index i is rank i; the per-epoch order is the EpochSampler's job. The
global scale is chosen once here, as the nearest-rank p90 of the materialised tasks' static
assertion counts (each floored at 1; GlobalScale.from_counts), and stored in the dataset's
metadata: the trainer reads it back with load_pool_dataset and never recomputes it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
from etils import epath
import tensorflow_datasets as tfds

from t1jax.tasks.pool import load_pool
from t1jax.tasks.task import TaskFormatError
from t1jax.verify.reward import GlobalScale, static_assertion_count

NAME = "t1jax_pool"
SCALE_QUANTILE = 0.9
SPLIT = "train"


def read_scores(path: str | os.PathLike) -> dict[str, tuple[float, bool]]:
    """An audit scores file: JSON {task_id: {"score": float, "rejected": bool}}."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read audit scores {path}: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"audit scores {path}: expected a JSON object, got {type(raw).__name__}")
    scores, bad = {}, []
    for task_id, entry in raw.items():
        score = entry.get("score") if isinstance(entry, dict) else None
        rejected = entry.get("rejected", False) if isinstance(entry, dict) else None
        if (isinstance(score, bool) or not isinstance(score, (int, float))
                or not math.isfinite(score) or not isinstance(rejected, bool)):
            bad.append(f"{task_id}: {entry!r}")
            continue
        scores[task_id] = (float(score), rejected)
    if bad:
        raise ValueError(f"audit scores {path}: want {{\"score\": finite number, \"rejected\": "
                         f"bool}} per task; bad entries: " + "; ".join(bad[:10]))
    return scores


def lineage(task) -> dict:
    """Where a task came from: task.toml [metadata] t1jax_parent / t1jax_operator / t1jax_round
    (a seed task has none: parent "", operator "seed", round 0)."""
    meta = task.metadata
    values = {"parent": meta.get("t1jax_parent", ""),
              "operator": meta.get("t1jax_operator", "seed"), "round": meta.get("t1jax_round", 0)}
    for key in ("parent", "operator"):
        if not isinstance(values[key], str):
            raise TaskFormatError(task.path, "task.toml", f"expected a string, got "
                                  f"{values[key]!r}", f"metadata.t1jax_{key}")
    rnd = values["round"]
    if isinstance(rnd, bool) or not isinstance(rnd, int) or not 0 <= rnd < 2 ** 31:
        raise TaskFormatError(task.path, "task.toml", f"expected an integer >= 0, got {rnd!r}",
                              "metadata.t1jax_round")
    return values


def ranked_records(pool_dir, scores_path=None) -> tuple[list[dict], GlobalScale]:
    """The pool's records in rank order, and the global scale chosen from them."""
    tasks = load_pool(pool_dir).tasks  # a bad training task is an error, never skipped
    scores = read_scores(scores_path) if scores_path is not None else None
    if scores is not None:
        missing = sorted(t.task_id for t in tasks if t.task_id not in scores)
        if missing:
            raise ValueError(f"audit scores {scores_path} lack {len(missing)} pool task(s): "
                             + ", ".join(missing[:20]) + "; audit every task before training")
        tasks = [t for t in tasks if not scores[t.task_id][1]]
    if not tasks:
        raise ValueError(f"no tasks to materialise from {pool_dir} (all rejected or none found)")
    records = [{
        "task_id": t.task_id, "path": str(t.path), "instruction": t.instruction,
        "category": t.category or "", "difficulty": t.difficulty or "",
        "assertion_count": static_assertion_count(t),
        "quality_score": scores[t.task_id][0] if scores else 0.0, "lineage": lineage(t),
    } for t in tasks]
    records.sort(key=lambda r: (-r["quality_score"], r["task_id"]))
    counts = [max(r["assertion_count"], 1) for r in records]
    return records, GlobalScale.from_counts(counts, SCALE_QUANTILE)


def scale_rule(scale: GlobalScale) -> str:
    return (f"{scale.source}; a task's count is its static test-function count "
            "(static_assertion_count) floored at 1, rejected tasks excluded; fixed at build time")


def _fingerprint(records: list[dict], scale: GlobalScale) -> str:
    blob = json.dumps([records, scale.value], sort_keys=True, default=float)
    return hashlib.sha256(blob.encode()).hexdigest()


class T1jaxPool(tfds.core.GeneratorBasedBuilder):
    """A task pool, one record per task, in quality-rank order (shuffling disabled)."""

    name = NAME
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Task pool in quality-rank order with lineage and global scale."}

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        """This file. TFDS's own lookup for a builder inside a package needs the
        ``importlib_resources`` backport, which Python >= 3.9 installs lack."""
        return epath.Path(__file__)

    def __init__(self, *, pool_dir=None, scores_path=None, **kwargs):
        self._pool_dir, self._scores_path, self._ranked = pool_dir, scores_path, None
        super().__init__(**kwargs)

    def ranked(self) -> tuple[list[dict], GlobalScale]:
        if self._pool_dir is None:
            raise ValueError("T1jaxPool needs pool_dir= to build; to read a built pool use "
                             "load_pool_dataset(data_dir)")
        if self._ranked is None:
            self._ranked = ranked_records(self._pool_dir, self._scores_path)
        return self._ranked

    def _info(self) -> tfds.core.DatasetInfo:
        text = tfds.features.Text
        return tfds.core.DatasetInfo(
            builder=self, description=__doc__,
            features=tfds.features.FeaturesDict({
                "task_id": text(), "path": text(), "instruction": text(),
                "category": text(), "difficulty": text(),
                "assertion_count": np.int32, "quality_score": np.float32,
                "lineage": {"parent": text(), "operator": text(), "round": np.int32},
            }),
            disable_shuffling=True,  # index i is rank i
            metadata=tfds.core.MetadataDict())

    def _split_generators(self, dl_manager):
        records, scale = self.ranked()
        self.info.metadata.update(
            global_scale=scale.value, global_scale_rule=scale_rule(scale),
            global_scale_quantile=SCALE_QUANTILE, num_tasks=len(records),
            pool_dir=str(self._pool_dir), fingerprint=_fingerprint(records, scale),
            scores_path=str(self._scores_path) if self._scores_path is not None else "")
        return {SPLIT: self._generate_examples(records)}

    def _generate_examples(self, records):
        for rank, record in enumerate(records):  # integer keys: written in key order
            yield rank, record


def _version_dir(data_dir) -> Path:
    """Accept the data_dir given to build_pool_dataset or the dataset's own directory."""
    root = Path(data_dir)
    if (root / "dataset_info.json").is_file():
        return root
    versions = sorted((p for p in (root / NAME).glob("*") if (p / "dataset_info.json").is_file()),
                      key=lambda p: tfds.core.Version(p.name) if tfds.core.Version.is_valid(
                          p.name) else tfds.core.Version("0.0.0"))
    if not versions:
        raise FileNotFoundError(f"no built {NAME} dataset under {root}; "
                                "build one with build_pool_dataset(pool_dir, data_dir)")
    return versions[-1]


def build_pool_dataset(pool_dir, data_dir, scores_path=None) -> Path:
    """Materialise the pool under data_dir; returns the dataset directory. An existing build
    of the same records is reused; one of a different pool is replaced."""
    builder = T1jaxPool(pool_dir=pool_dir, scores_path=scores_path, data_dir=str(data_dir),
                        file_format="array_record")
    records, scale = builder.ranked()
    target = Path(builder.data_dir)
    mode = tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS
    if (target / "dataset_info.json").is_file():
        built = tfds.builder_from_directory(str(target)).info.metadata or {}
        if built.get("fingerprint") != _fingerprint(records, scale):
            mode = tfds.download.GenerateMode.FORCE_REDOWNLOAD
            builder = T1jaxPool(pool_dir=pool_dir, scores_path=scores_path,
                                data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(download_mode=mode))
    return target


def _decode(value):
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return value.item() if isinstance(value, np.generic) else value


class PoolDataSource:
    """Random access to a built pool: ``len()``, and ``[i]`` -> the rank-i task's record with
    text as str and numbers as Python scalars. ``raw`` is TFDS's own data source."""

    def __init__(self, raw):
        self.raw = raw

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, index: int) -> dict:
        if not -len(self) <= index < len(self):
            raise IndexError(f"pool index {index} out of range for {len(self)} tasks")
        return _decode(self.raw[index % len(self)])

    def __repr__(self) -> str:
        return f"PoolDataSource({len(self)} tasks)"


def load_pool_dataset(data_dir) -> tuple[PoolDataSource, GlobalScale]:
    """A built pool and the global scale fixed when it was built (never recomputed)."""
    builder = tfds.builder_from_directory(str(_version_dir(data_dir)))
    meta = builder.info.metadata or {}
    if "global_scale" not in meta:
        raise ValueError(f"{builder.data_dir}: dataset metadata has no global_scale; "
                         "rebuild it with build_pool_dataset")
    scale = GlobalScale(float(meta["global_scale"]), str(meta.get("global_scale_rule", "")))
    return PoolDataSource(builder.as_data_source(SPLIT)), scale
