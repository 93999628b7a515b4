#!/usr/bin/env bash
# SGLang's own code for the fleet tests (tests/rollout/test_router.py, tests/rollout/test_sglang_contract.py) in
# its own virtualenv .venv-sglang: the smg router and msgspec from requirements-sglang.txt, and
# the sglang package --no-deps (its /generate JSON contract needs only msgspec). Idempotent:
# reinstalled only when requirements-sglang.txt changes. Used by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
want=$(sha256sum requirements-sglang.txt | cut -d' ' -f1)
if [ "$(cat .venv-sglang/.requirements.sha256 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing .venv-sglang (smg router, sglang --no-deps) for the fleet tests" >&2
  sglang=$(sed -n 's/^# SGLANG //p' requirements-sglang.txt)
  { python3 -m venv .venv-sglang \
      && .venv-sglang/bin/python -m pip install -q -r requirements-sglang.txt \
      && .venv-sglang/bin/python -m pip install -q --no-deps "$sglang"; } \
    || { echo "[setup] ERROR: could not install requirements-sglang.txt into .venv-sglang;" \
              "the package index must be reachable" >&2; exit 1; }
  echo "$want" > .venv-sglang/.requirements.sha256
fi
