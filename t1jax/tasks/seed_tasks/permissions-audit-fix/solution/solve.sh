#!/bin/bash
# Audit with find -printf, then chmod per policy; allowlisted set-id files keep their bits.
set -euo pipefail
export LC_ALL=C
cd /app
{
  # %m prints octal permissions without leading zeros; pad to 4 digits with printf
  find /app/srv -mindepth 1 \( -type f -o -type d \) -perm -0002 -printf 'WORLD_WRITABLE %m %p\n'
  find /app/srv -mindepth 1 -type f -perm -4000 -printf 'SETUID %m %p\n'
  find /app/srv -mindepth 1 -type f -perm -2000 -printf 'SETGID %m %p\n'
} | while read -r kind mode path; do printf '%s %04d %s\n' "$kind" "$mode" "$path"; done \
  | sort -k3,3 -k1,1 > audit.txt
cat audit.txt
allowed=/app/srv/etc/allowed_setuid.txt
find /app/srv -mindepth 1 -type f -perm -0002 -exec chmod o-w {} +
find /app/srv -mindepth 1 -type d -perm -0002 ! -perm -1000 -exec chmod o-w {} +
find /app/srv -mindepth 1 -type f \( -perm -4000 -o -perm -2000 \) | while read -r p; do
  grep -qxF "$p" "$allowed" || chmod u-s,g-s "$p"
done
find /app/srv -mindepth 1 -printf '%m %y %p\n' | sort -k3
