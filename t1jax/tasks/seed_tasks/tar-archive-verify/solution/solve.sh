#!/bin/bash
# tar with --exclude patterns, sha256sum for checksums/manifest, sha256sum -c for the releases,
# tar -O to extract a single member.
set -euo pipefail
cd /app
export LC_ALL=C
mkdir -p dist deploy
tar -czf dist/project.tar.gz --exclude='build' --exclude='node_modules' --exclude='.git' \
    --exclude='*.log' project
# --exclude=build would also drop a *file* named build; the project has none, check it anyway
test -z "$(find project -name build -type f)"
(cd dist && sha256sum project.tar.gz > project.tar.gz.sha256 && sha256sum -c project.tar.gz.sha256)
rm -rf /tmp/manifest && mkdir /tmp/manifest
tar -xzf dist/project.tar.gz -C /tmp/manifest
(cd /tmp/manifest && find project -type f -print0 | sort -z | xargs -0 sha256sum) > dist/MANIFEST.txt
cd incoming
# sha256sum -c exits 1 when a line fails: keep its per-file report
{ sha256sum -c SHA256SUMS 2>/dev/null || true; } > /tmp/check.txt
awk -F': ' '$2 != "OK" { print $1 }' /tmp/check.txt | sort > ../dist/corrupt.txt
newest=$(awk -F': ' '$2 == "OK" { print $1 }' /tmp/check.txt | sort -V | tail -n 1)
echo "newest valid: $newest"
tar -xzOf "$newest" release/config/app.conf > /app/deploy/app.conf
cat /app/dist/corrupt.txt /app/deploy/app.conf
