"""Generated task families: deterministic, a truly held-out split, loadable, and (in Docker) solved
by their oracle and not by a do-nothing agent."""

import json
import uuid
from pathlib import Path

import pytest

from t1jax.rollout.chat import render_prefix
from t1jax.rollout.tokenizer import train_tokenizer
from t1jax.sandbox.images import context_hash
from t1jax.curation import families
from t1jax.tasks.task import load_task
from t1jax.curation.validate import validate_pool
from t1jax.verify.reward import pool_scale
from t1jax.rollout.trial import TrialSite


def _tree(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o777)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    out = tmp_path_factory.mktemp("families")
    plan = families.write_family_pool(out, seed=0, validation_per_family=2)
    return out, plan


def test_deterministic_in_seed(pool, tmp_path):
    out, _ = pool
    again = families.write_family_pool(tmp_path / "again", seed=0, validation_per_family=2)
    assert _tree(out) == _tree(tmp_path / "again")
    other = families.plan_split(seed=1)
    assert other["train"] != again["train"]


def test_main_job_splits_train_validation_test_disjoint():
    """configs/tiny_cpu.py's three splits: no task in two, validation made like the test split
    (held-out combinations and fresh instances) but from held-out keys of its own, so the two
    share no held-out (family, key) combination; fixture families (few fresh instances left)
    filled with combinations."""
    from configs import tiny_cpu
    c = tiny_cpu.get_config().pool
    plan = families.plan_split(seed=0, train_per_family=c.train_per_family,
                               heldout_per_family=c.heldout_per_family,
                               heldout_keys_per_family=c.heldout_keys_per_family,
                               validation_per_family=c.validation_per_family,
                               validation_keys_per_family=c.validation_keys_per_family)
    train, val, test = (set(plan[k]) for k in ("train", "validation", "heldout"))
    assert len(test) == 6 * c.heldout_per_family and len(val) == 6 * c.validation_per_family
    assert not (train & val or train & test or val & test)
    assert val == set(plan["validation_combinations"]) | set(plan["validation_fresh"])
    assert plan["validation_combinations"] and plan["validation_fresh"]
    inst = plan["instances"]
    train_pairs = {(inst[t][0], inst[t][1]) for t in train}
    test_pairs = {(inst[t][0], inst[t][1]) for t in plan["heldout_combinations"]}
    val_pairs = {(inst[t][0], inst[t][1]) for t in plan["validation_combinations"]}
    assert not (val_pairs & train_pairs or test_pairs & train_pairs or val_pairs & test_pairs)
    for family in plan["families"]:
        assert not set(plan["heldout_keys"][family]) & set(plan["validation_keys"][family])
        assert {k for f, k in val_pairs if f == family} <= set(plan["validation_keys"][family])
        assert {k for f, k in test_pairs if f == family} <= set(plan["heldout_keys"][family])
    # a validation task's key, when held out for its family, is never one of test's
    for t in plan["validation"]:
        assert inst[t][1] not in plan["heldout_keys"][inst[t][0]], t
    with pytest.raises(ValueError, match="not enough held-out combinations"):
        families.plan_split(seed=0, train_per_family=50, heldout_per_family=12,
                            heldout_keys_per_family=2, validation_per_family=4)
    with pytest.raises(ValueError, match="train instances exceed"):  # fixture families
        families.plan_split(seed=0, train_per_family=50, heldout_keys_per_family=3,
                            validation_per_family=4, validation_keys_per_family=1)


def test_tokenizer_corpus_holds_no_validation_or_test_text(pool):
    """The tokenizer is trained on the train split's text: no held-out instruction shapes it."""
    out, plan = pool
    corpus = "\n".join(families.family_corpus(out))
    for split in ("heldout", "validation"):
        for tid in plan[split]:
            instruction = families.render(*plan["instances"][tid])[0]
            assert instruction not in corpus, tid
    first_train = families.render(*plan["instances"][plan["train"][0]])[0]
    assert first_train in corpus


def test_heldout_combinations_are_disjoint_from_train(pool):
    out, plan = pool
    inst = plan["instances"]
    train_pairs = {(inst[t][0], inst[t][1]) for t in plan["train"]}
    assert set(plan["heldout"]) == set(plan["heldout_combinations"]) | set(plan["heldout_fresh"])
    assert not set(plan["train"]) & set(plan["heldout"])
    assert plan["heldout_combinations"] and plan["heldout_fresh"]
    for t in plan["heldout_combinations"]:
        family, key, _ = inst[t]
        assert (family, key) not in train_pairs, t
        assert key in plan["heldout_keys"][family]
        # the entity itself is not unseen: train uses it with another family
        assert any(inst[u][1] == key or inst[u][2] == key for u in plan["train"]), t
    for t in plan["heldout_fresh"]:
        assert (inst[t][0], inst[t][1]) in train_pairs, t
    for family, keys in plan["heldout_keys"].items():
        assert not {inst[t][1] for t in plan["train"] if inst[t][0] == family} & set(keys)
    split = json.loads((out / "split.json").read_text())
    assert split["heldout_combinations"] == plan["heldout_combinations"]


