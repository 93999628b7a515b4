#!/bin/bash
# Write /app/backup.sh, make it executable and smoke-test it on /app/project.
set -euo pipefail
cat > /app/backup.sh <<'SCRIPT'
#!/bin/bash
# Usage: backup.sh SOURCE_DIR DEST_DIR [LABEL]
# Creates DEST_DIR/LABEL-DATE.tar.gz (without *.tmp files) plus a .sha256 checksum file.
set -euo pipefail

usage() { echo "usage: $(basename "$0") SOURCE_DIR DEST_DIR [LABEL]" >&2; exit 2; }
die() { local code=$1; shift; echo "backup.sh: error: $*" >&2; exit "$code"; }

# 1. argument validation
[ $# -ge 2 ] && [ $# -le 3 ] || usage
src=$1
dest=$2
if [ $# -eq 3 ]; then
  label=$3
  [[ $label =~ ^[A-Za-z0-9._-]+$ ]] || die 2 "invalid label: '$label'"
fi

# 2. the source must be an existing directory
[ -d "$src" ] || die 1 "source directory not found: '$src'"

# 3. default label = base name of the source (trailing slashes ignored)
if [ -z "${label:-}" ]; then
  label=$(basename -- "$src")
  if [ "$label" = "." ] || [ "$label" = ".." ] || [ "$label" = "/" ]; then
    label=$(basename -- "$(cd -- "$src" && pwd -P)")
  fi
fi

# 4. date stamp
date_stamp=${BACKUP_DATE:-}
[ -n "$date_stamp" ] || date_stamp=$(date +%Y%m%d)

# 5. destination directory (absolute path)
mkdir -p -- "$dest"
dest_abs=$(cd -- "$dest" && pwd -P)
src_abs=$(cd -- "$src" && pwd -P)
name="$label-$date_stamp.tar.gz"
archive="$dest_abs/$name"

# 6. never overwrite an existing archive
[ ! -e "$archive" ] || die 3 "archive already exists: '$archive'"

# 7. build into a temp file first so a failure leaves no partial archive
tmp=$(mktemp "$dest_abs/.backup.XXXXXX")
trap 'rm -f -- "$tmp"' EXIT
tar -C "$src_abs" --exclude='*.tmp' -czf "$tmp" .
chmod 644 -- "$tmp"
mv -n -- "$tmp" "$archive"
[ ! -e "$tmp" ] || die 3 "archive appeared concurrently: '$archive'"
trap - EXIT

# 8. checksum in sha256sum format with the bare file name
(cd -- "$dest_abs" && sha256sum -- "$name") > "$archive.sha256"

# 9. report
echo "$archive"
SCRIPT
chmod 755 /app/backup.sh

# smoke test
out=$(mktemp -d)
BACKUP_DATE=20000101 /app/backup.sh /app/project "$out"
tar -tzf "$out/project-20000101.tar.gz"
(cd "$out" && sha256sum -c project-20000101.tar.gz.sha256)
set +e
BACKUP_DATE=20000101 /app/backup.sh /app/project "$out"; echo "rerun exit=$? (expected 3)"
/app/backup.sh /nonexistent "$out"; echo "missing exit=$? (expected 1)"
/app/backup.sh; echo "usage exit=$? (expected 2)"
rm -rf "$out"
