#!/bin/bash
# git bisect run with just the failing test, then git revert on a new branch.
set -euo pipefail
cd /app/repo
git bisect start main v0.1
git bisect run python3 -m pytest -q -p no:cacheprovider tests/test_textstats.py::test_word_frequencies
bad=$(git rev-parse refs/bisect/bad)
git bisect reset
echo "$bad" > /app/first_bad_commit.txt
git log -1 --format='first bad: %H %s' "$bad"
git checkout -q -b fix/revert-regression main
git -c user.name="Release Bot" -c user.email="bot@example.com" revert --no-edit "$bad"
python3 -m pytest -q -p no:cacheprovider tests/test_textstats.py::test_word_frequencies
git status --porcelain
git log --oneline -3
