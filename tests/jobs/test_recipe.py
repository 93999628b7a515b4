"""The main job end to end at toy size (real sandboxes, engine, verifier, trainer): every phase
runs, base / SFT / PPO are evaluated on the held-out split, the report is written, and running
the command again resumes instead of redoing finished phases. The run is the session's
`toy_run` (conftest.py), which the notebook tests read too."""

import json
import shutil
from pathlib import Path

import pytest

from conftest import run_toy_recipe

pytestmark = pytest.mark.slow


def test_recipe_runs_every_phase_and_resumes(toy_run, tmp_path):
    run = run_toy_recipe
    split = json.loads((toy_run / "pool" / "split.json").read_text())
    splits = [set(split[name]) for name in ("train", "validation", "heldout")]
    assert all(splits) and sum(map(len, splits)) == len(set.union(*splits))  # three, disjoint
    assert json.loads((toy_run / "oracle" / "DONE").read_text())["pool_healthy"]
    for stage in ("sft", "warmup", "ppo"):
        assert (toy_run / stage / "DONE").is_file()
        assert (toy_run / stage / "metrics.jsonl").read_text().strip()
    # one warm-up step cannot fill the health window: the cap is reached and said so
    warm = json.loads((toy_run / "warmup" / "DONE").read_text())
    assert warm["steps"] == 1 and warm["healthy"] is False
    assert len(warm["explained_variance"]) == 1
    for label in ("base", "sft", "ppo"):
        summary = json.loads((toy_run / "eval" / label / "summary.json").read_text())
        assert summary["trials"] == len(split["heldout"]), label
    for label in ("sft", "ppo"):  # settings are chosen on validation, never on the test split
        summary = json.loads((toy_run / "eval" / "validation" / label / "summary.json")
                             .read_text())
        assert summary["trials"] == len(split["validation"]), label
    report = (toy_run / "report" / "summary.md").read_text()
    assert "base" in report and "ppo" in report and "## Validation split" in report
    assert (toy_run / "report" / "trajectories.html").is_file()

    timed = [json.loads(line)["phase"] for line in
             (toy_run / "timings.jsonl").read_text().splitlines()]
    assert timed == ["pool", "oracle", "sft", "warmup", "ppo", "eval"]
    assert "## Wall time" in report

    # re-running the finished job resumes: nothing is redone (on a copy: the run is shared)
    again_dir = tmp_path / "again"
    shutil.copytree(toy_run, again_dir, symlinks=True)
    mtime = (again_dir / "ppo" / "metrics.jsonl").stat().st_mtime
    again = run(again_dir)
    assert (again_dir / "ppo" / "metrics.jsonl").stat().st_mtime == mtime  # nothing retrained
    assert "ppo" in again.stdout
    assert len((again_dir / "timings.jsonl").read_text().splitlines()) == len(timed)

    # an ablation reuses everything before PPO and trains PPO on the binary outcome
    ablation = tmp_path / "binary"
    run(ablation, "ablations.py:binary_reward", f"--config.reuse={toy_run}")
    for name in ("pool", "oracle", "sft", "warmup", "eval/base", "eval/sft",
                 "eval/validation/sft"):
        assert (ablation / name).is_symlink(), name
    assert not (ablation / "ppo").is_symlink() and (ablation / "ppo" / "DONE").is_file()
    for folder in ("eval/ppo", "eval/validation/ppo"):
        assert (ablation / folder / "summary.json").is_file()
    assert json.loads((ablation / "config.json").read_text())["rl"]["reward"] == "binary"
    for line in (ablation / "ppo" / "metrics.jsonl").read_text().splitlines():
        assert json.loads(line)["reward/trained_mean"] in (0.0, 0.5, 1.0)  # 2 trials, 0 or 1
    ablation_timed = [json.loads(line)["phase"] for line in
                      (ablation / "timings.jsonl").read_text().splitlines()]
    assert ablation_timed == ["ppo", "eval"]


