#!/usr/bin/env bash
# Kill the toy main job at every loop point (collected, updated, saving) of every step of SFT,
# Critic Warm-Up and PPO, rerun it, and check the result (tests/jobs/test_chaos.py; CI runs one point
# per phase). 9 SFT cases, 36 Warm-Up + PPO cases (sync and one-step-off): about 2 hours on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "no .venv: run bash scripts/setup.sh first" >&2; exit 1; }
T1JAX_CHAOS_SWEEP=1 exec .venv/bin/python -m pytest -q tests/jobs/test_chaos.py \
  -n "${T1JAX_TEST_WORKERS:-2}" --dist load "$@"
