"""The Colab notebooks run end to end (nbclient, a real kernel) at small settings, and what they
print holds what their studies guarantee.

r3_tito_mismatch.ipynb: two episodes per rollout set of a random-init policy in real Docker
sandboxes. Asserted are consequences of how the study is built, not hoped-for effect sizes:
TITO never drifts and a TITO-less harness does once a turn's sampled ids are non-canonical (a
random policy's almost always are); R3 rows replay exactly the rollout's experts and score the
same trajectories as their R3-off twins; without replay the experts used are the router's own;
float32 rollout against float32 training differs only by rounding.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ("neither", "TITO only", "R3 only", "TITO + R3",
            "deterministic: float32 rollout, TITO + R3")


def execute(name: str, **params) -> nbformat.NotebookNode:
    """Run colabs/<name> with the parameters cell's assignments replaced by `params`."""
    nb = nbformat.read(ROOT / "colabs" / name, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    lines = cell.source.splitlines()
    for key, value in params.items():
        at = [i for i, line in enumerate(lines) if line.startswith(f"{key} = ")]
        assert len(at) == 1, f"parameter {key} not in the parameters cell"
        lines[at[0]] = f"{key} = {value!r}"
    cell.source = "\n".join(lines)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "colabs")}}).execute()
    return nb


def printed(nb, cell_id: str) -> str:
    cell = next(c for c in nb.cells if c.get("id") == cell_id)
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def parse_table(text: str) -> list[dict]:
    """mismatch_study.format_table's output: a header, a rule, then one row per setting."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("setting "))
    header = re.split(r"\s{2,}", lines[start])
    rows = []
    for line in lines[start + 2:]:
        if not line.strip():
            break
        row = dict(zip(header, re.split(r"\s{2,}", line), strict=True))
        rows.append({k: v if k in ("setting", "rollout_dtype", "tito", "r3") else float(v)
                     for k, v in row.items()})
    return rows


@pytest.mark.slow
def test_r3_tito_mismatch_notebook(docker_backend):
    nb = execute("r3_tito_mismatch.ipynb", EPISODES=2, SEED=0, SANDBOX="docker")
    rows = parse_table(printed(nb, "run"))
    assert [r["setting"] for r in rows] == list(SETTINGS)
    neither, tito, r3, both, det = rows
    for r in rows:
        for key in ("gap_mean", "gap_max", "routing_disagreement", "used_route_disagreement"):
            assert math.isfinite(r[key]) and r[key] >= 0, (r["setting"], key, r[key])
        assert r["gap_max"] >= r["gap_mean"] and r["trained_tokens"] > 0, r
    assert [(r["rollout_dtype"], r["tito"], r["r3"]) for r in rows] == [
        ("bfloat16", "False", "False"), ("bfloat16", "True", "False"),
        ("bfloat16", "False", "True"), ("bfloat16", "True", "True"),
        ("float32", "True", "True")]

    # TITO trains on the sampled ids; the text round-trip does not once they are non-canonical.
    assert tito["retokenized_drift"] == both["retokenized_drift"] == det["retokenized_drift"] == 0
    assert neither["noncanonical_turns"] > 0  # a random-init policy's ids are rarely BPE's own
    assert neither["retokenized_drift"] > 0
    # R3 changes only the training forward: each R3 row scores its R3-off twin's trajectories.
    for off, on in ((neither, r3), (tito, both)):
        for key in ("trained_tokens", "turns", "retokenized_drift", "noncanonical_turns"):
            assert off[key] == on[key], (off["setting"], on["setting"], key)
    # Replay: the forward used exactly the rollout's experts; without it, its router's own.
    assert both["used_route_disagreement"] == r3["used_route_disagreement"] == 0
    assert det["used_route_disagreement"] == 0
    assert neither["used_route_disagreement"] == neither["routing_disagreement"]
    assert tito["used_route_disagreement"] == tito["routing_disagreement"]
    # Equal precision, one model: only float32 rounding is left (the gap is a mean of
    # rounding-sized differences; a flipped expert would need a router tie within ~1e-8).
    assert det["gap_mean"] < 1e-5 and det["routing_disagreement"] == 0, det
    # ...while the bfloat16 rollout really ran in bfloat16 (8-bit mantissas move every logit).
    assert both["gap_mean"] > 10 * max(det["gap_mean"], 1e-7), (both, det)

    findings = printed(nb, "findings")
    assert "Deterministic (float32 rollout, TITO + R3)" in findings
    plot = next(c for c in nb.cells if c.get("id") == "plot")
    assert any("image/png" in o.get("data", {}) for o in plot.outputs)


def toy_flags():
    """Arms on the `toy_run` fixture: its pool and SFT length (so its pool and SFT actor are
    reused), 2 trials per PPO step, 1 attempt per task (PPO steps come from PPO_STEPS)."""
    from conftest import TOY_RECIPE
    return [*(f for f in TOY_RECIPE if f.startswith("--config.pool.")), "--config.sft.steps=3",
            "--config.rollouts.batch_size=2", "--config.eval.attempts=1"]


def arm_configs(out, *names) -> list[dict]:
    """Each arm's config.json without what differs between any two arms by construction."""
    configs = []
    for name in names:
        config = json.loads((out / name / "config.json").read_text())
        config.pop("ablation")
        configs.append(config)
    return configs


