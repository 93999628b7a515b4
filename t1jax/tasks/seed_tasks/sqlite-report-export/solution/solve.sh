#!/bin/bash
# SQL with the sqlite3 CLI for the CSV; a small Python/sqlite3 script for the JSON summary.
set -euo pipefail
cd /app
mkdir -p report
sqlite3 -header -csv shop.db > report/monthly_revenue.csv <<'SQL'
WITH paid AS (
  SELECT o.id, substr(o.ordered_at, 1, 7) AS month,
         (SELECT SUM(quantity * unit_price_cents) FROM order_items WHERE order_id = o.id) AS cents
  FROM orders o WHERE o.status = 'paid')
SELECT month, COUNT(*) AS orders,
       printf('%.2f', SUM(cents) / 100.0) AS revenue,
       printf('%.2f', round(SUM(cents) / 100.0 / COUNT(*), 2)) AS avg_order_value
FROM paid GROUP BY month ORDER BY month;
SQL
sed -i 's/\r$//' report/monthly_revenue.csv
python3 - <<'PY'
import json
import sqlite3

db = sqlite3.connect("file:/app/shop.db?mode=ro", uri=True)
q = lambda sql: db.execute(sql).fetchall()
paid_orders = q("SELECT COUNT(*) FROM orders WHERE status = 'paid'")[0][0]
total = q("""SELECT SUM(i.quantity * i.unit_price_cents) FROM order_items i
             JOIN orders o ON o.id = i.order_id WHERE o.status = 'paid'""")[0][0]
top = q("""SELECT c.name, SUM(i.quantity * i.unit_price_cents) AS cents
           FROM order_items i JOIN orders o ON o.id = i.order_id JOIN customers c ON c.id = o.customer_id
           WHERE o.status = 'paid' GROUP BY c.id ORDER BY cents DESC, c.name ASC LIMIT 3""")
cats = q("""SELECT p.category, SUM(i.quantity * i.unit_price_cents)
            FROM order_items i JOIN orders o ON o.id = i.order_id JOIN products p ON p.id = i.product_id
            WHERE o.status = 'paid' GROUP BY p.category ORDER BY p.category""")
summary = {
    "paid_orders": paid_orders,
    "total_revenue": round(total / 100, 2),
    "top_customers": [{"name": n, "revenue": round(c / 100, 2)} for n, c in top],
    "revenue_by_category": {k: round(c / 100, 2) for k, c in cats},
}
with open("/app/report/summary.json", "w") as f:
    json.dump(summary, f, indent=2)
print(json.dumps(summary, indent=2))
PY
cat report/monthly_revenue.csv
