import hashlib
import os
import random
import shutil
import sqlite3
import subprocess

import pytest

DB = "/app/shop.db"
SCRIPT = "/app/migrate.sh"
ORDERS_SHA256 = "74568443e7ea115d4bb408d288f344e4916bba91178234cc14b2b14f5cebcdee"
CUSTOMERS_SHA256 = "8db3a12d38122f2ffa1edac0a971388788896d3590ec21a2de672bb7fe744351"
V1_SCHEMA = """
CREATE TABLE schema_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL,
                        created_at TEXT NOT NULL);
CREATE UNIQUE INDEX idx_customers_email ON customers(email);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     amount_cents INTEGER NOT NULL, status TEXT NOT NULL, created_at TEXT NOT NULL);
INSERT INTO schema_meta (key, value) VALUES ('version', '1');
"""


def q(path, sql, args=()):
    con = sqlite3.connect(path)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def dump(path):
    con = sqlite3.connect(path)
    try:
        return "\n".join(con.iterdump())
    finally:
        con.close()


def expected_tiers(path):
    """(id -> (lifetime_cents, tier)) recomputed from the orders table."""
    out = {}
    for (cid,) in q(path, "SELECT id FROM customers"):
        total = sum(a for (a,) in q(path, "SELECT amount_cents FROM orders WHERE customer_id = ? "
                                          "AND status = 'paid'", (cid,)))
        tier = "gold" if total >= 100000 else "silver" if total >= 25000 else "standard"
        out[cid] = (total, tier)
    return out


def make_v1(path, seed, bad_status=False):
    rng = random.Random(seed)
    con = sqlite3.connect(path)
    con.executescript(V1_SCHEMA)
    for cid in range(1, 16):
        con.execute("INSERT INTO customers VALUES (?, ?, ?, ?)",
                    (cid * 3, f"C{cid}", f"c{cid}@test.org", "2024-01-01"))
    oid = 1
    # exact tier boundaries for the first three customers
    for cid, amounts in ((3, [60000, 40000]), (6, [25000]), (9, [24999, 50000])):
        for i, a in enumerate(amounts):
            con.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
                        (oid, cid, a, "paid" if i == 0 else "refunded", "2024-02-01 10:00:00"))
            oid += 1
    for cid in range(4, 15):
        for _ in range(rng.randint(0, 6)):
            con.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
                        (oid, cid * 3, rng.randint(100, 60000), rng.choice(["paid", "paid", "pending", "refunded"]),
                         f"2024-03-{rng.randint(1, 28):02d} 09:00:00"))
            oid += 1
    if bad_status:
        con.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", (oid, 3, 500, "cancelled", "2024-04-01 00:00:00"))
    con.commit()
    con.close()


def run(path):
    return subprocess.run([SCRIPT, str(path)], capture_output=True, text=True, timeout=60)


def columns(path, table):
    return {r[1]: r for r in q(path, f"PRAGMA table_info({table})")}


def index_columns(path, name):
    return [r[2] for r in q(path, f"PRAGMA index_info({name})")]


def check_v2(path):
    assert q(path, "SELECT value FROM schema_meta WHERE key = 'version'") == [("2",)]
    cols = columns(path, "customers")
    assert cols["lifetime_cents"][2].upper() == "INTEGER" and cols["lifetime_cents"][3] == 1
    assert cols["tier"][2].upper() == "TEXT" and cols["tier"][3] == 1
    got = {cid: (lc, tier) for cid, lc, tier in q(path, "SELECT id, lifetime_cents, tier FROM customers")}
    assert got == expected_tiers(path)
    assert index_columns(path, "idx_orders_customer_created") == ["customer_id", "created_at"]


@pytest.fixture
def shop_copy(tmp_path):
    dst = tmp_path / "shop.db"
    shutil.copyfile(DB, dst)
    return dst


def test_shop_db_at_version_2():
    assert q(DB, "SELECT value FROM schema_meta WHERE key = 'version'") == [("2",)]
    cols = columns(DB, "customers")
    assert set(cols) == {"id", "name", "email", "created_at", "lifetime_cents", "tier"}
    assert cols["lifetime_cents"][3] == 1 and str(cols["lifetime_cents"][4]) == "0"
    assert cols["tier"][3] == 1 and cols["tier"][4] == "'standard'"