def whitespace_table(text: str, first_header: str) -> list[dict]:
    """A table printed as whitespace-separated columns whose header starts with `first_header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_header + " "))
    header = lines[start].split()
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows.append(dict(zip(header, line.split(), strict=True)))
    return rows


@pytest.mark.slow
def test_critic_warmup_notebook(toy_run, tmp_path):
    from t1jax.report import ablation
    nb = execute("critic_warmup.ipynb", BASE_RUN=str(toy_run), OUT=str(tmp_path), PPO_STEPS=2,
                 WARMUP_STEPS=[1], SEEDS=[0], SANDBOX="docker", OVERRIDES=toy_flags())
    text = printed(nb, "run")
    assert "base run" in text and "reused" in text  # the toy run was finished: not rebuilt
    rows = {r["arm"]: r for r in whitespace_table(text, "arm")}
    assert set(rows) == {"warm_1", "cold", "cold_random"}
    for arm in rows:
        logged = ablation.stage_metrics(tmp_path / f"{arm}_s0")
        assert [r["step"] for r in logged] == [1, 2]
        ev = [r["critic/explained_variance"] for r in logged]  # NaN: constant returns
        assert float(rows[arm]["ev_first"]) == pytest.approx(ev[0], abs=1e-3, nan_ok=True)
        assert int(rows[arm]["steps_ev_negative"]) == sum(e < 0 for e in ev)
        assert all(math.isnan(e) or e <= 1 for e in ev)
        assert all(math.isfinite(r["critic/value_loss"]) for r in logged)
    # the warm arm runs exactly its 1 warm-up step (no health stop: warmup.ev_window=0, so
    # not the base run's gated warm-up); cold arms have none
    warm_dir = tmp_path / "warm_1_s0" / "warmup"
    assert not warm_dir.is_symlink() and json.loads((warm_dir / "DONE").read_text())["steps"] == 1
    assert not (tmp_path / "cold_s0" / "warmup").exists()
    # the arms differ in the critic they start from and in nothing else
    warm, cold, rand = arm_configs(tmp_path, "warm_1_s0", "cold_s0", "cold_random_s0")
    assert (warm["warmup"].pop("steps"), cold["warmup"].pop("steps"),
            rand["warmup"].pop("steps")) == (1, 0, 0)
    assert (warm["warmup"].pop("ev_window"), cold["warmup"].pop("ev_window"),
            rand["warmup"].pop("ev_window")) == (0, 3, 3)
    assert (cold["rl"]["value_head_init"], rand["rl"].pop("value_head_init")) == ("zeros",
                                                                                 "uniform")
    cold["rl"].pop("value_head_init")
    warm["rl"].pop("value_head_init")
    assert warm == cold == rand
    first = {arm: ablation.stage_metrics(tmp_path / f"{arm}_s0")[0] for arm in rows}
    # a zero head predicts 0 everywhere at step 1; a uniform one does not
    assert first["cold"]["critic/values_mean"] == 0.0
    assert first["cold_random"]["critic/values_mean"] != 0.0
    # a finished arm is read back, not re-run
    assert ablation.run_arm(tmp_path / "cold_s0", "ablations.py:cold_critic", toy_run,
                            ppo_steps=2, overrides=["--config.sandbox.backend=docker",
                                                    *toy_flags()]) == 0.0


@pytest.mark.slow
def test_dense_vs_binary_notebook(toy_run, tmp_path):
    from t1jax.report import ablation
    nb = execute("dense_vs_binary.ipynb", BASE_RUN=str(toy_run), OUT=str(tmp_path), PPO_STEPS=2,
                 SEEDS=[0], SANDBOX="docker",
                 OVERRIDES=[*toy_flags(), "--config.warmup.steps=1"])  # reuse its warm-up
    text = printed(nb, "run")
    dense, binary = (tmp_path / f"{arm}_s0" for arm in ("dense", "binary"))
    # matched on every other axis: the configs differ in the reward alone
    d, b = arm_configs(tmp_path, "dense_s0", "binary_s0")
    assert (d["rl"].pop("reward"), b["rl"].pop("reward")) == ("dense", "binary")
    assert d == b
    for arm in (dense, binary):
        for name in ("sft", "warmup", "eval/sft", "pool"):
            assert (arm / name).resolve() == (toy_run / name).resolve(), name
    # binary trains on the outcome, dense on the dense reward; both log the dense reward
    for row in ablation.stage_metrics(binary):
        assert row["reward/trained_mean"] == pytest.approx(row["reward/resolved"])
    for row in ablation.stage_metrics(dense):
        assert row["reward/trained_mean"] == pytest.approx(row["reward/mean"])
    # the printed held-out rates and paired differences are those of the arms' trial records
    for arm, workdir in (("dense", dense), ("binary", binary)):
        line = next(line for line in text.splitlines() if line.startswith(f"{arm}, seed 0"))
        summary = ablation.heldout_summary(workdir)
        assert float(line.split()[3]) == pytest.approx(summary["resolved_rate"], abs=1e-3)
        assert summary["trials"] == len(ablation.heldout_trials(workdir)) > 0
    want, _, n = ablation.paired_by_task(ablation.heldout_trials(dense),
                                         ablation.heldout_trials(binary), "resolved")
    got = re.search(r"seed 0  resolved\s+([+-][\d.]+) \+- ([\d.]+)\s+\((\d+) tasks\)", text)
    assert got and float(got[1]) == pytest.approx(want, abs=1e-3) and int(got[3]) == n
    assert n == json.loads((toy_run / "pool" / "DONE").read_text())["heldout"]
    assert "paired difference" in printed(nb, "findings")
