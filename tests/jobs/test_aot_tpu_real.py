"""Ahead-of-time TPU compiles of the real-scale configs (their recipe's `aot` phase under
.venv-tpu: `experiments/run.py --config <config> --config.phases=aot`, each config's own
topology and mesh from its config.aot; helpers in tests/jobs/test_aot_tpu.py, which compiles
the tiny models).

`test_real_config_fits_its_topology` compiles the real-scale configs at full depth (layers under
lax.scan, stored stacked) with the row length and minibatches each config states (one row per
batch-axis chip per minibatch: aot.rows_per_step), on its topology and mesh, and fails with the
numbers when a step does not fit in HBM (95 GiB per v5p chip). They run with
`bash scripts/check_tpu_fit.sh`, which CI runs after the test suite: every config's actor step
(the larger train step): Qwen3-30B-A3B on v5p-64, Qwen3-235B-A22B and the T1 setting on
v5p-256 (about 2-7 minutes each, one core, at most ~8 GB of host memory). In the suite itself
(scripts/test.sh) they skip, with the command in the reason. T1JAX_AOT_REAL=1 compiles every
step (actor, critic, engine prefill and decode) of every config. BUILD.md, "Ahead-of-time TPU
checks", has the numbers."""

import os

import pytest

from test_aot_tpu import check_steps, pytestmark, run_check  # noqa: F401 (slow, needs .venv-tpu)

# name: (topology and mesh data,fsdp,expert,tensor its config.aot names (checked: the check
#        runs what the config says), steps CI compiles by default: the actor step, the larger)
REAL = {
    "qwen3_30b_a3b": ("v5p:2x4x4", {"data": 1, "fsdp": 4, "expert": 8, "tensor": 1}, "actor"),
    "qwen3_235b_a22b": ("v5p:4x4x8", {"data": 1, "fsdp": 16, "expert": 8, "tensor": 1}, "actor"),
    "t1_qwen35_122b": ("v5p:4x4x8", {"data": 1, "fsdp": 16, "expert": 8, "tensor": 1}, "actor"),
}
ALL_STEPS = "actor,critic,prefill,decode"
HOST_GB_NEEDED = 10  # host memory peaks: T1 actor step 7.9 GB, engine prefill 9.5 GB


def host_available_gb() -> float:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) / 2**20


@pytest.mark.timeout(3600)  # pytest.ini's 600 s killed the 235B and T1 compiles in CI
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_config_fits_its_topology(name, tmp_path):
    """The config's batch and row length at full depth on its topology and mesh: every step
    compiled fits in HBM. T1JAX_AOT_REAL=actor (scripts/check_tpu_fit.sh's default, which CI
    runs after the suite) compiles the actor step; =1 every step; unset or 0, none: about 13
    minutes of one core for the three actor steps, more than the suite's 30-minute budget
    can carry (1.5-12 minutes a step on 2 cores)."""
    topology, mesh, ci_steps = REAL[name]
    choice = os.environ.get("T1JAX_AOT_REAL", "0")
    if choice not in ("1", "actor"):
        pytest.skip(f"{name}: real-scale compiles run with bash scripts/check_tpu_fit.sh "
                    f"(T1JAX_AOT_REAL={choice}); its numbers are in BUILD.md, 'Ahead-of-time "
                    "TPU checks'")
    if host_available_gb() < HOST_GB_NEEDED:
        pytest.fail(f"{name}: compiling a full-depth step needs ~{HOST_GB_NEEDED} GB of free "
                    f"host memory, this host has {host_available_gb():.1f} GB available")
    steps = ALL_STEPS if choice == "1" else ci_steps
    result = run_check(f"configs/{name}.py", steps, tmp_path)
    assert result["topology"] == topology and result["mesh"] == mesh, result
    assert result["hosts"] == {"v5p:2x4x4": 8, "v5p:4x4x8": 32}[topology]  # multi-host slices
    check_steps(result, steps)