def test_sft_data_hold_the_reference_and_the_teacher_slip_of_every_train_task(toy_run):
    """The main job's SFT data (sft.teacher_slips, its default): each train task's reference
    episode (attempt 0, solved) beside its teacher's slip (attempt 1, a clean miss)."""
    from t1jax.rollout.sample import load_samples
    from t1jax.curation import families
    split = json.loads((toy_run / "pool" / "split.json").read_text())
    samples = load_samples(toy_run / "sft" / "sft_data")
    got = {(s.metadata["task_id"], s.metadata["attempt"]): s.metadata for s in samples}
    assert sorted(got) == sorted((t, a) for t in split["train"] for a in (0, 1))
    for (task_id, attempt), meta in got.items():
        assert meta["source"] == ("oracle", "slip")[attempt]
        assert meta["verifier"]["solved"] == (attempt == 0), (task_id, attempt)
    assert "echo" in families.slip_command(*split["instances"][split["train"][0]])


def test_a_task_without_its_reference_gets_no_slip(toy_run):
    """A slip alone would teach its task nothing but the slip: a train task whose reference
    episode was skipped (unresolved, a verifier error) gets no slip episode either."""
    import ml_collections

    from t1jax.jobs.recipe import Recipe
    from t1jax.rollout.sample import load_samples
    config = ml_collections.ConfigDict(json.loads((toy_run / "config.json").read_text()))
    recipe = Recipe(config, toy_run)  # reads the pool and tokenizer, writes nothing
    references = [s for s in load_samples(toy_run / "sft" / "sft_data")
                  if s.metadata["attempt"] == 0]
    dropped = references[0].metadata["task_id"]
    samples, skipped = recipe._add_slips(recipe.stack(), references[1:], [])
    slipped = {s.metadata["task_id"] for s in samples if s.metadata["source"] == "slip"}
    assert slipped == {s.metadata["task_id"] for s in references[1:]}, skipped
    assert dropped not in slipped and skipped == []


def test_results_made_from_another_sft_are_refused_not_reported(toy_run, tmp_path):
    """A workdir whose sft/ changed under its finished Warm-Up, PPO and SFT / PPO evaluations
    (a --config.reuse source made again: what a rerun seed sweep met) stops the job before it
    reports that PPO against the new SFT, and names each stale folder."""
    import subprocess
    import sys

    from conftest import TOY_RECIPE
    workdir = tmp_path / "swapped"
    shutil.copytree(toy_run, workdir, symlinks=True)
    marker = workdir / "sft" / "DONE"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "id": "another-sft"}))
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(root / "experiments" / "run.py"), "--config",
                           str(root / "configs" / "tiny_cpu.py"), "--workdir", str(workdir),
                           *TOY_RECIPE], cwd=root, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    for stale in ("warmup (made from another sft)", "ppo (made from another sft / warmup)",
                  "eval/sft (an evaluation of another sft)",
                  "eval/validation/sft (an evaluation of another sft)"):
        assert f"{workdir}/{stale}" in out, (stale, out[-2000:])
    assert "eval/ppo (" not in out  # PPO's own evaluations match the PPO the workdir holds
    # a job that neither skips nor reports them (SFT alone) still runs
    again = subprocess.run([sys.executable, str(root / "experiments" / "run.py"), "--config",
                            str(root / "configs" / "tiny_cpu.py"), "--workdir", str(workdir),
                            *TOY_RECIPE, "--config.phases=sft"], cwd=root, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]


