#!/bin/bash
# Write /app/rotate.sh and rotate /app/logs/app.log once with KEEP=5.
set -euo pipefail
cat > /app/rotate.sh <<'SCRIPT'
#!/bin/bash
# Usage: rotate.sh LOGFILE KEEP  -- one logrotate-style rotation (LOGFILE.1 plain, older .N.gz).
set -euo pipefail
usage() { echo "usage: $(basename "$0") LOGFILE KEEP" >&2; exit 2; }
[ $# -eq 2 ] || usage
log=$1 keep=$2
[[ $keep =~ ^[0-9]+$ ]] && [ "$((10#$keep))" -ge 1 ] || usage
keep=$((10#$keep))
[ -f "$log" ] || { echo "rotate.sh: not a regular file: $log" >&2; exit 1; }
[ -s "$log" ] || exit 0

dir=$(dirname -- "$log") base=$(basename -- "$log")
# existing compressed generations, highest first
mapfile -t gens < <(find "$dir" -maxdepth 1 -type f -name "$base.*.gz" -printf '%f\n' \
  | sed -n "s/^$(printf '%s' "$base" | sed 's/[][\.*^$/]/\\&/g')\.\([0-9][0-9]*\)\.gz$/\1/p" \
  | sort -rn)
for n in "${gens[@]}"; do
  [ "$n" -ge 2 ] || continue
  mv -f -- "$dir/$base.$n.gz" "$dir/$base.$((n + 1)).gz"
done
if [ -f "$log.1" ]; then
  gzip -n -c -- "$log.1" > "$log.2.gz.tmp"
  mv -f -- "$log.2.gz.tmp" "$log.2.gz"
  rm -f -- "$log.1"
fi
mode=$(stat -c '%a' -- "$log")
owner=$(stat -c '%u:%g' -- "$log")
mv -- "$log" "$log.1"
: > "$log"
chmod "$mode" -- "$log"
chown "$owner" -- "$log" 2>/dev/null || true
# enforce retention
for f in "$dir/$base".*.gz; do
  [ -e "$f" ] || continue
  n=${f#"$dir/$base."}; n=${n%.gz}
  [[ $n =~ ^[0-9]+$ ]] || continue
  [ "$n" -le "$keep" ] || rm -f -- "$f"
done
SCRIPT
chmod 755 /app/rotate.sh
/app/rotate.sh /app/logs/app.log 5
ls -l /app/logs
