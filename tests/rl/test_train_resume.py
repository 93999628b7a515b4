"""Training survives being killed: the recipe's SFT and PPO on recorded rollouts
(config.sft.data_dir, config.rollouts.recorded_dir: no sandbox, CPU, fixed seeds), SIGKILLed
mid-PPO, resumes from its last finished checkpoint and ends bit-identical to an uninterrupted
run; metrics.jsonl keeps one row per step."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from t1jax.checkpoint import Checkpointer, finalized_steps
from t1jax.rollout.sample import Sample, save_samples

ROOT = Path(__file__).resolve().parents[2]
LAYERS, K, VOCAB = 2, 2, 512
SMALL = ["--config.model.num_hidden_layers=2", "--config.model.hidden_size=64",
         "--config.model.intermediate_size=128", "--config.model.moe_intermediate_size=32",
         "--config.model.num_attention_heads=4", "--config.model.num_experts=8",
         "--config.rl.max_length=128", "--config.rl.min_length=128"]

pytestmark = pytest.mark.slow


def record(directory: Path, steps: int = 2, per_step: int = 4) -> None:
    rng = np.random.default_rng(0)
    for step in range(steps):
        samples = []
        for i in range(per_step):
            n = int(rng.integers(40, 100))
            mask = np.zeros(n, np.int8)
            mask[n // 3:n // 2] = 1
            mask[2 * n // 3:] = 1
            routes = rng.integers(0, 8, (n, LAYERS, K))
            routes[:, 0], routes[-1] = -1, -1
            samples.append(Sample(tokens=rng.integers(0, VOCAB, n), loss_mask=mask,
                                  rollout_logprobs=-rng.random(n) * mask, routes=routes,
                                  reward=float(rng.random()),
                                  metadata={"task_id": f"t{i}", "attempt": step, "turns": 2}))
        save_samples(samples, directory / f"step_{step:05d}")


def recipe_args(workdir: Path, recorded: Path, steps: int) -> list[str]:
    """The recipe's SFT (2 steps on the first recorded step's samples) and PPO (`steps` steps
    replaying `recorded`), no Warm-Up, at SMALL size."""
    return ["--config", str(ROOT / "configs" / "tiny_cpu.py"), "--workdir", str(workdir),
            "--config.phases=sft,ppo", "--config.warmup.steps=0", "--config.sft.steps=2",
            f"--config.sft.data_dir={recorded / 'step_00000'}",
            f"--config.rollouts.recorded_dir={recorded}", f"--config.ppo.steps={steps}",
            *SMALL]


def launch(workdir: Path, recorded: Path, steps: int, *extra) -> subprocess.Popen:
    cmd = [sys.executable, str(ROOT / "experiments" / "run.py"),
           *recipe_args(workdir, recorded, steps), *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> None:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]


def final_params(workdir: Path):
    with Checkpointer.reader(workdir / "checkpoints") as ckpt:
        step = ckpt.latest_step()
        names = ckpt.saved_items(step)
        assert {"actor", "critic", "actor_opt", "critic_opt", "step"} <= set(names), names
        meta = ckpt.restore_meta(step)
    return step, meta


def leaves(workdir: Path) -> dict:
    """Every array of the final checkpoint, read as saved (numpy), onto this process's one
    device whatever mesh saved it (a 4-device checkpoint names shardings it cannot build)."""
    import orbax.checkpoint as ocp
    step = max(finalized_steps(workdir / "checkpoints"))
    out, device = {}, jax.sharding.SingleDeviceSharding(jax.devices()[0])
    for item in ("actor", "critic", "actor_opt", "critic_opt"):
        path = (workdir / "checkpoints" / str(step) / item).absolute()
        stored = ocp.StandardCheckpointHandler().metadata(path).tree
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device)
                              if hasattr(m, "shape") else m, stored)
        tree = ocp.StandardCheckpointer().restore(path, target)
        for key, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
            out[f"{item}{jax.tree_util.keystr(key)}"] = np.asarray(value)
    return out


def assert_same(a: Path, b: Path) -> None:
    la, lb = leaves(a), leaves(b)
    assert la.keys() == lb.keys()
    for key in la:
        np.testing.assert_array_equal(la[key], lb[key], err_msg=key)


def test_kill_and_resume_is_bit_exact(tmp_path):
    recorded = tmp_path / "rollouts"
    record(recorded)
    straight, killed = tmp_path / "straight", tmp_path / "killed"

    finish(launch(straight, recorded, 4))
    step, meta = final_params(straight / "ppo")
    assert step == 4 and meta["step"] == 4 and meta["config"]["rl"]["r3"] is True

    proc = launch(killed, recorded, 4)
    checkpoints = killed / "ppo" / "checkpoints"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if finalized_steps(checkpoints) if checkpoints.is_dir() else []:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    survived = finalized_steps(checkpoints)
    assert survived and max(survived) < 4, survived
    finish(launch(killed, recorded, 4))
    assert_same(straight / "ppo", killed / "ppo")
    assert_same(straight / "sft", killed / "sft")

    rows = [json.loads(line) for line in (killed / "ppo" / "metrics.jsonl").read_text()
            .splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert (killed / "ppo" / "tensorboard").is_dir()


def test_sft_trains_on_the_users_samples(tmp_path):
    """The recipe's sft phase with --config.sft.data_dir: the given samples, no pool, no
    sandbox; a folder without samples, or a recorded_dir without step folders, is refused
    before any phase runs, naming its key and folder."""
    recorded = tmp_path / "recorded"
    record(recorded, steps=1)

    def sft(workdir, *flags):
        return subprocess.run(
            [sys.executable, str(ROOT / "experiments" / "run.py"), "--config",
             str(ROOT / "configs" / "tiny_cpu.py"), "--workdir", str(workdir),
             "--config.phases=sft", "--config.sft.steps=2", *SMALL, *flags],
            cwd=ROOT, capture_output=True, text=True, timeout=300)

    proc = sft(tmp_path / "sft", f"--config.sft.data_dir={recorded / 'step_00000'}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert finalized_steps(tmp_path / "sft" / "sft" / "checkpoints")[-1] == 2
    assert not (tmp_path / "sft" / "pool").exists()
    (tmp_path / "empty").mkdir()
    proc = sft(tmp_path / "sft2", f"--config.sft.data_dir={tmp_path / 'empty'}")
    assert proc.returncode != 0 and f"config.sft.data_dir={tmp_path / 'empty'} holds no .npz" \
        in proc.stderr, proc.stderr[-2000:]
    proc = sft(tmp_path / "sft3", f"--config.rollouts.recorded_dir={tmp_path / 'empty'}")
    assert proc.returncode != 0 and "config.rollouts.recorded_dir=" in proc.stderr \
        and "holds no step_* folders" in proc.stderr, proc.stderr[-2000:]
