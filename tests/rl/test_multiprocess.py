"""One job over several processes, as on a pod: 2 processes x 2 CPU devices on 127.0.0.1
(experiments/launch_local.py, JAX's coordinator and gloo collectives) run the recipe's SFT
and then PPO from recorded rollouts on a data=2 x fsdp=2 mesh, and end where 1 process with
the same 4 devices ends (to float tolerance: the two compile different programs, collectives across
processes instead of within one); metrics are written once; a process SIGKILLed mid-PPO ends
the job on the other at once, and a restart of both resumes and ends where the uninterrupted
run ends. The main job (the recipe, live rollouts split between the processes) as 2 processes
equals it as 1; a sharded HF export from 2 processes equals 1 process's; live PPO through a
server fleet runs from 2 processes; oversampled admission one step off-policy is decided once
over both. What is not split yet (the eval, oracle and pool jobs) is refused (issue #43)."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from test_train_resume import ROOT, SMALL, leaves, recipe_args, record

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


def train_args(workdir, recorded, steps):
    """The recipe's SFT and PPO (recorded rollouts, no Warm-Up) over the data=2 x fsdp=2
    mesh, a checkpoint every 2 PPO steps."""
    return [*recipe_args(workdir, recorded, steps), "--config.checkpoint.every=2", *MESH]


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
    one_process(train_args(one, recorded, 4))
    assert two_processes(train_args(two, recorded, 4)) == 0
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

    # SIGKILL process 1 when it holds PPO step 3's rollouts (step 2 checkpointed): the job
    # ends at once, not when a collective times out; both restarted resume PPO (SFT is done)
    # and end where 4 steps end
    straight, killed = two / "ppo", tmp_path / "killed"
    shutil.copytree(two / "sft", killed / "sft")  # SFT is done: the restart resumes PPO alone
    t0 = time.monotonic()
    code = two_processes(train_args(killed, recorded, 4),
                         env_of={1: {"T1JAX_KILL_AT": "ppo:3:collected"}})
    assert code == 128 + 9, code
    assert time.monotonic() - t0 < 300
    assert (killed / "sft" / "DONE").is_file() and not (killed / "ppo" / "DONE").exists()
    assert two_processes(train_args(killed, recorded, 4)) == 0
    assert_close(killed / "ppo", straight)
    assert steps_written(killed / "ppo") == [1, 2, 3, 4]


def live_args(toy_run, workdir, *extra):
    """The recipe's live PPO on toy_run's pool and tokenizer (an outside pool, as the
    real-scale configs run), SFT 1 step on toy_run's SFT data, no Warm-Up and no periodic
    evaluation, at SMALL size but the tiny model's 4 layers (the SFT data's routes hold 4) and
    rows of the recipe's 384 tokens."""
    return ["--config", str(ROOT / "configs" / "tiny_cpu.py"), "--workdir", str(workdir),
            *[flag for flag in SMALL[:-2] if "num_hidden_layers" not in flag],
            "--config.phases=pool,sft,ppo",
            f"--config.pool.dir={toy_run / 'pool'}", "--config.pool.decontaminate=False",
            f"--config.rollouts.tokenizer={toy_run / 'tokenizer.json'}",
            f"--config.sft.data_dir={toy_run / 'sft' / 'sft_data'}", "--config.sft.steps=1",
            "--config.warmup.steps=0", "--config.eval.every=0",
            "--config.rollouts.batch_size=2", "--config.rollouts.max_turns=2",
            "--config.rollouts.max_new_tokens=24", "--config.mesh.data=2", *extra]


def _trials(folder: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (folder / "trials.jsonl").read_text().splitlines()]
    return sorted((r["task_id"], r["attempt"], r["reward"], r["failure_mode"], r["turns"],
                   r["sampled_tokens"]) for r in rows)


def test_the_main_job_as_two_processes_equals_one(toy_run, docker_backend, tmp_path):
    """The recipe at toy size (conftest's toy_run: every phase) as 2 processes x 1 device over
    a data=2 mesh, against the same job as 1 process. Exactly equal: what process 0 writes
    before training (pool, tokenizer, SFT data) and the untrained policy's evaluation. To float
    tolerance: training (another mesh sums in another order), and so the trained policies'
    samples, which a float-level difference may flip (measured on an AVX-512 EPYC: the
    Warm-Up, PPO and SFT-evaluation trials token-identical, one of the four PPO-evaluation
    trials not). Each process plays every other live trial and every other evaluation trial
    from its own copy of the policy, which the trainer's recomputed log-probs match;
    everything is written once."""
    from conftest import TOY_RECIPE
    one, two = toy_run, tmp_path / "recipe_2proc"
    args = ["--config", str(ROOT / "configs" / "tiny_cpu.py"), "--workdir", str(two),
            *TOY_RECIPE, "--config.mesh.data=2"]
    # under pytest-timeout's 600 s, so a hang prints where each process waits (seen once on
    # CI, 2026-12-07: the job stopped after the base evaluation; cause not yet known)
    assert _launcher().launch(args, 2, 1, timeout_s=480) == 0
    assert_same_main_job(one, two, docker_backend)


