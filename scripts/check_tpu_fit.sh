#!/usr/bin/env bash
# The real-scale TPU fit checks: every real config's actor step (Qwen3-30B-A3B on v5p-64,
# Qwen3-235B-A22B and the T1 setting on v5p-256) compiled ahead of time at full depth on this
# host, failing when a step does not fit in HBM (tests/jobs/test_aot_tpu_real.py). About 13 minutes
# of one core and ~8 GB of host memory, so outside the test suite's 30-minute budget; CI runs it
# after the suite. T1JAX_AOT_REAL=1 compiles every step (critic, engine prefill and decode too).
# Extra arguments go to pytest, e.g. -k t1_qwen35 for one config.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_tpu.sh
T1JAX_AOT_REAL=${T1JAX_AOT_REAL:-actor} exec .venv/bin/python -m pytest -q \
  tests/jobs/test_aot_tpu_real.py "$@"