def test_every_task_loads_and_shares_one_environment(pool):
    out, plan = pool
    hashes = set()
    for split in ("train", "heldout"):
        for tid in plan[split]:
            task = load_task(out / split / tid)
            family = plan["instances"][tid][0]
            assert task.category == family and family in task.tags
            assert task.instruction.count("\n") == 0 and len(task.instruction) < 80
            assert task.agent.timeout_sec <= 60 and task.verifier.timeout_sec <= 60
            assert 2 <= sum(line.startswith("def test_") for line in
                            (task.tests_dir / "test_outputs.py").read_text().splitlines()) <= 4
            hashes.add(context_hash(task.environment_dir, task.dockerfile, {}))
    assert len(hashes) == 1  # one image build for the whole pool


def test_family_tokenizer_is_compact(pool):
    out, plan = pool
    tok = train_tokenizer(512, corpus=families.family_corpus(out))
    default = train_tokenizer(512)
    instruction = load_task(out / "train" / plan["train"][0]).instruction
    mine = len(tok.encode(render_prefix(families.SYSTEM_PROMPT, instruction)).ids)
    theirs = len(default.encode(render_prefix(families.SYSTEM_PROMPT, instruction)).ids)
    assert mine < theirs
    for word in families.ENTITIES:  # entity words are whole tokens
        assert len(tok.encode(" " + word).ids) == 1, word


@pytest.mark.slow
def test_oracle_passes_and_nothing_fails_in_docker(pool, tmp_path, docker_backend):
    out, plan = pool
    chosen = []
    for family in families.FAMILIES:  # one train and one held-out task per family
        for split in ("train", "heldout"):
            tid = next(t for t in plan[split] if plan["instances"][t][0] == family)
            chosen.append(load_task(out / split / tid))
    run_id = f"test-families-{uuid.uuid4().hex[:6]}"
    try:
        summary = validate_pool(chosen, TrialSite(docker_backend, run_id=run_id,
                                                  scale=pool_scale(chosen)),
                                out_dir=tmp_path / "val")
    finally:
        docker_backend.reap(run_id)
    assert summary["tasks"] == len(chosen)
    assert summary["pool_healthy"], (tmp_path / "val" / "results.md").read_text()


@pytest.mark.slow
def test_teacher_slips_are_clean_misses_in_docker(pool, docker_backend):
    """Each family's slip, played like an oracle through the real agent loop, misses its task's
    goal with a clean verifier run, so oracle_samples(want_solved=False) keeps it as SFT data
    tagged `slip`; the reference, which solves, is not kept under that rule."""
    from t1jax.rollout.oracle_data import Teacher, oracle_commands, oracle_samples
    from t1jax.rollout.settings import EpisodeSettings
    out, plan = pool
    tasks = [load_task(out / "train" / next(t for t in plan["train"]
                                            if plan["instances"][t][0] == family))
             for family in families.FAMILIES]
    tok = train_tokenizer(512, corpus=families.family_corpus(out))
    slip_of = {t.task_id: families.slip_command(*plan["instances"][t.task_id]) for t in tasks}
    for t in tasks:  # a slip differs from the reference, in the reference's shape
        (reference,), _ = oracle_commands(t)
        assert slip_of[t.task_id] != reference
        assert slip_of[t.task_id].split()[0] in ("echo", "mkdir", "cp", "wc", "cat")
    run_id = f"test-slips-{uuid.uuid4().hex[:6]}"
    site = TrialSite(docker_backend, run_id=run_id, scale=pool_scale(tasks), concurrency=3)
    common = dict(num_layers=1, top_k=1,
                  episode=EpisodeSettings(system_prompt=families.SYSTEM_PROMPT))
    try:
        slips, missed = oracle_samples(tasks, site, tok, teacher=Teacher(
            commands_of=lambda t: ([slip_of[t.task_id]], []), final_answer=families.FINAL_ANSWER,
            want_solved=False, source="slip", attempt=1), **common)
        kept, refused = oracle_samples(tasks, site, tok, teacher=Teacher(
            final_answer=families.FINAL_ANSWER, want_solved=False), **common)
    finally:
        docker_backend.reap(run_id)
    assert missed == []
    assert [s.metadata["task_id"] for s in slips] == [t.task_id for t in tasks]
    for s in slips:
        report = s.metadata["verifier"]
        assert s.metadata["source"] == "slip" and s.metadata["attempt"] == 1
        assert not report["solved"] and report["passed"] < report["total"]
        assert slip_of[s.metadata["task_id"]] in tok.decode(s.tokens.tolist())
    assert kept == [] and all(why.startswith("not a clean miss: ") for _, why in refused)
