"""The pool as a TFDS dataset (rank order, audit scores, lineage, fixed global scale) and the
resumable epoch sampler that reads it."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

from t1jax.tasks.pool import default_pool_dir, load_pool
from t1jax.tasks.sampler import EpochSampler
from t1jax.tasks.task import TaskFormatError
from t1jax.curation.tfds_pool import NAME, build_pool_dataset, load_pool_dataset
from t1jax.verify.reward import pool_scale, static_assertion_count


def rows(source) -> list[dict]:
    return [source[i] for i in range(len(source))]


def copy_seed_pool(dst):
    """The seed pool's valid tasks, plus one derived task carrying lineage metadata."""
    tasks = load_pool(default_pool_dir(), skip_invalid=True).tasks
    for t in tasks:
        shutil.copytree(t.path, dst / t.task_id)
    parent = tasks[0]
    child = dst / f"{parent.task_id}-v2"
    shutil.copytree(parent.path, child)
    toml = (child / "task.toml").read_text()
    assert "\n[metadata]\n" in toml
    (child / "task.toml").write_text(toml.replace("\n[metadata]\n", (
        f'\n[metadata]\nt1jax_parent = "{parent.task_id}"\n'
        't1jax_operator = "mutate-instruction"\nt1jax_round = 2\n'), 1))
    return parent.task_id, child.name


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    root = tmp_path_factory.mktemp("pool")
    parent, child = copy_seed_pool(root)
    return root, parent, child, load_pool(root).tasks


def test_builds_the_seed_pool(tmp_path):
    tasks = load_pool(default_pool_dir()).tasks
    path = build_pool_dataset(default_pool_dir(), tmp_path)
    assert path == tmp_path / NAME / "1.0.0"
    source, scale = load_pool_dataset(tmp_path)
    assert len(source) == len(tasks)
    got = rows(source)
    by_id = {t.task_id: t for t in tasks}
    assert [r["task_id"] for r in got] == sorted(by_id)  # no scores: all 0.0, ties by task_id
    for r in got:
        t = by_id[r["task_id"]]
        assert r["path"] == str(t.path) and r["instruction"] == t.instruction
        assert r["category"] == (t.category or "") and r["difficulty"] == (t.difficulty or "")
        assert r["assertion_count"] == static_assertion_count(t)
        assert r["quality_score"] == 0.0
        assert r["lineage"] == {"parent": "", "operator": "seed", "round": 0}
    want = pool_scale(tasks)
    assert scale.value == want.value and scale.source.startswith(want.source)
    assert "floored at 1" in scale.source
    assert "tensorflow" not in sys.modules  # array_record only; never TensorFlow


def test_scores_rank_and_reject(tmp_path, pool):
    root, _, _, tasks = pool
    ids = sorted(t.task_id for t in tasks)
    scores = {tid: {"score": float(i % 4), "rejected": i in (1, 6)} for i, tid in enumerate(ids)}
    scores_path = tmp_path / "scores.json"
    scores_path.write_text(json.dumps(scores))
    source, scale = load_pool_dataset(build_pool_dataset(root, tmp_path / "data", scores_path))
    kept = [tid for tid in ids if not scores[tid]["rejected"]]
    got = rows(source)
    assert len(source) == len(kept) == len(ids) - 2
    assert [r["task_id"] for r in got] == sorted(kept, key=lambda t: (-scores[t]["score"], t))
    qs = [r["quality_score"] for r in got]
    assert qs == sorted(qs, reverse=True) and qs[0] == 3.0
    assert not {ids[1], ids[6]} & {r["task_id"] for r in got}
    assert scale.value == pool_scale([t for t in tasks if t.task_id in kept]).value


def test_lineage_round_trips(tmp_path, pool):
    root, parent, child, tasks = pool
    source, _ = load_pool_dataset(build_pool_dataset(root, tmp_path))
    got = {r["task_id"]: r for r in rows(source)}
    assert len(got) == len(tasks)
    assert got[child]["lineage"] == {"parent": parent, "operator": "mutate-instruction",
                                     "round": 2}
    assert got[parent]["lineage"] == {"parent": "", "operator": "seed", "round": 0}


