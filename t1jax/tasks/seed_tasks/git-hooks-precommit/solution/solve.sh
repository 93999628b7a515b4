#!/bin/bash
# The hook lists staged A/C/M/R files NUL-separated and inspects the index blobs (git cat-file).
set -euo pipefail
cat > /app/repo/.git/hooks/pre-commit <<'SH'
#!/bin/bash
# Reject commits whose staged files are larger than 102400 bytes or contain TODO/FIXME markers.
limit=102400
fail=0
while IFS= read -r -d '' path; do
  size=$(git cat-file -s ":$path")
  if [ "$size" -gt "$limit" ]; then
    echo "pre-commit: $path is larger than $limit bytes" >&2
    fail=1
  fi
  # markers are checked in text files only (no NUL byte in the staged blob)
  if [ "$(git cat-file blob ":$path" | tr -d -c '\000' | wc -c)" -eq 0 ] &&
     git cat-file blob ":$path" | LC_ALL=C grep -qwE 'TODO|FIXME'; then
    echo "pre-commit: $path contains a TODO/FIXME marker" >&2
    fail=1
  fi
done < <(git diff --cached --name-only -z --diff-filter=ACMR)
exit $fail
SH
chmod +x /app/repo/.git/hooks/pre-commit
# try it in a scratch copy
rm -rf /tmp/hooktest && cp -a /app/repo /tmp/hooktest && cd /tmp/hooktest
echo "# TODO later" > "a b.txt" && git add "a b.txt"
if git -c user.name=t -c user.email=t@e commit -q -m test; then echo "UNEXPECTED: accepted"; exit 1; fi
echo "rejected as expected"
rm -rf /tmp/hooktest
