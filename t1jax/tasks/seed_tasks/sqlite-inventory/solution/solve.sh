#!/bin/bash
# Apply the inventory changes with sqlite3 and export the low-stock view.
set -euo pipefail
cd /app
sqlite3 inventory.db <<'SQL'
BEGIN;
UPDATE products SET price = ROUND(price * 1.10, 2) WHERE category = 'electronics';
CREATE VIEW low_stock AS
  SELECT p.sku, p.name, p.stock, s.name AS supplier_name
  FROM products p JOIN suppliers s ON s.id = p.supplier_id
  WHERE p.stock < 10;
CREATE TABLE restock_orders (sku TEXT PRIMARY KEY, quantity INTEGER NOT NULL);
INSERT INTO restock_orders (sku, quantity) SELECT sku, 20 - stock FROM low_stock;
COMMIT;
SQL
sqlite3 -header -csv inventory.db \
  "SELECT sku, name, stock, supplier_name FROM low_stock ORDER BY stock, sku;" > low_stock.csv
cat low_stock.csv