def test_rebuild_reuses_same_pool_and_replaces_a_changed_one(tmp_path, pool):
    root, _, _, tasks = pool
    path = build_pool_dataset(root, tmp_path)
    shard = next(path.glob("*.array_record*"))
    mtime = shard.stat().st_mtime_ns
    assert build_pool_dataset(root, tmp_path) == path
    assert shard.stat().st_mtime_ns == mtime  # same records: reused, not rewritten
    scores_path = tmp_path / "scores.json"
    scores_path.write_text(json.dumps({t.task_id: {"score": 1.0, "rejected": i == 0}
                                       for i, t in enumerate(tasks)}))
    source, _ = load_pool_dataset(build_pool_dataset(root, tmp_path, scores_path))
    assert len(source) == len(tasks) - 1
    source, _ = load_pool_dataset(path)  # the dataset dir itself works too
    assert len(source) == len(tasks) - 1


def test_bad_inputs_fail_clearly(tmp_path, pool):
    root, _, child, tasks = pool
    scores_path = tmp_path / "scores.json"
    scores_path.write_text(json.dumps({tasks[0].task_id: {"score": 1.0, "rejected": False}}))
    with pytest.raises(ValueError, match="lack"):
        build_pool_dataset(root, tmp_path / "a", scores_path)
    scores_path.write_text(json.dumps({t.task_id: {"score": "high", "rejected": False}
                                       for t in tasks}))
    with pytest.raises(ValueError, match="bad entries"):
        build_pool_dataset(root, tmp_path / "b", scores_path)
    scores_path.write_text(json.dumps({t.task_id: {"score": 1.0, "rejected": True}
                                       for t in tasks}))
    with pytest.raises(ValueError, match="no tasks"):
        build_pool_dataset(root, tmp_path / "c", scores_path)
    with pytest.raises(FileNotFoundError, match="build_pool_dataset"):
        load_pool_dataset(tmp_path / "nothing-here")
    bad = tmp_path / "bad-pool"
    shutil.copytree(root / child, bad / child)
    toml = (bad / child / "task.toml").read_text()
    (bad / child / "task.toml").write_text(toml.replace("t1jax_round = 2", 't1jax_round = "2"'))
    with pytest.raises(TaskFormatError, match="t1jax_round"):
        build_pool_dataset(bad, tmp_path / "d")


def test_sampler_over_the_data_source(tmp_path, pool):
    root, _, _, tasks = pool
    source, _ = load_pool_dataset(build_pool_dataset(root, tmp_path))
    sampler = EpochSampler(len(source), seed=7)
    orders = [sampler.take(len(source)) for _ in range(3)]
    for order in orders:
        assert sorted(order) == list(range(len(source)))
        assert sorted(source[i]["task_id"] for i in order) == sorted(t.task_id for t in tasks)
    assert orders[0] != orders[1] != orders[2]
    assert orders[0] != list(range(len(source)))  # not rank order


def test_sampler_resumes_exactly(tmp_path):
    n, seed = 10, 3
    uninterrupted = EpochSampler(n, seed).take(60)
    first = EpochSampler(n, seed)
    head = first.take(25)  # 2.5 epochs
    state = json.loads(json.dumps(first.state_dict()))  # checkpointed as JSON
    assert state == {"epoch": 2, "position": 5, "seed": seed, "num_items": n}
    resumed = EpochSampler(n, seed)
    resumed.load_state_dict(state)
    assert head + resumed.take(35) == uninterrupted
    for e in range(6):
        assert sorted(uninterrupted[e * n:(e + 1) * n]) == list(range(n))
    finished = EpochSampler(n, seed)
    finished.load_state_dict({"epoch": 1, "position": n, "seed": seed, "num_items": n})
    assert finished.take(n) == uninterrupted[2 * n:3 * n]


def test_sampler_seeds_and_validation():
    a, b = EpochSampler(50, 0), EpochSampler(50, 1)
    assert a.take(50) != b.take(50)
    assert np.array_equal(a.epoch_order(4), EpochSampler(50, 0).epoch_order(4))
    with pytest.raises(ValueError, match="pool of 49 items"):
        EpochSampler(50, 0).load_state_dict({"epoch": 0, "position": 0, "seed": 0,
                                             "num_items": 49})
    with pytest.raises(ValueError, match="seed 1"):
        EpochSampler(50, 0).load_state_dict({"epoch": 0, "position": 0, "seed": 1,
                                             "num_items": 50})
    with pytest.raises(ValueError, match="missing"):
        EpochSampler(50, 0).load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="out of range"):
        EpochSampler(50, 0).load_state_dict({"epoch": 0, "position": 51, "seed": 0,
                                             "num_items": 50})
    for num_items, seed in ((0, 0), (5, -1), (True, 0), (5, 1.5)):
        with pytest.raises(ValueError):
            EpochSampler(num_items, seed)