def test_results_without_a_lineage_record_are_refused(toy_run, tmp_path):
    """A Warm-Up or PPO marker without the ids it was made from, or an SFT / PPO evaluation
    without FROM (what an older t1jax wrote), cannot be checked against the SFT the workdir
    holds: the job refuses to report it instead of trusting it."""
    import ml_collections

    from t1jax.jobs import UsageError
    from t1jax.jobs.recipe import PHASES, Recipe
    workdir = tmp_path / "old"
    shutil.copytree(toy_run, workdir, symlinks=True)
    config = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
    Recipe(config, workdir).check_lineage(PHASES)  # as made: nothing to refuse
    marker = workdir / "ppo" / "DONE"
    marker.write_text(json.dumps({k: v for k, v in json.loads(marker.read_text()).items()
                                  if k != "from"}))
    (workdir / "eval" / "validation" / "sft" / "FROM").unlink()
    with pytest.raises(UsageError) as refused:
        Recipe(config, workdir).check_lineage(PHASES)
    for folder in ("ppo", "eval/validation/sft"):
        assert f"{workdir}/{folder} (made by a t1jax that recorded no lineage" in \
            str(refused.value), folder
    Recipe(config, workdir).check_lineage(["sft"])  # a job that does not report them runs


def test_sft_data_a_killed_run_left_half_written_is_made_again(toy_run, tmp_path):
    """Killed while saving the SFT samples, a run leaves some of them and no COMPLETE marker:
    the rerun makes the whole set again instead of training on the part."""
    workdir = tmp_path / "partial"
    shutil.copytree(toy_run, workdir, symlinks=True)
    data = workdir / "sft" / "sft_data"
    names = sorted(p.name for p in data.glob("*.npz"))
    assert (data / "COMPLETE").is_file() and len(names) >= 2
    (workdir / "sft" / "DONE").unlink()
    (data / "COMPLETE").unlink()
    for path in sorted(data.glob("*.npz"))[len(names) // 2:]:
        path.unlink()
    run_toy_recipe(workdir, "tiny_cpu.py", "--config.phases=sft")
    assert sorted(p.name for p in data.glob("*.npz")) == names
    assert json.loads((data / "COMPLETE").read_text())["samples"] == len(names)


def test_reuse_compares_what_each_phase_was_made_with(tmp_path):
    """config.json is rewritten by every start of a workdir, a finished one too (a seed sweep
    rerun with other flags): reuse must compare with the config each phase was made with, as
    its DONE records it, or it links a phase made with other settings without a word."""
    from t1jax.jobs.recipe import _mark, link_reused
    made = {"seed": 0, "pool": {"n": 1}, "model": {"vocab_size": 8}, "agent": {},
            "oracle": {}, "verifier": {}, "sft": {"lr": 1e-3}}
    later = json.loads(json.dumps(made))
    later["sft"]["lr"] = 5e-3
    source = tmp_path / "source"
    for phase in ("pool", "oracle", "sft"):
        _mark(source / phase, config=made)
    (source / "tokenizer.json").write_text("{}")
    (source / "config.json").write_text(json.dumps(later))  # a later start's flags

    assert link_reused(source, tmp_path / "same", warmup=False, config=made) == [
        "pool", "tokenizer.json", "oracle", "sft"]
    assert link_reused(source, tmp_path / "other", warmup=False, config=later) == [
        "pool", "tokenizer.json", "oracle"]
    # a run made before phases recorded their config: config.json is all there is
    for phase in ("pool", "oracle", "sft"):
        (source / phase / "DONE").write_text("{}\n")
    assert link_reused(source, tmp_path / "old", warmup=False, config=later)[-1] == "sft"


def test_an_evaluation_whose_every_trial_is_an_infrastructure_error_is_refused(tmp_path):
    """An engine that crashes on every trial leaves each one an infra_error, excluded from the
    rates: none is left, and the recipe must stop rather than report an empty evaluation."""
    from t1jax.jobs.recipe import _played
    rows = [{"task_id": "t", "attempt": a, "error": "ValueError: Incompatible shapes"}
            for a in range(2)]
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"trials": 0, "failure_modes": {"infra_error": 2, "resolved": 0}}
    with pytest.raises(RuntimeError, match="every one of its 2 trials.*Incompatible shapes"):
        _played(summary, tmp_path)
    summary.update(trials=1, failure_modes={"infra_error": 1, "resolved": 1})
    assert _played(summary, tmp_path) is summary
