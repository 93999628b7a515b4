#!/usr/bin/env bash
# The test suite, slow end-to-end tests included. Set-up is automatic and idempotent.
# Extra arguments go to pytest, e.g. -m "not slow" for the fast subset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
