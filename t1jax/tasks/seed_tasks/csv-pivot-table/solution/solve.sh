#!/bin/bash
# Pivot with awk: last value wins per (station,date,metric); sort keys in C order.
set -euo pipefail
cd /app
export LC_ALL=C
{
  echo "station,date,temp,humidity,wind,pressure"
  awk -F, 'NR > 1 { key = $1 "," $2; keys[key] = 1; v[key, $3] = $4 }
    END {
      split("temp humidity wind pressure", m, " ")
      for (k in keys) {
        line = k
        for (i = 1; i <= 4; i++) line = line "," (((k, m[i]) in v) ? v[k, m[i]] : "NA")
        print line
      }
    }' measurements.csv | sort -t, -k1,1 -k2,2
} > wide.csv
head -5 wide.csv
