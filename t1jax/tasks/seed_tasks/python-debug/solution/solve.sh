#!/bin/bash
# Fix the three bugs: integer division in mean, wrong even-length median index, mode tie-break.
set -euo pipefail
cd /app
sed -i 's|return sum(xs) // len(xs)|return sum(xs) / len(xs)|' stats.py
sed -i 's|return (s\[n // 2\] + s\[n // 2 + 1\]) / 2|return (s[n // 2 - 1] + s[n // 2]) / 2|' stats.py
sed -i 's|return max(v for v, c in counts.items() if c == best)|return min(v for v, c in counts.items() if c == best)|' stats.py
echo "1 2 2 9" | python3 stats.py
