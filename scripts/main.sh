#!/usr/bin/env bash
# The main job on the embedded default (CPU, local sandboxes). Set-up is automatic and idempotent.
# The whole tiny T1 recipe (configs/tiny_cpu.py); re-running resumes from runs/tiny_cpu.
# Extra arguments go to experiments/run.py, e.g. --config.sandbox.concurrency=4
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
backend=docker
if [ "${T1JAX_SKIP_DOCKER:-0}" = 1 ] || ! docker info >/dev/null 2>&1; then backend=bwrap; fi
exec .venv/bin/python experiments/run.py --config configs/tiny_cpu.py --workdir runs/tiny_cpu \
  --config.sandbox.backend="$backend" "$@"
