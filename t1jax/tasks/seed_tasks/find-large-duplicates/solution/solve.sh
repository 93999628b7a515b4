#!/bin/bash
# Hash candidate files (>= 1024 bytes, no symlinks), report groups, then hard-link duplicates.
set -euo pipefail
mkdir -p /app/out
export LC_ALL=C
tmp=$(mktemp)
# size<TAB>sha256<TAB>path for every candidate
find /app/data -type f -size +1023c -print0 |
  while IFS= read -r -d '' f; do
    printf '%s\t%s\t%s\n' "$(stat -c %s -- "$f")" "$(sha256sum -- "$f" | cut -d' ' -f1)" "$f"
  done | sort -t$'\t' -k2,2 -k3,3 > "$tmp"
# group by hash: hash, size, sorted paths (only groups with >= 2 files)
awk -F'\t' '
  { if ($2 != h) { if (n > 1) print line; h = $2; n = 0; line = $2 "\t" $1 }
    line = line "\t" $3; n++ }
  END { if (n > 1) print line }' "$tmp" \
  | sort -t$'\t' -k2,2nr -k1,1 > /app/out/duplicates.tsv
rm -f "$tmp"
awk -F'\t' '{ g++; f += NF - 2; b += $2 * (NF - 3) }
  END { printf "groups=%d files=%d reclaimed_bytes=%d\n", g, f, b }' /app/out/duplicates.tsv \
  > /app/out/summary.txt
# hard-link every other member to the first path of its group
while IFS=$'\t' read -r -a fields; do
  keep=${fields[2]}
  for dup in "${fields[@]:3}"; do
    ln -f -- "$keep" "$dup"
  done
done < /app/out/duplicates.tsv
cat /app/out/duplicates.tsv /app/out/summary.txt
