#!/bin/bash
# Interactive rebase driven by scripted editors: autosquash, reword, drop, resolve the conflict.
set -euo pipefail
cd /app/repo
git checkout -q feature/search
git tag search-before-rebase feature/search

export GIT_SEQUENCE_EDITOR="sed -i -e 's/^pick \([0-9a-f]*\) WIP debug prints$/drop \1 WIP debug prints/' -e 's/^pick \([0-9a-f]*\) Add serach CLI flag$/reword \1 Add serach CLI flag/'"
export GIT_EDITOR="sed -i -e '1s/^Add serach CLI flag$/Add search CLI flag/'"

resolve_cli() {
  # keep main's lines (HEAD side) followed by the branch's lines
  python3 - <<'PY'
import re
p = "app/cli.py"
s = open(p).read()
s = re.sub(r"<<<<<<< [^\n]*\n(.*?)=======\n(.*?)>>>>>>> [^\n]*\n", r"\1\2", s, flags=re.S)
open(p, "w").write(s)
PY
  git add app/cli.py
}

if ! git rebase -i --autosquash main; then
  for _ in 1 2 3 4 5; do
    [ -d .git/rebase-merge ] || break
    if git diff --name-only --diff-filter=U | grep -qx app/cli.py; then
      resolve_cli
    fi
    git rebase --continue && break || true
  done
fi
[ ! -d .git/rebase-merge ] || { echo "rebase still in progress" >&2; exit 1; }

git log --format='%h %an %ad %s' --date=iso-strict main~2..feature/search
python3 -m app.cli --query an
python3 -m pytest -q -p no:cacheprovider tests
find . -name __pycache__ -prune -exec rm -rf {} +
git status --short
