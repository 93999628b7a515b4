#!/usr/bin/env bash
# The TPU ahead-of-time compile checks (tests/jobs/test_aot_tpu*.py) run libtpu from their own
# virtualenv, .venv-tpu, kept out of the default install (idempotent: reinstalled only when the
# requirements change). Used by scripts/test.sh and scripts/check_tpu_fit.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
want=$(sha256sum requirements.txt requirements-tpu.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv-tpu/.requirements.sha256 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing .venv-tpu (jax[tpu], libtpu) for the TPU compile checks" >&2
  python3 -m venv .venv-tpu && .venv-tpu/bin/python -m pip install -q -r requirements-tpu.txt \
    && .venv-tpu/bin/python -m pip install -q --no-deps -e . 2>/dev/null \
    || { echo "[setup] ERROR: could not install requirements-tpu.txt into .venv-tpu; the" \
              "package index must be reachable (or set T1JAX_SKIP_TPU_AOT=1)" >&2; exit 1; }
  echo "$want" > .venv-tpu/.requirements.sha256
fi
