"""Shared fixtures: a Docker backend for the real-container tests, and the tiny models of both
families (the engine tests run on each).

Where no Docker engine is reachable those tests skip, except in CI (T1JAX_REQUIRE_DOCKER=1),
where a missing engine is a failure rather than a silently green run.
"""

import os
from pathlib import Path

# Before anything imports JAX: tests of sharded code see 8 host devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# One compile per program per machine: JAX's persistent compilation cache, outside the checkout,
# shared by every test, both xdist workers and every job a test starts (run.py inherits the
# environment). The cache keys on the program, XLA flags and jaxlib, so a hit is the executable
# the compile would have produced. Only compiles over JAX's default 1 s are kept (0.3 s wrote
# more entries, and measured slower on an empty cache, within noise: BENCHMARKS.md). The size cap
# makes JAX lock the folder (filelock), which workers writing the same entry need.
# T1JAX_JAX_CACHE= (empty) turns it off.
_JAX_CACHE = os.environ.get("T1JAX_JAX_CACHE", os.path.expanduser("~/.cache/t1jax/jax-tests"))
if _JAX_CACHE:
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _JAX_CACHE)
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))

import pytest  # noqa: E402

pytest_plugins = ["suite_timing"]  # the per-file time table and the 45-minute guard


@pytest.fixture(scope="session")
def docker_backend():
    from t1jax.sandbox.base import SandboxError
    try:
        from t1jax.sandbox.docker_backend import DockerBackend
        return DockerBackend()
    except (SandboxError, ImportError) as err:
        reason = f"Docker is unreachable: {err}"
        if os.environ.get("T1JAX_REQUIRE_DOCKER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


def _unavailable(reason: str):
    """Skip, or fail in CI (T1JAX_REQUIRE_DOCKER=1): a missing engine must not pass silently."""
    if os.environ.get("T1JAX_REQUIRE_DOCKER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client():
    from t1jax.sandbox.base import SandboxError
    try:
        from t1jax.sandbox.docker import docker_client as connect
        return connect()
    except (SandboxError, ImportError) as err:
        _unavailable(str(err))


# The sandbox and escape suites run under both runtimes: runc (Docker's default) and gVisor.
@pytest.fixture(scope="module", params=["runc", "runsc"])
def runtime(request, docker_client):
    from t1jax.sandbox.docker import daemon_facts
    if request.param not in daemon_facts(docker_client)["runtimes"]:
        _unavailable(f"the Docker daemon has no runtime {request.param} "
                     "(scripts/setup.sh registers runsc when it starts dockerd)")
    return request.param


@pytest.fixture
def make_sandbox(docker_client, runtime):
    """A factory of unstarted DockerSandboxes (of the base image unless `image=`) under
    `runtime`; Limits fields and DockerSandbox options (user=...) as keywords."""
    import dataclasses
    import uuid

    from t1jax.sandbox.base import Limits
    from t1jax.sandbox.docker import DockerSandbox
    from t1jax.sandbox.images import LOCAL_BASE_IMAGE
    limit_names = {f.name for f in dataclasses.fields(Limits)}

    def make(image=LOCAL_BASE_IMAGE, **kwargs):
        limits = Limits(**{k: v for k, v in kwargs.items() if k in limit_names})
        options = {k: v for k, v in kwargs.items() if k not in limit_names}
        return DockerSandbox(image, limits=limits, client=docker_client,
                             run_id=f"test-{uuid.uuid4().hex[:8]}", runtime=runtime, **options)
    return make


@pytest.fixture(scope="session")
def tok():
    """The offline tokenizer (512 ids, byte-level BPE over the bundled corpus): what the rollout
    tests encode with. Deterministic, so one per session is every test's."""
    from t1jax.rollout.tokenizer import train_tokenizer
    return train_tokenizer()


# The bundled task the agent and trial tests drive, and a command that solves it.
COUNT_LOG_TASK = Path(__file__).resolve().parents[1] / "t1jax" / "tasks" / "seed_tasks" / \
    "count-log-errors"
COUNT_LOG_SOLVE = (
    "cd /app && awk '$3 == \"[ERROR]\" { sub(/^service=/, \"\", $4); c[$4]++ } "
    "END { for (s in c) print s \": \" c[s] }' logs/*.log | sort -t: -k2,2nr -k1,1 "
    "> report.txt && awk -F': ' '{ t += $2 } END { print \"TOTAL: \" t }' report.txt "
    ">> report.txt && cat report.txt")


def packed_pair(tokens, a: int):
    """Rows 0 and 1 of `tokens` packed into row 0 (the first `a` tokens of row 0, then row 1's
    first len - a), with the segment ids and restarting positions the trainer packs with:
    (packed tokens, segment_ids, positions, b)."""
    import numpy as np
    b = tokens.shape[1] - a
    packed = tokens.copy()
    packed[0] = np.concatenate([tokens[0, :a], tokens[1, :b]])
    segment_ids = np.ones_like(tokens)
    segment_ids[0, a:] = 2
    positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape).copy()
    positions[0, a:] = np.arange(b)
    return packed, segment_ids, positions, b


_TINY = {"qwen3_moe": "tiny", "qwen3_5_moe": "tiny_qwen35"}
_TINY_MODELS = {}


def tiny_causal_lm(family: str = "qwen3_moe"):
    """The CausalLM of configs/model/tiny.py (qwen3_moe) or tiny_qwen35.py (qwen3_5_moe), seed
    0, built once per session: tests must not update it in place."""
    if family not in _TINY_MODELS:
        import importlib

        from flax import nnx

        from t1jax.model.config import model_config_from
        from t1jax.model.transformer import CausalLM
        module = importlib.import_module(f"configs.model.{_TINY[family]}")
        _TINY_MODELS[family] = CausalLM(model_config_from(module.get_config().model),
                                        nnx.Rngs(0))
    return _TINY_MODELS[family]


# A random HF Qwen3-MoE for the parity tests: tiny, with large weights (non-trivial routing, so
# a wrong key, position or route changes the experts picked); layer 1 is dense.
HF_QWEN3_MOE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=8, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                    mlp_only_layers=[1], tie_word_embeddings=False)


