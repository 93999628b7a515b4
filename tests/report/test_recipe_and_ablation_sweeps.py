"""experiments/recipe_seed_sweep.py and experiments/ablation_sweep.py on written workdirs (no
training): the stratified pooling of t1jax.report.paired.pooled_over_strata against hand
computations, each sweep's summary, and the command lines each would launch."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
from experiments import ablation_sweep, recipe_seed_sweep  # noqa: E402

from t1jax.report.paired import paired_difference, pooled_over_strata  # noqa: E402


# -- pooling ----------------------------------------------------------------------------------

def test_pooled_over_strata_weighs_each_stratum_equally():
    d1, d2 = [1.0, 0.0, 0.5, 0.5], [0.0, 0.0, 1.0]  # means 1/2 and 1/3
    got = pooled_over_strata([d1, {"b1": 0.0, "b2": 0.0, "b3": 1.0}])  # a list or a dict
    assert (got["strata"], got["tasks"]) == (2, 7)
    assert got["mean"] == pytest.approx(5 / 12)  # not 3/7, the mean of all 7 tasks
    # sample variances 1/6 over 4 tasks and 1/3 over 3: SE = sqrt(1/24 + 1/9) / 2
    assert got["se"] == pytest.approx(math.sqrt(1 / 24 + 1 / 9) / 2)
    assert got["seed_se"] == pytest.approx(1 / 12)  # sd of (1/2, 1/3) over sqrt(2)
    assert got["low"] <= got["mean"] <= got["high"]
    # the bootstrap draws each stratum from its own tasks: never beyond their extremes' mean
    assert got["low"] >= (0 + 0) / 2 and got["high"] <= (1 + 1) / 2


def test_stratified_bootstrap_matches_the_normal_interval():
    rng = np.random.default_rng(1)
    strata = [rng.normal(mu, 0.4, n) for mu, n in ((0.1, 40), (0.0, 48), (0.2, 36))]
    got = pooled_over_strata(strata)
    assert got["mean"] == pytest.approx(np.mean([s.mean() for s in strata]))
    assert got["se"] == pytest.approx(
        math.sqrt(sum(s.var(ddof=1) / len(s) for s in strata)) / 3)
    assert got["low"] < got["mean"] < got["high"]
    width, normal = got["high"] - got["low"], 2 * 1.96 * got["se"]
    assert 0.85 * normal < width < 1.15 * normal
    # the midpoint sits near the mean (a symmetric sampling distribution)
    assert abs((got["low"] + got["high"]) / 2 - got["mean"]) < 0.1 * normal


def test_one_stratum_is_the_paired_difference():
    before = [{"task_id": f"t{i}", "resolved": bool(i % 2)} for i in range(6)]
    after = [{"task_id": f"t{i}", "resolved": i > 1} for i in range(6)]
    from t1jax.report.paired import task_differences
    one = pooled_over_strata([task_differences(before, after)])
    ref = paired_difference(before, after)
    assert {k: one[k] for k in ref} == pytest.approx(ref)


def test_small_and_empty_strata():
    assert math.isnan(pooled_over_strata([])["mean"])
    got = pooled_over_strata([[0.5], [], [0.0, 1.0]])  # the empty one left out
    assert got["strata"] == 2 and got["mean"] == pytest.approx(0.5)
    assert math.isnan(got["se"]) and math.isnan(got["low"])


# -- synthetic workdirs -----------------------------------------------------------------------

def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_eval(workdir: Path, label: str, resolved: dict[str, list[int]],
               split: str = "test") -> None:
    folder = workdir / "eval" / label if split == "test" else workdir / "eval" / split / label
    write_jsonl(folder / "trials.jsonl", [
        {"task_id": t, "attempt": a, "status": "done", "resolved": bool(r),
         "reward": 0.25 + 0.75 * r} for t, rs in resolved.items() for a, r in enumerate(rs)])


def write_metrics(workdir: Path, stage: str, rows: list[dict]) -> None:
    write_jsonl(workdir / stage / "metrics.jsonl",
                [{"step": i + 1, **r} for i, r in enumerate(rows)])


def main_run(workdir: Path, seed: int, prefix: str, sft: list[int], ppo: list[int]) -> Path:
    """A finished main run: one attempt per task, tasks named by the seed (own split)."""
    (workdir / "pool").mkdir(parents=True)
    (workdir / "sft").mkdir()
    (workdir / "sft" / "DONE").write_text("{}\n")
    (workdir / "config.json").write_text(json.dumps({"seed": seed, "warmup": {"steps": 3}}))
    write_eval(workdir, "sft", {f"{prefix}{i}": [v] for i, v in enumerate(sft)})
    write_eval(workdir, "ppo", {f"{prefix}{i}": [v] for i, v in enumerate(ppo)})
    write_eval(workdir, "sft", {f"v{prefix}0": [0], f"v{prefix}1": [0]}, "validation")
    write_eval(workdir, "ppo", {f"v{prefix}0": [1], f"v{prefix}1": [0]}, "validation")
    write_metrics(workdir, "warmup", [{"critic/explained_variance": v} for v in (-1, 0.1, 0.3)])
    write_metrics(workdir, "ppo", [
        {"critic/explained_variance": 0.35, "actor/clip_frac": 0.0,
         "actor/clip_frac_after_first": 0.2},
        {"critic/explained_variance": 0.45, "actor/clip_frac": 0.1,
         "actor/clip_frac_after_first": 0.4}])
    return workdir


@pytest.fixture
def mains(tmp_path):
    """Seed 0 (tasks a0..a3; PPO - SFT per task 1, 0, 0, 1) and seed 1 (b0..b2; 0, -1, 1)."""
    return {0: main_run(tmp_path / "tiny_cpu", 0, "a", [0, 1, 0, 0], [1, 1, 0, 1]),
            1: main_run(tmp_path / "recipe_seeds" / "seed_1", 1, "b", [1, 1, 0], [1, 0, 1])}


def test_recipe_summary_pools_the_seeds_by_seed(mains, tmp_path, capsys):
    out = tmp_path / "recipe_seeds"
    rc = recipe_seed_sweep.main(["--seeds", "1,2", "--existing", f"0={mains[0]}",
                                 "--out", str(out), "--summary-only"])
    assert rc == 0
    text = (out / "summary.md").read_text()
    assert text in capsys.readouterr().out
    # seed 0: +50 pts over 4 tasks; seed 1: 0 over 3 tasks; pooled by seed: +25 pts
    assert "| 0 | 4 | 25.0% | 75.0% | +50.0 pts (SE 28.9;" in text
    assert "| 1 | 3 | 66.7% | 66.7% | +0.0 pts (SE 57.7;" in text
    assert "| 2 | not finished" in text
    se = math.sqrt((1 / 3) / 4 + 1 / 3) / 2  # seed sds: 1/sqrt(3) over 4, 1 over 3
    assert f"| pooled (2 seeds) | 7 | 45.8% | 70.8% | +25.0 pts (SE {100 * se:.1f};" in text
    data = json.loads((out / "summary.json").read_text())
    assert data["pooled"]["test"]["resolved"]["mean"] == pytest.approx(0.25)
    assert data["pooled"]["test"]["reward"]["mean"] == pytest.approx(0.75 * 0.25)
    assert data["pooled"]["test"]["resolved"]["se"] == pytest.approx(se)
    assert data["seeds"]["0"]["test"]["resolved"]["tasks"] == 4
    # validation: +50 pts in both; the training readings from ppo/metrics.jsonl
    assert data["pooled"]["validation"]["resolved"]["mean"] == pytest.approx(0.5)
    assert data["seeds"]["1"]["ev_start"] == 0.35
    assert data["seeds"]["1"]["clip_frac"] == pytest.approx(0.3)  # after the first update
    assert "| 0 | +50.0 pts (SE 50.0; +0.0 .. +100.0) | +0.375 (SE 0.375;" in text
    assert "| 0.350 | 0.300 |" in text
    assert json.loads((out / "runs.json").read_text()) == {
        "0": str(mains[0]), "1": str(out / "seed_1"), "2": str(out / "seed_2")}


def test_recipe_clip_fraction_falls_back_to_every_update(tmp_path):
    write_metrics(tmp_path, "ppo", [{"actor/clip_frac": 0.1}, {"actor/clip_frac": 0.3}])
    got = recipe_seed_sweep.training(tmp_path)
    assert got["clip_frac"] == pytest.approx(0.2) and got["clip_key"] == "actor/clip_frac"
    assert got["ev_start"] is None
    assert recipe_seed_sweep.training(tmp_path / "absent")["clip_frac"] is None


def test_recipe_commands(tmp_path, capsys):
    out = tmp_path / "sweep"
    runs = recipe_seed_sweep.plan([2, 1], out, {0: tmp_path / "main"}, "configs/tiny_cpu.py",
                                  ["--config.ppo.steps=4"])
    assert list(runs) == [0, 1, 2]
    assert runs[0] == (tmp_path / "main", None)  # an existing run is read, never rerun
    assert runs[2] == (out / "seed_2", [
        sys.executable, str(ROOT / "experiments" / "run.py"), "--config", "configs/tiny_cpu.py",
        "--workdir", str(out / "seed_2"), "--config.seed=2", "--config.ppo.steps=4"])
    assert recipe_seed_sweep.parse_existing(["0=a,3=b", "4=c"]) == {
        0: Path("a").resolve(), 3: Path("b").resolve(), 4: Path("c").resolve()}
    with pytest.raises(ValueError):
        recipe_seed_sweep.parse_existing(["runs/tiny_cpu"])
    assert recipe_seed_sweep.main(["--seeds", "1", "--out", str(out), "--dry-run",
                                   "--", "--config.sft.steps=10"]) == 0
    assert capsys.readouterr().out.strip().endswith("--config.seed=1 --config.sft.steps=10")
    assert not out.exists()  # a dry run writes nothing


def test_recipe_refuses_an_existing_run_of_another_seed(mains, tmp_path):
    with pytest.raises(SystemExit):
        recipe_seed_sweep.main(["--existing", f"0={mains[1]}", "--seeds", "0",
                                "--out", str(tmp_path / "o"), "--summary-only"])


# -- the ablation sweep -----------------------------------------------------------------------

def arm_run(workdir: Path, main: Path, ppo: dict[str, list[int]], *, cold: bool = False) -> None:
    """An arm's workdir as --config.reuse leaves it: pool, SFT, its evaluation (and the warm-up,
    unless cold) linked from the main run; its own PPO and PPO evaluation."""
    workdir.mkdir(parents=True)
    for name in ["pool", "sft", "eval/sft"] + ([] if cold else ["warmup"]):
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).symlink_to(main / name, target_is_directory=True)
    (workdir / "config.json").write_text(json.dumps({"warmup": {"steps": 0 if cold else 3}}))
    write_eval(workdir, "ppo", ppo)
    write_metrics(workdir, "ppo", [{"critic/explained_variance": v, "actor/clip_frac": 0.1}
                                   for v in ((-2.0, -0.5) if cold else (0.3, 0.5))])


def test_ablation_summary_pairs_each_arm_with_its_seeds_main_run(mains, tmp_path, capsys):
    out = tmp_path / "ablations"
    # binary_reward: per task vs main PPO, seed 0: -1, 0, 0, -1 (-50 pts), seed 1: 0, 0, -1
    arm_run(out / "binary_reward" / "seed_0", mains[0], {"a0": [0], "a1": [1], "a2": [0],
                                                         "a3": [0]})
    arm_run(out / "binary_reward" / "seed_1", mains[1], {"b0": [1], "b1": [0], "b2": [0]})
    arm_run(out / "cold_critic" / "seed_0", mains[0], {"a0": [1], "a1": [1], "a2": [1],
                                                       "a3": [1]}, cold=True)
    rc = ablation_sweep.main(["--arms", "binary_reward,cold_critic", "--seeds", "1",
                              "--base", str(tmp_path / "recipe_seeds"),
                              "--existing", f"0={mains[0]}", "--out", str(out),
                              "--summary-only"])
    assert rc == 0
    text = (out / "summary.md").read_text()
    assert text in capsys.readouterr().out
    seed_means = (-0.5, -1 / 3)  # binary_reward - main PPO
    data = json.loads((out / "summary.json").read_text())
    binary = data["pooled"]["binary_reward"]
    assert binary["vs_main"]["resolved"]["mean"] == pytest.approx(np.mean(seed_means))
    assert binary["vs_main"]["resolved"]["se"] == pytest.approx(
        math.sqrt((1 / 3) / 4 + (1 / 3) / 3) / 2)
    # arm PPO - SFT: seed 0 (0, 0, 0, 0), seed 1 (0, -1, 0)
    assert binary["vs_sft"]["resolved"]["mean"] == pytest.approx((0 - 1 / 3) / 2)
    assert data["pooled"]["main"]["vs_sft"]["resolved"]["mean"] == pytest.approx(0.25)
    assert data["pooled"]["cold_critic"]["vs_main"]["resolved"]["strata"] == 1
    assert "| binary_reward | 2 | -41.7 pts" in text
    assert "| 1 | not finished" in text.split("## cold_critic")[1]
    assert "| 0 | 4 | 75.0% | 100.0% | +25.0 pts (SE 25.0;" in text  # cold_critic, seed 0
    assert data["arms"]["cold_critic"]["0"]["ev_start"] == -2.0
    assert (out / "ev_curves.png").stat().st_size > 1000 and "ev_curves.png" in text


def test_ablation_leaves_out_a_run_on_another_split(mains, tmp_path):
    out = tmp_path / "ablations"
    arm_run(out / "zero_reward" / "seed_0", mains[0], {"a0": [0], "a1": [0]})
    (out / "zero_reward" / "seed_0" / "pool").unlink()
    (out / "zero_reward" / "seed_0" / "pool").mkdir()  # its own pool: not paired with main
    text, data = ablation_sweep.summarize(["zero_reward"], {0: mains[0]}, out)
    assert data["pooled"]["zero_reward"]["vs_main"] is None
    assert "not the main run's pool" in text


def test_ev_curves_put_warm_up_before_ppo_step_one(mains, tmp_path):
    assert ablation_sweep.ev_curve(mains[0]) == {-2: -1, -1: 0.1, 0: 0.3, 1: 0.35, 2: 0.45}
    cold = tmp_path / "cold"
    arm_run(cold, mains[0], {"a0": [1]}, cold=True)
    (cold / "warmup").symlink_to(mains[0] / "warmup")  # even if a warm-up were linked
    assert ablation_sweep.ev_curve(cold) == {1: -2.0, 2: -0.5}
    xs, mean, low, high = ablation_sweep.band([{0: 1.0, 1: 2.0}, {1: 4.0, 2: math.nan}])
    assert xs == [0, 1, 2] and mean[:2] == [1.0, 3.0] and (low[1], high[1]) == (2.0, 4.0)
    assert math.isnan(mean[2])
    assert ablation_sweep.ev_plot({"x": [tmp_path / "absent"]}, tmp_path / "p.png") is None


def test_ablation_commands(mains, tmp_path, capsys):
    base = tmp_path / "recipe_seeds"
    (base / "runs.json").write_text(json.dumps({"0": str(mains[0]), "1": str(mains[1])}))
    got = ablation_sweep.main_workdirs(base, [1, 2], {})
    assert got == {1: mains[1], 2: base / "seed_2"}  # runs.json, then BASE/seed_<s>
    assert ablation_sweep.main_workdirs(base, [0], {0: tmp_path / "other"}) == {
        0: tmp_path / "other"}
    out = tmp_path / "abl"
    runs = ablation_sweep.plan(["zero_reward", "cold_critic"], {1: mains[1], 0: mains[0]}, out,
                               ["--config.ppo.steps=4"])
    assert [(arm, s) for arm, s, _, _ in runs] == [
        ("zero_reward", 0), ("cold_critic", 0), ("zero_reward", 1), ("cold_critic", 1)]
    assert runs[3][2:] == (out / "cold_critic" / "seed_1", [
        sys.executable, str(ROOT / "experiments" / "run.py"),
        "--config", f"{ROOT / 'configs' / 'ablations.py'}:cold_critic",
        "--workdir", str(out / "cold_critic" / "seed_1"), "--config.seed=1",
        f"--config.reuse={mains[1]}", "--config.ppo.steps=4"])
    assert ablation_sweep.main(["--arms", "binary_reward", "--seeds", "0,1", "--base",
                                str(base), "--out", str(out), "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].endswith(f"--config.seed=0 --config.reuse={mains[0]}")
    with pytest.raises(SystemExit):
        ablation_sweep.main(["--arms", "binary_reward,not_a_variant", "--dry-run"])
