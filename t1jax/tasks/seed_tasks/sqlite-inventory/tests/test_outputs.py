import csv
import sqlite3

DB = "/app/inventory.db"
ORIGINAL_PRICES = {
    "EL-100": 9.90, "EL-101": 24.50, "EL-102": 49.00, "EL-103": 219.99, "EL-104": 35.20,
    "EL-105": 79.95, "OF-200": 6.75, "OF-201": 4.20, "OF-202": 18.00, "OF-203": 59.90,
    "FU-300": 129.00, "FU-301": 349.00, "FU-302": 89.50,
}
# (sku, name, stock, supplier_name) ordered by stock, sku
LOW_STOCK = [
    ("EL-102", "Keyboard", 0, "Nordic Parts"),
    ("OF-203", "Whiteboard", 2, "Kumo Ltd"),
    ("EL-104", "Webcam", 3, "Acme Corp"),
    ("FU-300", "Office Chair", 4, "Nordic Parts"),
    ("EL-101", "Wireless Mouse", 7, "Nordic Parts"),
    ("EL-105", "Headset, Pro", 9, "Kumo Ltd"),
    ("FU-302", "Bookshelf", 9, "Acme Corp"),
    ("OF-201", "Paper A4 (500)", 9, "Nordic Parts"),
]


def _db():
    return sqlite3.connect(f"file:{DB}?mode=ro", uri=True)


def test_electronics_prices_increased_once():
    with _db() as con:
        rows = dict(con.execute("SELECT sku, price FROM products").fetchall())
    assert set(rows) == set(ORIGINAL_PRICES)
    for sku, old in ORIGINAL_PRICES.items():
        want = round(old * 1.10, 2) if sku.startswith("EL-") else old
        assert abs(rows[sku] - want) < 0.006, (sku, rows[sku], want)


def test_low_stock_view():
    with _db() as con:
        kind = con.execute("SELECT type FROM sqlite_master WHERE name='low_stock'").fetchone()
        assert kind == ("view",)
        cur = con.execute("SELECT * FROM low_stock ORDER BY stock, sku")
        cols = [d[0] for d in cur.description]
        rows = cur.fetchall()
    assert cols == ["sku", "name", "stock", "supplier_name"]
    assert [tuple(r) for r in rows] == LOW_STOCK


def test_restock_orders_table():
    with _db() as con:
        kind = con.execute("SELECT type FROM sqlite_master WHERE name='restock_orders'").fetchone()
        assert kind == ("table",)
        info = {r[1]: r for r in con.execute("PRAGMA table_info(restock_orders)")}
        rows = dict(con.execute("SELECT sku, quantity FROM restock_orders").fetchall())
    assert set(info) == {"sku", "quantity"}
    assert info["sku"][5] == 1, "sku must be the primary key"
    assert info["quantity"][3] == 1, "quantity must be NOT NULL"
    assert rows == {sku: 20 - stock for sku, _, stock, _ in LOW_STOCK}


def test_csv_export():
    with open("/app/low_stock.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["sku", "name", "stock", "supplier_name"]
    assert rows[1:] == [[str(x) for x in r] for r in LOW_STOCK]
