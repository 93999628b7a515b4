#!/bin/bash
# Build /app/repo with a fixed history (fixed dates => reproducible hashes).
set -euo pipefail
export GIT_AUTHOR_NAME="Alice Dev" GIT_AUTHOR_EMAIL="alice@example.com"
export GIT_COMMITTER_NAME="Alice Dev" GIT_COMMITTER_EMAIL="alice@example.com"
commit() { export GIT_AUTHOR_DATE="$1" GIT_COMMITTER_DATE="$1"; git add -A; git commit -q -m "$2"; }
mkdir -p /app/repo && cd /app/repo
git init -q -b main
printf '# calc\n\nSmall numeric helpers.\n' > README.md
cat > calc.py <<'PY'
def average(xs):
    """Arithmetic mean of a non-empty list of numbers."""
    if not xs:
        raise ValueError("average of empty list")
    return sum(xs) / len(xs)
PY
commit "2024-01-01T10:00:00+00:00" "Initial commit"
cat >> calc.py <<'PY'


def median(xs):
    """Median of a non-empty list of numbers."""
    s = sorted(xs)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2
PY
commit "2024-01-02T10:00:00+00:00" "Add median helper"
python3 - <<'PY'
src = open("calc.py").read()
src = src.replace("    return sum(xs) / len(xs)\n",
                  "    total = 0\n    for i in range(1, len(xs)):\n        total += xs[i]\n    return total / len(xs)\n")
open("calc.py", "w").write(src)
PY
commit "2024-01-03T10:00:00+00:00" "Refactor average"
printf '\nUsage: `from calc import average, median`\n' >> README.md
commit "2024-01-04T10:00:00+00:00" "Update README"
