#!/bin/bash
# Build /app/repo with a fixed history (fixed identities and dates => reproducible hashes).
set -euo pipefail
as_alice() { export GIT_AUTHOR_NAME="Alice Main" GIT_AUTHOR_EMAIL="alice@example.com"
             export GIT_COMMITTER_NAME="Alice Main" GIT_COMMITTER_EMAIL="alice@example.com"; }
as_bob() { export GIT_AUTHOR_NAME="Bob Feature" GIT_AUTHOR_EMAIL="bob@example.com"
           export GIT_COMMITTER_NAME="Bob Feature" GIT_COMMITTER_EMAIL="bob@example.com"; }
commit() { export GIT_AUTHOR_DATE="$1" GIT_COMMITTER_DATE="$1"; git add -A; git commit -q -m "$2"; }

mkdir -p /app/repo && cd /app/repo
git init -q -b main
git config user.name "Repo Maintainer"
git config user.email "maintainer@example.com"

as_alice
mkdir -p app tests
printf '# app\n\nA tiny command-line app.\n' > README.md
echo "1.0.0" > VERSION
: > app/__init__.py
cat > app/cli.py <<'PY'
import argparse


def build_parser():
    parser = argparse.ArgumentParser(prog="app")
    parser.add_argument("--name", default="world")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    print(f"hello {args.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
PY
commit "2024-02-01T09:00:00+00:00" "Initial commit"
cat > app/config.py <<'PY'
import json


def load_config(path):
    with open(path) as f:
        return json.load(f)
PY
commit "2024-02-02T09:00:00+00:00" "Add config loader"

git checkout -q -b feature/search
as_bob
cat > app/search.py <<'PY'
def search(items, query):
    """Return the items containing query."""
    return [item for item in items if query in item]
PY
commit "2024-02-03T10:00:00+00:00" "Add search module"
cat > app/search.py <<'PY'
def search(items, query):
    """Return the items containing query, ignoring case."""
    q = query.lower()
    return [item for item in items if q in item.lower()]
PY
commit "2024-02-04T10:00:00+00:00" "fixup! Add search module"
python3 - <<'PY'
p = "app/cli.py"
s = open(p).read()
s = s.replace('    parser.add_argument("--name", default="world")\n',
              '    parser.add_argument("--name", default="world")\n'
              '    parser.add_argument("--query", help="text to search for")\n')
s = s.replace('    args = build_parser().parse_args(argv)\n',
              '    args = build_parser().parse_args(argv)\n'
              '    if args.query is not None:\n'
              '        from app.search import search\n'
              '        for line in search(["Apple pie", "banana split", "Cherry tart"], args.query):\n'
              '            print(line)\n'
              '        return 0\n')
open(p, "w").write(s)
PY
commit "2024-02-05T10:00:00+00:00" "Add serach CLI flag"
sed -i 's/^    q = query.lower()$/    print("DEBUG search", items, query)\n    q = query.lower()/' app/search.py
printf 'debugging notes, do not commit\n' > debug_notes.txt
commit "2024-02-06T10:00:00+00:00" "WIP debug prints"
sed -i 's/"Cherry tart"\]/"Cherry tart", "Durian cake"]/' app/cli.py
commit "2024-02-07T10:00:00+00:00" "fixup! Add serach CLI flag"
cat > tests/test_search.py <<'PY'
from app.search import search


def test_search_ignores_case():
    assert search(["Apple", "banana", "APRICOT"], "ap") == ["Apple", "APRICOT"]


def test_search_no_match():
    assert search(["x", "y"], "z") == []
PY
commit "2024-02-08T10:00:00+00:00" "Add search tests"

git checkout -q main
as_alice
sed -i 's/^    parser.add_argument("--name", default="world")$/&\n    parser.add_argument("--verbose", action="store_true", help="print more")/' app/cli.py
commit "2024-02-09T09:00:00+00:00" "Add verbose flag"
echo "1.1.0" > VERSION
commit "2024-02-10T09:00:00+00:00" "Bump version to 1.1.0"
git checkout -q feature/search
git log --oneline --all --graph
