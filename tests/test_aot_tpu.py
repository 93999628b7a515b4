"""Ahead-of-time TPU compiles (experiments/aot_compile.py under .venv-tpu, which scripts/test.sh
installs): the trainer's actor and critic steps and the engine's prefill and decode compile for
a TPU v5p topology on this host, with both model families, and report memory, FLOPs and
collectives. Skipped, with the reason, where .venv-tpu is missing.

`test_real_config_fits_its_topology` compiles the real-scale configs at full depth (layers under
lax.scan, stored stacked) with the row length and minibatches each config states (one row per
batch-axis chip per minibatch: aot.rows_per_step), on its topology and mesh, and fails with the
numbers when a step does not fit in HBM (95 GiB per v5p chip). CI compiles every config's actor
step (the larger train step): Qwen3-30B-A3B on v5p-64, Qwen3-235B-A22B and the T1 setting on
v5p-256 (about 3-6 minutes each and at most ~8 GB of host memory on 2 cores).
T1JAX_AOT_REAL=1 compiles every step (actor, critic, engine prefill and decode) of every
config; T1JAX_AOT_REAL=0 skips them all. BUILD.md, "Ahead-of-time TPU
checks", has the numbers."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TPU_PYTHON = ROOT / ".venv-tpu" / "bin" / "python"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not TPU_PYTHON.exists(), reason="no .venv-tpu (libtpu): bash scripts/test.sh installs it "
    "from requirements-tpu.txt; T1JAX_SKIP_TPU_AOT=1 turns that off")]

# name: (run config, model config or None, topology, mesh data,fsdp,expert,tensor, steps,
#        steps CI compiles by default: the actor step, the larger train step)
REAL = {
    "qwen3_30b_a3b": ("configs/qwen3_30b_a3b.py", None, "v5p:2x4x4", "1,4,8,1",
                      "actor,critic,prefill,decode", "actor"),
    "qwen3_235b_a22b": ("configs/qwen3_235b_a22b.py", None, "v5p:4x4x8", "1,16,8,1",
                        "actor,critic,prefill,decode", "actor"),
    "t1_qwen35_122b": ("configs/t1_qwen35_122b.py", None, "v5p:4x4x8", "1,16,8,1",
                       "actor,critic,prefill,decode", "actor"),
}
HOST_GB_NEEDED = 10  # host memory peaks: T1 actor step 7.9 GB, engine prefill 9.5 GB


def host_available_gb() -> float:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) / 2**20
STEPS = "actor,critic,prefill,decode"


def run_check(config, model, topology, mesh, steps, tmp_path, *extra):
    out = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    args = [str(TPU_PYTHON), "experiments/aot_compile.py", f"--config={config}",
            f"--topology={topology}", f"--mesh={mesh}", f"--steps={steps}", f"--json={out}",
            *extra] + ([f"--model={model}"] if model else [])
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3500)
    report = [line for line in proc.stdout.splitlines() if line.strip()]
    sys.stdout.write("\n".join(report) + "\n")
    assert proc.returncode == 0, "\n".join(report) + proc.stderr[-3000:]
    return json.loads(out.read_text())


def check_steps(result, steps):
    assert [s["kind"] for s in result["steps"]] == steps.split(",")
    for step in result["steps"]:
        assert step["fits"] and 0 < step["total_bytes"] <= step["hbm_bytes"], step
        assert step["temp_bytes"] > 0 and step["model_flops"] > 0
        assert 0 < step["mfu"] <= 1
        assert step["collectives"]["all-gather"]["count"] > 0  # FSDP and the expert gathers


@pytest.mark.parametrize("model", ["configs/model/tiny.py", "configs/model/tiny_qwen35.py"])
def test_tiny_models_compile_for_a_v5p_topology(model, tmp_path):
    """Both families, every step, a (1, 2, 2, 2) mesh over v5p:2x2x2, rows long enough for
    flash attention and the chunked vocabulary."""
    result = run_check("configs/tiny_cpu.py", model, "v5p:2x2x2", "1,2,2,2", STEPS, tmp_path,
                       "--length=8192", "--prefill=2048")
    assert result["device"] == "TPU v5" and result["mesh"]["tensor"] == 2
    check_steps(result, STEPS)


@pytest.mark.timeout(3600)  # pytest.ini's 600 s killed the 235B and T1 compiles in CI
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_config_fits_its_topology(name, tmp_path):
    """The config's batch and row length at full depth on its topology and mesh: every step
    compiled fits in HBM. By default the actor step; T1JAX_AOT_REAL=1 every step,
    T1JAX_AOT_REAL=0 none (1.5-12 minutes a step on 2 cores)."""
    config, model, topology, mesh, steps, ci_steps = REAL[name]
    choice = os.environ.get("T1JAX_AOT_REAL", "")
    if choice == "0" or not (ci_steps or choice == "1"):
        pytest.skip(f"{name}: T1JAX_AOT_REAL={choice or 'unset'} (=1 compiles every config's "
                    "every step); its numbers are in BUILD.md, 'Ahead-of-time TPU checks'")
    if host_available_gb() < HOST_GB_NEEDED:
        pytest.skip(f"{name}: compiling a full-depth step needs ~{HOST_GB_NEEDED} GB of free "
                    f"host memory, this host has {host_available_gb():.1f} GB available")
    steps = steps if choice == "1" else ci_steps
    check_steps(run_check(config, model, topology, mesh, steps, tmp_path), steps)
