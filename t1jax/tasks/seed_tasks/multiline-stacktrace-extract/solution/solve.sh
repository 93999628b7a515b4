#!/bin/bash
# Walk the log with awk as a small state machine: collect each traceback block, append it to the
# file of its exception type (blank-line separated), then build counts.txt.
set -euo pipefail
cd /app
rm -rf tracebacks && mkdir tracebacks
awk '
  function flush(line,   type, f) {
    block = block line "\n"
    type = line; sub(/:.*/, "", type)
    f = "tracebacks/" type ".txt"
    if (type in seen) printf "\n" >> f
    printf "%s", block >> f
    close(f)
    seen[type]++
    inblock = 0; block = ""
  }
  inblock && /^ / { block = block $0 "\n"; next }
  inblock { flush($0); next }
  $0 == "Traceback (most recent call last):" { inblock = 1; block = $0 "\n"; next }
  END { for (t in seen) print seen[t], t > "tracebacks/counts.unsorted" }
' app.log
LC_ALL=C sort -k1,1nr -k2,2 tracebacks/counts.unsorted > tracebacks/counts.txt
rm tracebacks/counts.unsorted
cat tracebacks/counts.txt
