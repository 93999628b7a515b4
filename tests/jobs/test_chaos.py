"""Preemption of the main job (toy size, real sandboxes): the job SIGKILLs itself at chosen
points (t1jax.faults: with rollouts in hand, with a checkpoint write in flight) and is rerun
with the same command, as a user would after losing a machine. Checked against the
uninterrupted `toy_run`: SFT (deterministic) ends with the same parameters and Adam state bit
for bit; a Critic Warm-Up killed before its first finished checkpoint starts again from the SFT
actor; PPO killed between rollout and update trains every step once, on trials that were
neither lost from nor repeated in its records. The phases that work episode by episode (pool,
oracle, SFT data, evaluations) are killed part-way and must end with what an uninterrupted run
writes; a PPO run killed while evaluating a checkpoint it had just saved must still evaluate it.

CI runs one kill point per phase; `bash scripts/chaos_sweep.sh` (T1JAX_CHAOS_SWEEP=1) runs every
point of every step of the toy run."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from conftest import run_toy_recipe

pytestmark = pytest.mark.slow
POINTS = ("collected", "updated", "saving")
SWEEP = os.environ.get("T1JAX_CHAOS_SWEEP") == "1"
SFT_KILLS = ([f"sft:{step}:{point}" for step in (1, 2, 3) for point in POINTS] if SWEEP
             else ["sft:2:saving"])
RL_KILLS = ([(f"critic_warmup:1:{w}", f"ppo:{step}:{point}", schedule) for w in POINTS
             for step in (1, 2) for point in POINTS for schedule in ("sync", "one_step_off")]
            if SWEEP else [("critic_warmup:1:saving", "ppo:2:collected", "sync")])


def saved(checkpoints, item):
    """`item` of the newest finished step, as saved."""
    import orbax.checkpoint as ocp

    from t1jax.checkpoint import finalized_steps
    step = finalized_steps(checkpoints)[-1]
    return ocp.StandardCheckpointer().restore((checkpoints / str(step) / item).absolute())


def assert_same(a, b):
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b) > 0
    for x, y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def fresh_copy(toy_run, workdir, *phases):
    """toy_run without the named trained phases (and the evaluations that read them)."""
    shutil.copytree(toy_run, workdir, symlinks=True)
    for phase in phases:
        shutil.rmtree(workdir / phase)
        shutil.rmtree(workdir / "eval" / phase, ignore_errors=True)
    return workdir


@pytest.mark.parametrize("kill_at", SFT_KILLS)
def test_killed_sft_ends_bit_exact(toy_run, tmp_path, kill_at):
    workdir = fresh_copy(toy_run, tmp_path / "sft_chaos")
    shutil.rmtree(workdir / "sft" / "checkpoints")
    (workdir / "sft" / "DONE").unlink()  # its data stays: made and marked complete already
    every = "--config.sft.checkpoint_every=1"
    run_toy_recipe(workdir, "tiny_cpu.py", "--config.phases=sft", every, kill_at=kill_at)
    assert not (workdir / "sft" / "DONE").is_file()
    run_toy_recipe(workdir, "tiny_cpu.py", "--config.phases=sft", every)
    for item in ("actor", "actor_opt", "step"):
        assert_same(saved(workdir / "sft" / "checkpoints", item),
                    saved(toy_run / "sft" / "checkpoints", item))
    steps = [json.loads(line)["step"] for line in
             (workdir / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]  # rows of steps the killed run never saved were written again


@pytest.mark.parametrize("warmup_kill, ppo_kill, schedule", RL_KILLS)
def test_killed_warmup_and_ppo_resume_without_loss_or_repeats(toy_run, tmp_path, warmup_kill,
                                                              ppo_kill, schedule):
    workdir = fresh_copy(toy_run, tmp_path / "rl_chaos", "warmup", "ppo")
    flags = ["--config.phases=warmup,ppo", "--config.ppo.steps=2",
             "--config.rollouts.sampling_seed=0", f"--config.schedule={schedule}"]
    # in CI: Warm-Up's one step trained, its only checkpoint half written (nothing finished);
    # then PPO step 2's rollouts in hand, not yet trained on
    run_toy_recipe(workdir, "tiny_cpu.py", *flags, kill_at=warmup_kill)
    run_toy_recipe(workdir, "tiny_cpu.py", *flags, kill_at=ppo_kill)
    run_toy_recipe(workdir, "tiny_cpu.py", *flags)
    assert (workdir / "ppo" / "DONE").is_file()
    # the rerun Warm-Up started from the SFT actor (which it keeps frozen), not a random one
    assert_same(saved(workdir / "warmup" / "checkpoints", "actor"),
                saved(toy_run / "sft" / "checkpoints", "actor"))
    rows = [json.loads(line) for line in
            (workdir / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:  # no outage here; trials are never sampled by a newer policy than trained
        assert row["rollout/infra_failures"] == 0
        assert 0 <= row["staleness/version_lag_mean"] <= row["staleness/version_lag_max"] <= 2
    # each step's record holds exactly the trials it trained on, and no trial twice
    seen = []
    for row in rows:
        record = workdir / "ppo" / "rollouts" / f"step_{row['step'] - 1:05d}"
        names = sorted(p.name for p in record.glob("*.npz"))
        assert len(names) == row["trials"], (record, names)
        seen += names
    assert len(seen) == len(set(seen)), seen


def _rows(path, keys):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return sorted(tuple(json.dumps(r.get(k), sort_keys=True) for k in keys) for r in rows)


def _tree_bytes(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_killed_pool_is_written_again_the_same(toy_run, tmp_path):
    workdir = fresh_copy(toy_run, tmp_path / "pool_chaos")
    shutil.rmtree(workdir / "pool")
    (workdir / "tokenizer.json").unlink()
    run_toy_recipe(workdir, "tiny_cpu.py", "--config.phases=pool", kill_at="pool:1:written")
    assert not (workdir / "pool" / "DONE").exists() and not (workdir / "tokenizer.json").exists()
    run_toy_recipe(workdir, "tiny_cpu.py", "--config.phases=pool")
    again, first = _tree_bytes(workdir / "pool"), _tree_bytes(toy_run / "pool")
    # DONE records the config each run was started with: only config.phases differs
    done_again, done_first = (json.loads(t.pop("DONE")) for t in (again, first))
    assert done_again.pop("config")["phases"] == "pool"
    done_first.pop("config")
    assert (again, done_again) == (first, done_first)
    assert (workdir / "tokenizer.json").read_bytes() == (toy_run / "tokenizer.json").read_bytes()


def test_killed_oracle_and_sft_data_end_as_uninterrupted(toy_run, tmp_path):
    workdir = fresh_copy(toy_run, tmp_path / "episode_chaos", "oracle", "sft")
    # the third oracle episode reported, then SFT's second oracle episode played
    run_toy_recipe(workdir, "tiny_cpu.py", "--config.phases=oracle", kill_at="oracle:3:episode")
    assert not (workdir / "oracle" / "DONE").exists()
    run_toy_recipe(workdir, "tiny_cpu.py", "--config.phases=oracle,sft",
                   kill_at="sft_data:2:episode")
    done, first = (json.loads((d / "oracle" / "DONE").read_text()) for d in (workdir, toy_run))
    assert done.pop("config")["phases"] == "oracle,sft"  # the config it was finished with
    first.pop("config")
    assert done == first
    keys = ("task_id", "agent", "error", "goal_passed")
    assert (_rows(workdir / "oracle" / "results.jsonl", keys)
            == _rows(toy_run / "oracle" / "results.jsonl", keys))
    assert not (workdir / "sft" / "sft_data" / "COMPLETE").exists()
    run_toy_recipe(workdir, "tiny_cpu.py", "--config.phases=sft")
    data = workdir / "sft" / "sft_data"
    assert sorted(p.name for p in data.iterdir()) == sorted(
        p.name for p in (toy_run / "sft" / "sft_data").iterdir())
    for path in data.glob("*.npz"):
        with np.load(path) as ours, np.load(toy_run / "sft" / "sft_data" / path.name) as theirs:
            for name in ("tokens", "loss_mask", "reward"):
                np.testing.assert_array_equal(ours[name], theirs[name])
    for item in ("actor", "actor_opt", "step"):
        assert_same(saved(workdir / "sft" / "checkpoints", item),
                    saved(toy_run / "sft" / "checkpoints", item))


def test_killed_evaluation_ends_with_the_same_trials(toy_run, tmp_path):
    workdir = fresh_copy(toy_run, tmp_path / "eval_chaos")
    shutil.rmtree(workdir / "eval" / "ppo")
    run_toy_recipe(workdir, "tiny_cpu.py", "--config.phases=eval", kill_at="eval_ppo:2:trial")
    assert not (workdir / "eval" / "ppo" / "summary.json").exists()
    assert (workdir / "eval" / "ppo" / "trials.jsonl.partial").is_file()
    run_toy_recipe(workdir, "tiny_cpu.py", "--config.phases=eval")
    keys = ("task_id", "attempt", "resolved", "reward", "commands", "failure_mode")
    assert (_rows(workdir / "eval" / "ppo" / "trials.jsonl", keys)
            == _rows(toy_run / "eval" / "ppo" / "trials.jsonl", keys))
    assert not (workdir / "eval" / "ppo" / "trials.jsonl.partial").exists()


def test_ppo_killed_while_evaluating_a_saved_step_evaluates_it_on_resume(toy_run, tmp_path):
    from t1jax.checkpoint import finalized_steps
    workdir = fresh_copy(toy_run, tmp_path / "ppo_eval_chaos", "ppo")
    flags = ["--config.phases=ppo", "--config.ppo.steps=2", "--config.eval.every=1"]
    run_toy_recipe(workdir, "tiny_cpu.py", *flags, kill_at="eval_validation_step_0001:1:trial")
    # step 1 saved and final, its evaluation cut short: the resumed loop starts at step 2
    assert finalized_steps(workdir / "ppo" / "checkpoints") == [1]
    step_eval = workdir / "eval" / "validation" / "step_0001"
    assert not (step_eval / "summary.json").exists()
    run_toy_recipe(workdir, "tiny_cpu.py", *flags)
    summary = json.loads((step_eval / "summary.json").read_text())
    assert summary["trials"] == json.loads((toy_run / "pool" / "DONE").read_text())["validation"]
    rows = [json.loads(line) for line in
            (workdir / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
