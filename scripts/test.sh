#!/usr/bin/env bash
# The test suite, slow end-to-end tests included. Set-up is automatic and idempotent.
# Extra arguments go to pytest, e.g. -m "not slow" for the fast subset (the inner loop).
# Tests run on T1JAX_TEST_WORKERS pytest-xdist workers (default: one per core, at most 4), one
# test file per worker at a time, the most expensive files first (tests/file_costs.json); 1
# runs them in this process. Where the time goes: .pytest_cache/t1jax/test-times.md.
set -euo pipefail
cd "$(dirname "$0")/.."
setup_start=$(date +%s)
bash scripts/setup.sh
# The tiny TPU ahead-of-time compiles (tests/jobs/test_aot_tpu.py) run libtpu from .venv-tpu; the
# real-scale ones are scripts/check_tpu_fit.sh. T1JAX_SKIP_TPU_AOT=1 skips both.
[ "${T1JAX_SKIP_TPU_AOT:-0}" = 1 ] || bash scripts/setup_tpu.sh
bash scripts/setup_sglang.sh  # SGLang's router and /generate contract for the fleet tests
echo "[test] set-up took $(( $(date +%s) - setup_start )) s (not counted in the suite's time)" >&2
workers=${T1JAX_TEST_WORKERS:-$(nproc)}
[ "$workers" -gt 4 ] && workers=4
parallel=()
[ "$workers" -gt 1 ] && parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
exec .venv/bin/python -m pytest -q "${parallel[@]}" "$@"
