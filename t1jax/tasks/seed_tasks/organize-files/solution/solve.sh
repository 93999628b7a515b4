#!/bin/bash
# Move each top-level file of /app/inbox into a lower-cased extension dir, then write the manifest.
set -euo pipefail
cd /app/inbox
find . -maxdepth 1 -type f -print0 | while IFS= read -r -d '' f; do
  name=${f#./}
  if [[ $name == *.* ]]; then ext=${name##*.}; ext=${ext,,}; else ext=noext; fi
  mkdir -p "$ext"
  mv -n -- "$name" "$ext/$name"
done
{
  echo "path,bytes"
  find . -mindepth 2 -type f -printf '%P,%s\n' | LC_ALL=C sort
} > /app/manifest.csv
cat /app/manifest.csv
