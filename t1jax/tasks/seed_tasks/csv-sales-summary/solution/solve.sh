#!/bin/bash
# Aggregate completed rows of /app/sales.csv into /app/summary.json.
set -euo pipefail
cd /app
python3 - <<'PY'
import collections, csv, json
with open("sales.csv", newline="") as f:
    rows = [r for r in csv.DictReader(f) if r["status"] == "completed"]
total, by_region = 0.0, collections.defaultdict(float)
qty, months = collections.Counter(), collections.Counter()
for r in rows:
    rev = int(r["quantity"]) * float(r["unit_price"])
    total += rev
    by_region[r["region"]] += rev
    qty[r["product"]] += int(r["quantity"])
    months[r["date"][:7]] += 1
summary = {
    "total_orders": len(rows),
    "total_revenue": round(total, 2),
    "revenue_by_region": {k: round(v, 2) for k, v in sorted(by_region.items())},
    "top_product": min(qty, key=lambda p: (-qty[p], p)),
    "monthly_orders": dict(sorted(months.items())),
}
with open("summary.json", "w") as f:
    json.dump(summary, f, indent=2)
print(json.dumps(summary, indent=2))
PY