def test_shop_db_backfill():
    got = {cid: (lc, tier) for cid, lc, tier in q(DB, "SELECT id, lifetime_cents, tier FROM customers")}
    expected = expected_tiers(DB)
    assert got == expected
    assert {t for _, t in expected.values()} == {"gold", "silver", "standard"}


def test_shop_db_constraints(shop_copy):
    con = sqlite3.connect(shop_copy)
    con.execute("INSERT INTO customers (id, name, email, created_at) VALUES (999, 'N', 'n@x.org', '2024-05-05')")
    assert con.execute("SELECT lifetime_cents, tier FROM customers WHERE id = 999").fetchone() == (0, "standard")
    with pytest.raises(sqlite3.IntegrityError):
        con.execute("UPDATE customers SET tier = 'platinum' WHERE id = 999")
    with pytest.raises(sqlite3.IntegrityError):
        con.execute("INSERT INTO orders (id, customer_id, amount_cents, status, created_at) "
                    "VALUES (1, 999, 100, 'lost', '2024-05-05 00:00:00')")
    con.execute("INSERT INTO orders (id, customer_id, amount_cents, status, created_at) "
                "VALUES (2, 999, 100, 'pending', '2024-05-05 00:00:00')")
    con.close()


def test_shop_db_indexes_and_integrity():
    assert index_columns(DB, "idx_orders_customer_created") == ["customer_id", "created_at"]
    assert index_columns(DB, "idx_customers_email") == ["email"]
    assert [r for r in q(DB, "PRAGMA index_list(customers)") if r[1] == "idx_customers_email"][0][2] == 1
    assert q(DB, "PRAGMA integrity_check") == [("ok",)]
    assert q(DB, "PRAGMA foreign_key_check") == []
    fks = q(DB, "PRAGMA foreign_key_list(orders)")
    assert [(r[2], r[3], r[4]) for r in fks] == [("customers", "customer_id", "id")]


def test_script_migrates_fresh_v1_db(tmp_path):
    db = tmp_path / "fresh.db"
    make_v1(db, seed=11)
    res = run(db)
    assert res.returncode == 0, res.stderr
    check_v2(db)
    tiers = dict((cid, t) for cid, t in q(db, "SELECT id, tier FROM customers"))
    assert tiers[3] == "silver" and tiers[6] == "silver" and tiers[9] == "standard"


def test_script_idempotent_on_v2(tmp_path):
    db = tmp_path / "twice.db"
    make_v1(db, seed=12)
    assert run(db).returncode == 0
    before = dump(db)
    res = run(db)
    assert res.returncode == 0, res.stderr
    assert dump(db) == before


def test_script_rejects_other_versions(tmp_path):
    db = tmp_path / "v7.db"
    make_v1(db, seed=13)
    con = sqlite3.connect(db)
    con.execute("UPDATE schema_meta SET value = '7' WHERE key = 'version'")
    con.commit()
    con.close()
    before = dump(db)
    res = run(db)
    assert res.returncode == 1 and res.stderr.strip()
    assert dump(db) == before


def test_script_atomic_on_failure(tmp_path):
    db = tmp_path / "bad.db"
    make_v1(db, seed=14, bad_status=True)
    before = dump(db)
    res = run(db)
    assert res.returncode != 0
    assert dump(db) == before
    assert q(db, "SELECT value FROM schema_meta WHERE key = 'version'") == [("1",)]


def test_invariant_rows_preserved():
    orders = q(DB, "SELECT id, customer_id, amount_cents, status, created_at FROM orders ORDER BY id")
    customers = q(DB, "SELECT id, name, email, created_at FROM customers ORDER BY id")
    assert hashlib.sha256(repr(orders).encode()).hexdigest() == ORDERS_SHA256
    assert hashlib.sha256(repr(customers).encode()).hexdigest() == CUSTOMERS_SHA256