def assert_same_main_job(one: Path, two: Path, docker_backend) -> None:
    from t1jax.rollout.sample import load_samples
    from t1jax.sandbox.base import LABEL_RUN
    for name in ("pool/split.json", "tokenizer.json"):
        assert (two / name).read_bytes() == (one / name).read_bytes(), name
    a, b = (load_samples(d / "sft" / "sft_data") for d in (one, two))
    assert len(a) == len(b)
    for x, y in zip(a, b):  # (their verifier records hold wall times)
        assert (x.metadata["task_id"], x.metadata["attempt"], x.reward) == \
            (y.metadata["task_id"], y.metadata["attempt"], y.reward)
        np.testing.assert_array_equal(x.tokens, y.tokens)
    phases = [json.loads(line)["phase"] for line in
              (two / "timings.jsonl").read_text().splitlines()]
    assert phases == ["pool", "oracle", "sft", "warmup", "ppo", "eval"]  # written once each
    for stage, steps in (("sft", 3), ("warmup", 1), ("ppo", 1)):
        assert steps_written(two / stage) == list(range(1, steps + 1)), stage
    for stage in ("warmup", "ppo"):
        a, b = (load_samples(d / stage / "rollouts" / "step_00000") for d in (one, two))
        assert [(x.metadata["task_id"], x.metadata["attempt"]) for x in a] == \
            [(y.metadata["task_id"], y.metadata["attempt"]) for y in b], stage
        # each process played every other trial (the step's requests are attempts 0 and 1)
        assert [y.metadata["process"] for y in b] == [y.metadata["attempt"] % 2 for y in b]
        assert sorted(y.metadata["process"] for y in b) == [0, 1]
        for x, y in zip(a, b):  # from the same policy (a sample a float flip changed aside)
            if np.array_equal(x.tokens, y.tokens):
                np.testing.assert_allclose(y.rollout_logprobs, x.rollout_logprobs, atol=1e-4)
    # PPO trained on them: the trainer's log-probs are the rollouts'
    row = json.loads((two / "ppo" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["mismatch/logprob_gap_max"] < 1e-4, row["mismatch/logprob_gap_max"]
    assert _trials(two / "eval" / "base") == _trials(one / "eval" / "base")
    # every evaluation's trials split between the processes: every other (task, attempt)
    rows = [json.loads(line) for line in (two / "eval" / "base" / "trials.jsonl").read_text()
            .splitlines()]
    assert [r["process"] for r in rows] == [i % 2 for i in range(len(rows))]
    for folder in ("sft", "ppo", "validation/sft", "validation/ppo"):
        got, want = _trials(two / "eval" / folder), _trials(one / "eval" / folder)
        assert [t[:2] for t in got] == [t[:2] for t in want], folder
        assert "infra_error" not in {t[3] for t in got}, got
    # Adam's first steps at the recipe's SFT rate (3e-3) move weights whose gradients are
    # ~0 by +-lr whatever their sign: elementwise tolerances do not hold, each leaf's norm
    # does (measured on an AVX-512 EPYC: 1.3e-4 after SFT, 5.7e-4 after PPO, relative)
    for stage in ("sft", "ppo"):
        la, lb = leaves(two / stage), leaves(one / stage)
        for key in [k for k in la if k.startswith(("actor[", "critic["))]:
            gap = np.linalg.norm(la[key] - lb[key]) / max(np.linalg.norm(lb[key]), 1e-12)
            assert gap < 1e-2, (stage, key, gap)
    rows = [[json.loads(line) for line in (d / "sft" / "metrics.jsonl").read_text()
             .splitlines()] for d in (one, two)]
    for a, b in zip(*rows):
        np.testing.assert_allclose(b["sft/nll"], a["sft/nll"], rtol=1e-5)
    assert "## Validation split" in (two / "report" / "summary.md").read_text()
    leftover = [c.name for c in docker_backend.client.containers.list(all=True, sparse=True)
                if two.name in ((c.attrs.get("Labels") or {}).get(LABEL_RUN) or "")]
    assert not leftover, leftover  # each process reaps its own sandboxes


def test_oversampled_admission_one_step_off_across_processes(toy_run, docker_backend,
                                                            tmp_path):
    """Live PPO as 2 processes x 1 device as T1 runs it, one step off-policy with
    rollouts.oversample=2 and carry-over: each step launches 4 trials over both processes
    (from a thread, beside the trainer's step and its collectives: the samples travel through
    the coordination service, never an XLA collective) and admits the first 2 to finish on
    either (tickets 1 and 2 of the step's shared counter); every process trains on the same 2;
    the late and stopped ones stay carried on the process that played them. Over the run no
    trial is trained twice and none is lost: the trials admitted and those the last checkpoint
    carries are exactly every attempt the sampler drew."""
    from t1jax.checkpoint import Checkpointer
    from t1jax.rollout.sample import load_samples
    workdir = tmp_path / "oversampled"
    args = live_args(toy_run, workdir, "--config.rollouts.oversample=2.0",
                     "--config.ppo.steps=3", "--config.schedule=one_step_off")
    assert _launcher().launch(args, 2, 1, timeout_s=480) == 0
    admitted = []
    for step in range(3):
        samples = load_samples(workdir / "ppo" / "rollouts" / f"step_{step:05d}")
        # (records are read back by file name: task, attempt)
        assert sorted(s.metadata["admission"] for s in samples) == [1, 2], step
        assert {s.metadata["process"] for s in samples} <= {0, 1}
        admitted += [(s.metadata["task_id"], s.metadata["attempt"]) for s in samples]
        # one step off: step 0 is sampled by the first weights, every later one by older ones
        assert all(int(v) <= max(step - 1, 0) for s in samples
                   for v in s.metadata["weight_versions"]), step
    assert len(set(admitted)) == len(admitted) == 6  # none trained twice
    rows = [json.loads(line) for line in (workdir / "ppo" / "metrics.jsonl").read_text()
            .splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # written once
    assert all(r["rollout/infra_failures"] == 0 for r in rows)
    with Checkpointer.reader(workdir / "ppo" / "checkpoints") as ckpt:
        source = ckpt.restore_meta()["source"]
    carried = [(c["task_id"], c["attempt"]) for c in source["carried"]]
    assert not set(carried) & set(admitted)
    # every drawn attempt is admitted or carried (carry-over drops nothing)
    assert sorted(a for _, a in admitted + carried) == list(range(source["next_attempt"]))
    assert source["next_attempt"] == 8  # 4 drawn for the first step, 2 more for each later


@pytest.mark.parametrize("cluster", ["jax", "slurm"])
def test_each_process_reads_only_the_routes_of_its_own_rows(cluster, capfd):
    """A step's expert routes (99% of a T1 step's sample bytes) never reach every host: 2
    processes x 2 devices each share their half of 10 samples' routes through the
    coordinator, pack the same layout, and fetch only the other's samples that land in their
    own rows (2 of 5 each here); the placed batch equals one process packing all 10 itself,
    field by field, and once packed no copy stays in the coordinator
    (tests/rl/shared_routes_job.py; ~5 s). cluster="slurm": the processes get only what
    `srun` sets (SLURM_JOB_ID, SLURM_PROCID, ...) and T1JAX_DISTRIBUTED=auto, and join
    through JAX's own SLURM detection."""
    code = _launcher().launch([], 2, 2, script=str(ROOT / "tests" / "rl" /
                                                   "shared_routes_job.py"), timeout_s=300,
                              cluster=cluster)
    out = capfd.readouterr().out
    assert code == 0, out[-4000:]
    lines = sorted(line for line in out.splitlines() if ": rows " in line)
    assert [line.split("] ", 1)[1] for line in lines] == [
        "process 0: rows [0, 1] of 4, fetched [3, 9] of 5 remote samples, left in the "
        "coordinator []",
        "process 1: rows [2, 3] of 4, fetched [4, 8] of 5 remote samples, left in the "
        "coordinator []"], out[-4000:]


def test_what_does_not_run_across_processes_is_refused(tmp_path, capsys):
    """The evaluation, oracle and pool jobs are not split: refused, naming what runs
    instead."""
    code = two_processes(["--config", str(ROOT / "configs" / "eval.py"), "--workdir",
                          str(tmp_path / "eval")])
    out = capsys.readouterr().out
    assert code != 0 and "mode 'eval' runs as one process" in out, out[-2000:]


EXPORT = """import sys
from t1jax import distributed
distributed.initialize()
from configs import tiny_cpu
from t1jax.jobs import build
from t1jax.model.hf_io import export_hf
config = tiny_cpu.get_config()
config.model.param_dtype = "bfloat16"
config.mesh.fsdp, config.mesh.expert = 2, 2
export_hf(build.policy(config, build.mesh_from(config)), sys.argv[1],
          max_shard_bytes=int(sys.argv[2]))
"""


def test_hf_export_from_two_processes_equals_one(tmp_path):
    """A bf16 policy sharded fsdp=2 x expert=2 over 2 processes x 2 devices, exported in
    shards of 300 kB: every process gathers each tensor, writes every other shard and none
    holds the model; the folder equals 1 process's export of the same model bit for bit, keeps
    bfloat16, and loads in transformers."""
    import safetensors.numpy
    import torch
    import transformers
    script = tmp_path / "export.py"
    script.write_text(EXPORT.format(root=str(ROOT)))
    one, two = tmp_path / "one", tmp_path / "two"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COORDINATOR")}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    proc = subprocess.run([sys.executable, str(script), str(one), "300000"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _launcher().launch([str(two), "300000"], 2, 2, script=str(script)) == 0
    files = sorted(p.name for p in one.iterdir())
    assert files == sorted(p.name for p in two.iterdir())
    shards = [name for name in files if name.endswith(".safetensors")]
    assert len(shards) > 2, files  # both processes wrote some
    for name in ("config.json", "model.safetensors.index.json"):
        assert (one / name).read_text() == (two / name).read_text(), name
    for name in shards:
        a, b = (safetensors.numpy.load_file(str(d / name)) for d in (one, two))
        assert a.keys() == b.keys(), name
        for key in a:
            assert a[key].dtype == b[key].dtype and str(a[key].dtype) == "bfloat16", key
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(two, output_loading_info=True)
    assert hf.dtype == torch.bfloat16
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    index = json.loads((two / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(index) == sum(1 for name in shards
                             for _ in safetensors.numpy.load_file(str(two / name)))


def test_live_rollouts_through_a_fleet_from_two_processes(toy_run, docker_backend, tmp_path):
    """The recipe's live PPO as 2 processes x 1 device against one t1jax server speaking
    SGLang's /generate: each process plays every other trial through its own client; after
    each step every process writes its shards of the new weights, process 0 has the server
    load them, and both then sample from it (each step's trials carry that step's version);
    the folder a newer publish replaced is removed."""
    import jax
    from test_rollout_server import free_port, start_server, wait_healthy

    from t1jax.model.config import model_config_from
    from t1jax.model.hf_io import export_hf
    from t1jax.rl.trainer import Trainer
    from t1jax.rollout.sample import load_samples
    from t1jax.rollout.sglang import FleetClient, RouteLayout
    from t1jax.sharding import make_mesh
    from configs import tiny_cpu
    config = tiny_cpu.get_config()
    config.model.update(dict(hidden_size=64, intermediate_size=128,  # what live_args sets
                             moe_intermediate_size=32, num_attention_heads=4, num_experts=8))
    initial = export_hf(Trainer(model_config_from(config.model), config.rl,
                                make_mesh(devices=jax.devices()[:1]), seed=0).actor_model(),
                        tmp_path / "initial")  # what the job's seed starts from
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(initial, port, max_len=2048)
    try:
        wait_healthy(url, server, timeout_s=120)
        workdir = tmp_path / "fleet_2proc"
        args = live_args(toy_run, workdir, "--config.ppo.steps=2",
                         "--config.rollouts.engine=fleet", f"--config.rollouts.fleet_urls={url}")
        assert _launcher().launch(args, 2, 1) == 0
        client = FleetClient([url], RouteLayout.of(model_config_from(config.model)))
        assert client.model_info(url)["weight_version"] == "2"
    finally:
        server.kill()
        server.wait()
    for step in range(2):
        samples = load_samples(workdir / "ppo" / "rollouts" / f"step_{step:05d}")
        # one trial each (records are read back by file name: task, attempt)
        assert sorted(s.metadata["process"] for s in samples) == [0, 1]
        assert {v for s in samples for v in s.metadata["weight_versions"]} == {str(step)}
    rows = [json.loads(line) for line in (workdir / "ppo" / "metrics.jsonl").read_text()
            .splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    # trained on what the server sampled: its published weights are the trainer's
    assert all(r["mismatch/logprob_gap"] < 1e-3 for r in rows), rows
    assert sorted(p.name for p in (workdir / "ppo" / "published").iterdir()) == ["weights_2"]