def random_hf_qwen3_moe(seed=0, **overrides):
    """transformers' Qwen3MoeForCausalLM of HF_QWEN3_MOE (with overrides), eval mode."""
    import torch
    import transformers
    torch.manual_seed(seed)
    hf = transformers.Qwen3MoeForCausalLM(
        transformers.Qwen3MoeConfig(**{**HF_QWEN3_MOE, **overrides})).eval()
    with torch.no_grad():
        for _, p in hf.named_parameters():
            p.normal_(1.0, 0.1) if p.ndim == 1 else p.normal_(0.0, 0.2)
    return hf


def saved_hf_and_loaded(path):
    """random_hf_qwen3_moe saved to `path`, its config, and our CausalLM loaded from it."""
    from flax import nnx

    from t1jax.model.config import ModelConfig
    from t1jax.model.hf_io import load_hf
    from t1jax.model.transformer import CausalLM
    hf = random_hf_qwen3_moe()
    hf.save_pretrained(path)
    cfg = ModelConfig.from_pretrained(path)
    return hf, cfg, load_hf(nnx.eval_shape(lambda: CausalLM(cfg, nnx.Rngs(0))), path)


@pytest.fixture(scope="module", params=sorted(_TINY))
def any_model(request):
    """A tiny CausalLM of each family."""
    return tiny_causal_lm(request.param)


TOY_RECIPE = ["--config.pool.families=write,mkdir", "--config.pool.train_per_family=3",
              "--config.pool.heldout_per_family=2", "--config.pool.validation_per_family=1",
              "--config.sft.steps=3",
              "--config.warmup.steps=1", "--config.ppo.steps=1", "--config.eval.attempts=1",
              "--config.rollouts.batch_size=2"]


def run_toy_recipe(workdir, config="tiny_cpu.py", *extra, kill_at=None):
    """experiments/run.py at toy size (TOY_RECIPE) in `workdir`; fails with the job's output.
    kill_at: a t1jax.faults point where the job must SIGKILL itself (and does)."""
    import signal
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "T1JAX_KILL_AT"}
    if kill_at:
        env["T1JAX_KILL_AT"] = kill_at
    proc = subprocess.run([sys.executable, str(root / "experiments" / "run.py"), "--config",
                           str(root / "configs" / config), "--workdir", str(workdir),
                           *TOY_RECIPE, *extra], cwd=root, capture_output=True, text=True,
                          timeout=900, env=env)
    want = -signal.SIGKILL if kill_at else 0
    assert proc.returncode == want, (want, proc.stdout[-2000:] + proc.stderr[-4000:])
    return proc


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory, docker_backend):
    """A finished main-job workdir at toy size (every phase, report included; ~3 minutes):
    what test_recipe and the notebooks read. Built once per run, not once per xdist worker:
    the first worker to need it builds it under a lock in the run's shared temp folder (a
    worker's basetemp's parent), the others wait for it and read it. Tests must not change it."""
    import fcntl
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    shared = tmp_path_factory.getbasetemp()
    shared = shared.parent if worker else shared
    workdir, done = shared / "toy_run", shared / "toy_run.built"
    with open(shared / "toy_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            workdir.mkdir(exist_ok=True)
            run_toy_recipe(workdir)
            done.write_text("ok")
    return workdir
