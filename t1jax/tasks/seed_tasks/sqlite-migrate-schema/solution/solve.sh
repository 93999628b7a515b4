#!/bin/bash
# Write /app/migrate.sh (v1 -> v2 in one transaction, idempotent) and apply it to /app/shop.db.
set -euo pipefail
cat > /app/migrate.sh <<'SCRIPT'
#!/bin/bash
# Usage: migrate.sh DB_FILE   -- migrate the shop database from schema version 1 to 2.
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DB_FILE" >&2; exit 2; }
db=$1
[ -f "$db" ] || { echo "migrate.sh: no such database: $db" >&2; exit 1; }

version=$(sqlite3 -batch "$db" "SELECT value FROM schema_meta WHERE key = 'version';" 2>/dev/null) || version=""
case "$version" in
  2) echo "already at version 2"; exit 0 ;;
  1) ;;
  *) echo "migrate.sh: unsupported schema version '${version}' (expected 1)" >&2; exit 1 ;;
esac

# -bail stops at the first error; the open transaction is then rolled back on exit.
sqlite3 -batch -bail "$db" <<'SQL'
PRAGMA foreign_keys = OFF;
BEGIN IMMEDIATE;

ALTER TABLE customers ADD COLUMN lifetime_cents INTEGER NOT NULL DEFAULT 0;
ALTER TABLE customers ADD COLUMN tier TEXT NOT NULL DEFAULT 'standard'
    CHECK (tier IN ('standard', 'silver', 'gold'));

UPDATE customers SET lifetime_cents = COALESCE(
    (SELECT SUM(o.amount_cents) FROM orders o
      WHERE o.customer_id = customers.id AND o.status = 'paid'), 0);
UPDATE customers SET tier = CASE
    WHEN lifetime_cents >= 100000 THEN 'gold'
    WHEN lifetime_cents >= 25000 THEN 'silver'
    ELSE 'standard' END;

CREATE TABLE orders_new (
    id           INTEGER PRIMARY KEY,
    customer_id  INTEGER NOT NULL REFERENCES customers(id),
    amount_cents INTEGER NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('paid', 'refunded', 'pending')),
    created_at   TEXT NOT NULL
);
INSERT INTO orders_new (id, customer_id, amount_cents, status, created_at)
    SELECT id, customer_id, amount_cents, status, created_at FROM orders;
DROP TABLE orders;
ALTER TABLE orders_new RENAME TO orders;
CREATE INDEX idx_orders_customer_created ON orders(customer_id, created_at);

UPDATE schema_meta SET value = '2' WHERE key = 'version';
COMMIT;
SQL
rc=$?
if [ $rc -ne 0 ]; then
  echo "migrate.sh: migration failed, database left unchanged" >&2
  exit 1
fi
fk=$(sqlite3 -batch "$db" "PRAGMA foreign_key_check;")
[ -z "$fk" ] || echo "migrate.sh: warning: foreign key violations: $fk" >&2
echo "migrated to version 2"
SCRIPT
chmod 755 /app/migrate.sh
/app/migrate.sh /app/shop.db
/app/migrate.sh /app/shop.db
sqlite3 /app/shop.db "SELECT tier, COUNT(*) FROM customers GROUP BY tier; PRAGMA integrity_check;"
