#!/bin/bash
# Count requests per IP and per status code with awk; sort as the instruction states.
set -euo pipefail
cd /app
export LC_ALL=C
grep -v -e '^$' -e '^#' access.log > /tmp/requests.log
awk '{ c[$1]++ } END { for (ip in c) print c[ip], ip }' /tmp/requests.log \
  | sort -k1,1nr -k2,2 | head -n 10 > top_ips.txt
{
  echo "status,count"
  # the status is the first field after the closing quote of the request
  sed -E 's/^[^"]*"[^"]*" ([0-9]{3}) .*/\1/' /tmp/requests.log | sort | uniq -c \
    | awk '{ print $2 "," $1 }' | sort -t, -k1,1n
} > status_codes.csv
cat top_ips.txt status_codes.csv
