"""One job over several processes, as on a pod: 2 processes x 2 CPU devices on 127.0.0.1
(experiments/launch_local.py, JAX's coordinator and gloo collectives) train SFT and then PPO
from recorded rollouts on a data=2 x fsdp=2 mesh, and end where 1 process with the same 4
devices ends (to float tolerance: the two compile different programs, collectives across
processes instead of within one); metrics are written once; a process SIGKILLed mid-PPO ends
the job on the other at once, and a restart of both resumes and ends where the uninterrupted
run ends. Live PPO with each process playing its share of the trials equals one process.
What is not split yet (oversampling, the recipe, the fleet) is refused (issue #43)."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from test_train_resume import ROOT, SMALL, leaves, record

pytestmark = pytest.mark.slow

MESH = ["--config.mesh.data=2", "--config.mesh.fsdp=2"]
# measured on an AVX-512 EPYC, 2 processes vs 1: parameters after 2 SFT steps differ by 2.9e-8
# relative at most, after 4 PPO steps by 3.4e-5 (Adam's first steps magnify float noise); the
# resumed run equalled the uninterrupted one bit for bit
RTOL, ATOL = 1e-4, 1e-6


def _launcher():
    spec = importlib.util.spec_from_file_location("launch_local",
                                                  ROOT / "experiments" / "launch_local.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_process(args, devices=4, timeout=600):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COORDINATOR")}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def two_processes(args, env_of=None) -> int:
    return _launcher().launch(list(args), 2, 2, env_of=env_of)


def sft_args(workdir, data):
    return ["--config", f"{ROOT / 'configs' / 'ppo.py'}:sft", "--workdir", str(workdir),
            f"--config.sft.data_dir={data}", "--config.steps=2", *SMALL, *MESH]


def ppo_args(workdir, recorded, sft, steps):
    return ["--config", str(ROOT / "configs" / "ppo.py"), "--workdir", str(workdir),
            "--config.rollouts.source=recorded", f"--config.rollouts.recorded_dir={recorded}",
            f"--config.init.actor={sft / 'checkpoints'}", f"--config.steps={steps}",
            "--config.checkpoint.every=2", *SMALL, *MESH]


def assert_close(a: Path, b: Path) -> float:
    la, lb = leaves(a), leaves(b)
    assert la.keys() == lb.keys()
    worst = 0.0
    for key in la:
        np.testing.assert_allclose(la[key], lb[key], rtol=RTOL, atol=ATOL, err_msg=key)
        scale = np.maximum(np.abs(lb[key]), 1e-3)
        worst = max(worst, float(np.max(np.abs(la[key] - lb[key]) / scale, initial=0.0)))
    return worst


def steps_written(workdir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in
            (workdir / "metrics.jsonl").read_text().splitlines()]


def test_two_processes_train_like_one(tmp_path):
    recorded = tmp_path / "rollouts"
    record(recorded, steps=4)
    one, two = tmp_path / "one", tmp_path / "two"
    one_process(sft_args(one / "sft", recorded / "step_00000"))
    one_process(ppo_args(one / "ppo", recorded, one / "sft", 4))
    assert two_processes(sft_args(two / "sft", recorded / "step_00000")) == 0
    assert two_processes(ppo_args(two / "ppo", recorded, two / "sft", 4)) == 0
    for stage, steps in (("sft", 2), ("ppo", 4)):
        worst = assert_close(two / stage, one / stage)
        print(f"{stage}: largest relative difference, 2 processes vs 1: {worst:.2e}")
        assert steps_written(two / stage) == list(range(1, steps + 1)), \
            "metrics must be written once per step"
    rows = [[json.loads(line) for line in (d / "ppo" / "metrics.jsonl").read_text()
             .splitlines()] for d in (one, two)]
    assert len(rows[0]) == len(rows[1]) == 4
    for a, b in zip(*rows):
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/value_loss",
                    "critic/explained_variance", "mismatch/logprob_gap"):
            np.testing.assert_allclose(b[key], a[key], rtol=RTOL, atol=1e-7, err_msg=key)

    # SIGKILL process 1 when it holds step 3's rollouts (step 2 checkpointed): the job ends at
    # once, not when a collective times out; both restarted resume and end where 4 steps end
    straight, killed = two / "ppo", tmp_path / "killed"
    t0 = time.monotonic()
    code = two_processes(ppo_args(killed, recorded, two / "sft", 4),
                         env_of={1: {"T1JAX_KILL_AT": "ppo:3:collected"}})
    assert code == 128 + 9, code
    assert time.monotonic() - t0 < 300
    assert two_processes(ppo_args(killed, recorded, two / "sft", 4)) == 0
    assert_close(killed, straight)
    assert steps_written(killed) == [1, 2, 3, 4]


LIVE = ["--config.rl.max_length=2048", "--config.rl.min_length=2048",
        "--config.rollouts.task_filter=count-log-errors,organize-files",
        "--config.rollouts.batch_size=4", "--config.rollouts.max_turns=2",
        "--config.rollouts.max_new_tokens=24", "--config.steps=2"]


def test_live_rollouts_split_across_processes_equal_one_process(docker_backend, tmp_path):
    """Each process plays every other trial of the step in its own sandboxes (named by
    process) from its own copy of the policy, and all receive everyone's samples: the same
    trials (task, attempt), tokens and rewards as one process, and parameters that agree.
    Trials' random numbers are a function of (seed, task, attempt, turn), not of who runs
    them. Measured: tokens equal, rollout log-probs within 1e-6."""
    from t1jax.rollout.sample import load_samples
    args = ["--config", str(ROOT / "configs" / "ppo.py"), *SMALL[:-2], *LIVE, *MESH,
            "--config.rollouts.oversample=1.0"]
    one, two = tmp_path / "one", tmp_path / "two"
    one_process([*args, "--workdir", str(one)])
    assert two_processes([*args, "--workdir", str(two)]) == 0
    for step in range(2):
        a, b = (load_samples(d / "rollouts" / f"step_{step:05d}") for d in (one, two))
        assert len(a) == len(b) == 4
        # each process played every other trial, not the whole step
        # (the step's requests are attempts 4 * step .. 4 * step + 3, in order)
        assert [y.metadata["process"] for y in b] == [y.metadata["attempt"] % 2 for y in b]
        assert sorted(y.metadata["process"] for y in b) == [0, 0, 1, 1]
        assert all("process" not in x.metadata for x in a)
        for x, y in zip(a, b):
            assert (x.metadata["task_id"], x.metadata["attempt"], x.reward) == \
                (y.metadata["task_id"], y.metadata["attempt"], y.reward)
            np.testing.assert_array_equal(x.tokens, y.tokens)
            np.testing.assert_allclose(x.rollout_logprobs, y.rollout_logprobs, atol=1e-5)
    assert_close(two, one)
    assert steps_written(two) == [1, 2]
    from t1jax.sandbox.base import LABEL_RUN
    runs = {f"train-{two.name}-p{i}" for i in range(2)}
    leftover = [c.name for c in docker_backend.client.containers.list(all=True, sparse=True)
                if (c.attrs.get("Labels") or {}).get(LABEL_RUN) in runs]
    assert not leftover, leftover  # each process reaps its own sandboxes


def test_what_does_not_run_across_processes_is_refused(tmp_path, capsys):
    """Admission by finishing order (oversampling) would differ between processes, and the
    recipe's phases are not split yet: refused, naming what runs instead."""
    code = two_processes(["--config", str(ROOT / "configs" / "ppo.py"), "--workdir",
                          str(tmp_path / "live"), *SMALL, *MESH, "--config.steps=1"])
    out = capsys.readouterr().out
    assert code != 0 and "oversample=1" in out and "issue #43" in out, out[-2000:]
    code = two_processes(["--config", str(ROOT / "configs" / "tiny_cpu.py"), "--workdir",
                          str(tmp_path / "recipe")])
    out = capsys.readouterr().out
    assert code != 0 and "mode 'recipe' runs as one process" in out, out[-2000:]
    assert not (tmp_path / "live" / "checkpoints").exists()
