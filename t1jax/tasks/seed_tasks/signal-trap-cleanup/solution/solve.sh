#!/bin/bash
# Install /app/worker.sh and try it once.
set -euo pipefail
cat > /app/worker.sh <<'SCRIPT'
#!/bin/bash
# Usage: worker.sh OUTDIR COUNT DELAY -- writes parts into a private temp dir, then OUTDIR/result.txt.
set -uo pipefail

usage() { echo "usage: $(basename "$0") OUTDIR COUNT DELAY" >&2; exit 2; }
[ $# -eq 3 ] || usage
outdir=$1 count=$2 delay=$3
[[ $count =~ ^[0-9]+$ ]] && [ "$((10#$count))" -ge 1 ] || usage
[[ $delay =~ ^([0-9]+([.][0-9]*)?|[.][0-9]+)$ ]] || usage
count=$((10#$count))
[ -d "$outdir" ] || { echo "worker.sh: not a directory: $outdir" >&2; exit 1; }

tmpdir=""
sleeper=""
staged=""
cleanup() {
  [ -n "$sleeper" ] && kill "$sleeper" 2>/dev/null
  kill $(jobs -p) 2>/dev/null   # a sleep started just before the signal arrived
  [ -n "$staged" ] && rm -f -- "$staged"
  [ -n "$tmpdir" ] && rm -rf -- "$tmpdir"
}
on_signal() {  # $1 = message, $2 = exit status
  trap - EXIT
  cleanup
  echo "$1" >&2
  exit "$2"
}
trap cleanup EXIT
trap 'on_signal interrupted 130' INT
trap 'on_signal terminated 143' TERM
trap '' HUP

tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/worker.XXXXXX") || exit 1
echo "tmpdir=$tmpdir"

for ((i = 1; i <= count; i++)); do
  echo "item $i" > "$tmpdir/part-$i.txt"
  sleep "$delay" > /dev/null 2>&1 & sleeper=$!
  wait "$sleeper"          # returns early when a trapped signal arrives
  sleeper=""
done

for ((i = 1; i <= count; i++)); do cat "$tmpdir/part-$i.txt"; done > "$tmpdir/result.txt"
# same filesystem is not guaranteed: copy next to the target first, then rename atomically
staged=$(mktemp "$outdir/.result.XXXXXX") || exit 1
cat "$tmpdir/result.txt" > "$staged" && mv -f -- "$staged" "$outdir/result.txt" || exit 1
staged=""
echo "done"
exit 0
SCRIPT
chmod 755 /app/worker.sh
/app/worker.sh /app/out 3 0.1
cat /app/out/result.txt
rm -f /app/out/result.txt
