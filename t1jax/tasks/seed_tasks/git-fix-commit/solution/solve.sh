#!/bin/bash
# Branch off main, restore the correct average(), commit with the required identity.
set -euo pipefail
cd /app/repo
git checkout -q -b fix/average main
python3 - <<'PY'
import re
src = open("calc.py").read()
src = re.sub(r"    total = 0\n    for i in range\(1, len\(xs\)\):\n        total \+= xs\[i\]\n    return total / len\(xs\)\n",
             "    return sum(xs) / len(xs)\n", src)
open("calc.py", "w").write(src)
PY
python3 -c 'import calc; assert calc.average([1, 2, 3]) == 2'
rm -rf __pycache__
git add calc.py
git -c user.name="Dana Fixer" -c user.email="dana@example.com" \
  commit -q --author="Dana Fixer <dana@example.com>" -m "Fix off-by-one in average"
git log --oneline -n 2
git status --short
