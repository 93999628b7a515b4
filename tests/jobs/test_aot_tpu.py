"""Ahead-of-time TPU compiles (the recipe's `aot` phase, `experiments/run.py
--config.phases=aot` under .venv-tpu, which scripts/test.sh installs): the trainer's actor and
critic steps and the engine's prefill and decode compile for a TPU v5p topology on this host,
with both model families, and report memory, FLOPs and collectives. Skipped, with the reason, where .venv-tpu is missing. The real-scale configs are
tests/jobs/test_aot_tpu_real.py (its own file, so that a second test worker can take it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TPU_PYTHON = ROOT / ".venv-tpu" / "bin" / "python"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not TPU_PYTHON.exists(), reason="no .venv-tpu (libtpu): bash scripts/test.sh installs it "
    "from requirements-tpu.txt; T1JAX_SKIP_TPU_AOT=1 turns that off")]

STEPS = "actor,critic,prefill,decode"


def run_check(config, steps, tmp_path, *overrides):
    """The one driver's aot phase on `config` (its config.aot block, `overrides` on top)."""
    workdir = tmp_path / "run"
    # not the tests' 8 host devices, nor their CPU compilation cache (conftest.py)
    env = {k: v for k, v in os.environ.items()
           if k != "XLA_FLAGS" and not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT"))}
    args = [str(TPU_PYTHON), "experiments/run.py", f"--config={config}",
            f"--workdir={workdir}", "--config.phases=aot", f"--config.aot.steps={steps}",
            *overrides]
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3500)
    report = [line for line in proc.stdout.splitlines() if line.strip()]
    sys.stdout.write("\n".join(report) + "\n")
    assert proc.returncode == 0, "\n".join(report) + proc.stderr[-3000:]
    assert not (workdir / "pool").exists()  # the check trains nothing, makes no pool
    return json.loads((workdir / "aot" / "report.json").read_text())


def check_steps(result, steps):
    assert [s["kind"] for s in result["steps"]] == steps.split(",")
    for step in result["steps"]:
        assert step["fits"] and 0 < step["total_bytes"] <= step["hbm_bytes"], step
        assert step["temp_bytes"] > 0 and step["model_flops"] > 0
        assert 0 < step["mfu"] <= 1
        assert step["collectives"]["all-gather"]["count"] > 0  # FSDP and the expert gathers


@pytest.mark.parametrize("model,steps", [("configs/model/tiny.py", STEPS),
                                         ("configs/model/tiny_qwen35.py", "actor,prefill,decode")])
def test_tiny_models_compile_for_a_v5p_topology(model, steps, tmp_path):
    """Both families on a (1, 2, 2, 2) mesh over v5p:2x2x2: 2048-token rows and prefills give
    flash attention (2048 x 2048 scores), 1024-token vocabulary chunks the chunked vocabulary
    (8192-token rows with 4096-token chunks compiled 2.3x slower, testing no more). Qwen3.5 skips
    the critic step (37 s of TPU compile alone, ~70 s beside another worker): it is the actor's
    backbone under a value head; Qwen3's critic compiles here, the hybrid critic trains on CPU in
    test_trainer, and T1JAX_AOT_REAL=1 scripts/check_tpu_fit.sh compiles it at real scale."""
    result = run_check("configs/tiny_cpu.py", steps, tmp_path, "--config.aot.topology=v5p:2x2x2",
                       "--config.aot.mesh=1,2,2,2", f"--config.aot.model={model}",
                       "--config.aot.length=2048", "--config.aot.prefill=2048",
                       "--config.rl.logits_chunk=1024")
    assert result["device"] == "TPU v5" and result["mesh"]["tensor"] == 2
    check_steps(result, steps)


def test_a_step_over_hbm_fails_the_run_with_the_compilers_numbers(tmp_path):
    """65536 rows of 4096 tokens on 8 chips: XLA's out-of-memory message (its HLO temporaries
    against the chip's HBM) printed and recorded, and the run exits 1 (~10 s); an unknown
    topology is named by its config key and exits 2."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    args = [str(TPU_PYTHON), "experiments/run.py", "--config=configs/tiny_cpu.py",
            f"--workdir={tmp_path}", "--config.phases=aot", "--config.aot.mesh=1,2,2,2",
            "--config.aot.steps=critic", "--config.aot.rows=65536", "--config.aot.length=4096"]
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "DOES NOT FIT: RESOURCE_EXHAUSTED" in proc.stdout
    (step,) = json.loads((tmp_path / "aot" / "report.json").read_text())["steps"]
    assert not step["fits"] and step["temp_bytes"] > step["hbm_bytes"]
    proc = subprocess.run(args[:4] + ["--config.phases=aot", "--config.aot.topology=v5p:9x9x9"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "config.aot.topology='v5p:9x9x9'" in proc.stderr, \
        proc.stderr[-3000:]
