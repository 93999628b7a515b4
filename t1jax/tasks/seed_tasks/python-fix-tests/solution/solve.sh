#!/bin/bash
# Fix the four bugs in billing/money.py, then run the local test suite.
set -euo pipefail
cd /app
python3 - <<'PY'
p = "billing/money.py"
s = open(p).read()

def sub(old, new):
    global s
    assert old in s, old
    s = s.replace(old, new)

# 1. half-up rounding
sub("from decimal import ROUND_HALF_EVEN, Decimal", "from decimal import ROUND_HALF_UP, Decimal")
sub("rounding=ROUND_HALF_EVEN", "rounding=ROUND_HALF_UP")
# 2. accounting-style negatives in parentheses
sub('''    s = text.strip()
    negative = False
    if s.startswith("-"):''', '''    s = text.strip()
    negative = False
    if s.startswith("(") and s.endswith(")") and len(s) > 2:
        negative = True
        s = s[1:-1]
        if s.startswith("$"):
            s = s[1:]
        if not _NUMBER.fullmatch(s):
            raise ValueError(f"not an amount: {text!r}")
        return -Decimal(s.replace(",", ""))
    if s.startswith("-"):''')
# 3. sign before the dollar sign
sub('''    q = _cents(value)
    return f"${q:,.2f}"''', '''    q = _cents(value)
    sign = "-" if q < 0 else ""
    return f"{sign}${abs(q):,.2f}"''')
# 4. spread the remainder over the first parts
sub('''    result = [Decimal(base) / 100 for _ in range(parts)]
    result[-1] += Decimal(extra) / 100
    return result''', '''    return [Decimal(base + (1 if i < extra else 0)) / 100 for i in range(parts)]''')
# 5. 0 and 100 percent are valid
sub("if not 0 < percent < 100:", "if not 0 <= percent <= 100:")
open(p, "w").write(s)
PY
python3 -m pytest -q -p no:cacheprovider tests_local
find /app -name __pycache__ -prune -exec rm -rf {} +
