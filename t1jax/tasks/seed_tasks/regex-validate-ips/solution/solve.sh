#!/bin/bash
# Regex-based classifier (awk with ERE intervals), run on the provided input.
set -euo pipefail
cat > /app/classify_ips.sh <<'SCRIPT'
#!/bin/bash
# Usage: classify_ips.sh INPUT_FILE OUTPUT_DIR
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 INPUT_FILE OUTPUT_DIR" >&2; exit 2; }
in=$1 out=$2
[ -f "$in" ] || { echo "no such file: $in" >&2; exit 1; }
mkdir -p -- "$out"

oct='(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])'
v4="^$oct([.]$oct){3}\$"
h='[0-9A-Fa-f]{1,4}'
v6="^(($h:){7}$h|($h:){1,7}:|($h:){1,6}:$h|($h:){1,5}(:$h){1,2}|($h:){1,4}(:$h){1,3}|($h:){1,3}(:$h){1,4}|($h:){1,2}(:$h){1,5}|$h:(:$h){1,6}|:((:$h){1,7}|:))\$"

LC_ALL=C awk -v v4="$v4" -v v6="$v6" -v dir="$out" '
  BEGIN { f4 = dir "/ipv4.txt"; f6 = dir "/ipv6.txt"; fx = dir "/invalid.txt"
          printf "" > f4; printf "" > f6; printf "" > fx }
  $0 == "" { next }
  $0 ~ v4 { print > f4; n4++; next }
  $0 ~ v6 { print > f6; n6++; next }
  { print > fx; nx++ }
  END { printf "ipv4=%d ipv6=%d invalid=%d\n", n4, n6, nx > (dir "/summary.txt") }
' "$in"
SCRIPT
chmod 755 /app/classify_ips.sh
/app/classify_ips.sh /app/input/addresses.txt /app/out
cat /app/out/summary.txt
