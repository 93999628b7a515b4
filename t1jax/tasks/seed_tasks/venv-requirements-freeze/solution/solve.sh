#!/bin/bash
# venv + offline install from /app/wheels, then a sorted, hash-pinned lock file.
set -euo pipefail
python3 -m venv --system-site-packages /app/venv
/app/venv/bin/pip install --no-index --find-links /app/wheels --no-build-isolation -r /app/requirements.in
# packages installed in the venv itself (not the system ones), minus the packaging tools
/app/venv/bin/pip list --local --format=freeze \
  | grep -viE '^(pip|setuptools|wheel)==' > /tmp/installed.txt
: > /app/requirements.lock
while IFS='=' read -r name _ version; do
  norm=$(printf '%s' "$name" | tr 'A-Z' 'a-z' | sed -E 's/[-_.]+/-/g')
  # file names use the name with '-' as '_' (wheels) or as given (sdists): match both
  stem=$(printf '%s' "$norm" | sed 's/-/[-_.]/g')
  file=$(ls /app/wheels | grep -iE "^${stem}-${version//./\\.}(-py3-none-any\.whl|\.tar\.gz)$" | sort -r | head -1)
  [ -n "$file" ] || { echo "no distribution file for $name $version" >&2; exit 1; }
  hash=$(sha256sum "/app/wheels/$file" | cut -d' ' -f1)
  echo "$norm==$version --hash=sha256:$hash" >> /app/requirements.lock
done < /tmp/installed.txt
LC_ALL=C sort -o /app/requirements.lock /app/requirements.lock
rm -f /tmp/installed.txt
cat /app/requirements.lock
