#!/usr/bin/env bash
# The test suite, slow end-to-end tests included. Set-up is automatic and idempotent.
# Extra arguments go to pytest, e.g. -m "not slow" for the fast subset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The TPU ahead-of-time compile checks (tests/test_aot_tpu.py) run libtpu from their own
# virtualenv, kept out of the default install. T1JAX_SKIP_TPU_AOT=1 skips them.
if [ "${T1JAX_SKIP_TPU_AOT:-0}" != 1 ]; then
  want=$(sha256sum requirements.txt requirements-tpu.txt | sha256sum | cut -d' ' -f1)
  if [ "$(cat .venv-tpu/.requirements.sha256 2>/dev/null)" != "$want" ]; then
    echo "[test] installing .venv-tpu (jax[tpu], libtpu) for the TPU compile checks" >&2
    python3 -m venv .venv-tpu && .venv-tpu/bin/python -m pip install -q -r requirements-tpu.txt \
      || { echo "[test] ERROR: could not install requirements-tpu.txt into .venv-tpu; the" \
                "package index must be reachable (or set T1JAX_SKIP_TPU_AOT=1)" >&2; exit 1; }
    echo "$want" > .venv-tpu/.requirements.sha256
  fi
fi
exec .venv/bin/python -m pytest -q "$@"
