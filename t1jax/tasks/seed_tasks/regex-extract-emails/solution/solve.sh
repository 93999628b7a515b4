#!/bin/bash
# Tokenize on whitespace, strip punctuation at both ends, keep full-match valid addresses.
set -euo pipefail
cd /app
label='[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?'
cat data/*.txt \
  | tr -s '[:space:]' '\n' \
  | sed -E "s/^[][<>(){}\"',;:!?.]+//; s/[][<>(){}\"',;:!?.]+\$//" \
  | grep -P "^(?!\\.)(?!.*\\.\\.)[A-Za-z0-9._%+-]{1,64}(?<!\\.)@(${label}\\.)+[A-Za-z]{2,63}\$" \
  | tr '[:upper:]' '[:lower:]' \
  | LC_ALL=C sort -u > emails.txt
cat emails.txt
