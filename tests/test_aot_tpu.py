"""The real-scale configs compiled ahead of time for TPU v5p topologies (experiments/aot_compile.py
under .venv-tpu, which scripts/test.sh installs): each step must fit in a chip's HBM with the
batch and row length its config states; a step that does not fit fails with its numbers. The
table these produce is in BUILD.md. Skipped, with the reason, where .venv-tpu is missing."""

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

# (config, topology, mesh data,fsdp,expert,tensor, steps): why each mesh is in BUILD.md
CHECKS = {
    "qwen3_30b_a3b": ("configs/qwen3_30b_a3b.py", "v5p:2x4x4", "1,4,8,1", "ppo,critic"),
}


def run_check(config, topology, mesh, steps, tmp_path):
    out = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [str(TPU_PYTHON), "experiments/aot_compile.py", f"--config={config}",
         f"--topology={topology}", f"--mesh={mesh}", f"--steps={steps}", f"--json={out}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)
    report = [line for line in proc.stdout.splitlines()]
    sys.stdout.write("\n".join(report) + "\n")
    assert proc.returncode == 0, "\n".join(report) + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_real_config_fits_its_topology(name, tmp_path):
    config, topology, mesh, steps = CHECKS[name]
    result = run_check(config, topology, mesh, steps, tmp_path)
    assert [s["name"].split()[0] for s in result["steps"]] == steps.split(",")
    for step in result["steps"]:
        assert step["fits"] and 0 < step["total_bytes"] <= step["hbm_bytes"], step
        assert step["temp_bytes"] > 0 and step["model_flops"] > 0
        assert 0 < step["mfu"] <= 1
        assert step["collectives"]["all-gather"]["count"] > 0  # FSDP and the expert gathers
