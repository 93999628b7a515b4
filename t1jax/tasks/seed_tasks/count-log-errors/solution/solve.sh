#!/bin/bash
# Count [ERROR] lines per service in /app/logs/*.log and write /app/report.txt.
set -euo pipefail
cd /app
awk '$3 == "[ERROR]" { sub(/^service=/, "", $4); c[$4]++ }
     END { for (s in c) print s ": " c[s] }' logs/*.log \
  | sort -t: -k2,2nr -k1,1 > report.txt
awk -F': ' '{ t += $2 } END { print "TOTAL: " t }' report.txt >> report.txt
cat report.txt
