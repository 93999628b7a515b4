#!/bin/bash
# Build /app/repo with a fixed history (fixed dates => reproducible hashes).
set -euo pipefail
export GIT_AUTHOR_NAME="Kim Maintainer" GIT_AUTHOR_EMAIL="kim@example.com"
export GIT_COMMITTER_NAME="Kim Maintainer" GIT_COMMITTER_EMAIL="kim@example.com"
commit() { export GIT_AUTHOR_DATE="$1" GIT_COMMITTER_DATE="$1"; git add -A; git commit -q -m "$2"; }
mkdir -p /app/repo && cd /app/repo
git init -q -b main
printf '# inventory service\n\nKeeps track of stock.\n' > README.md
mkdir -p src docs
printf 'def stock(item):\n    return 0\n' > src/stock.py
commit "2024-04-01T10:00:00+00:00" "Initial commit"
printf '# legacy notes\n\nTODO: migrate the old importer\n' > docs/legacy.md
printf 'def report():\n    return "ok"\n' > src/report.py
commit "2024-04-02T10:00:00+00:00" "Add report and legacy notes"
