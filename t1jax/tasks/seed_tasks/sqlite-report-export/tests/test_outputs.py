import collections
import csv
import hashlib
import json
import os
import re
import sqlite3

DB = "/app/shop.db"
CSV_PATH = "/app/report/monthly_revenue.csv"
JSON_PATH = "/app/report/summary.json"
DB_SHA256 = "b38fe006d494442d2ebcb5834e2a1dd7f1266b4ebe29445bb1b967614e4739ad"


def _paid():
    """order id -> (month, customer name, {category: cents}, total cents)"""
    db = sqlite3.connect(f"file:{DB}?mode=ro", uri=True)
    rows = db.execute("""SELECT o.id, o.ordered_at, c.name, p.category, i.quantity * i.unit_price_cents
                         FROM orders o JOIN customers c ON c.id = o.customer_id
                         JOIN order_items i ON i.order_id = o.id JOIN products p ON p.id = i.product_id
                         WHERE o.status = 'paid'""").fetchall()
    db.close()
    orders = {}
    for oid, ts, name, cat, cents in rows:
        o = orders.setdefault(oid, {"month": ts[:7], "name": name, "cats": collections.Counter(), "cents": 0})
        o["cats"][cat] += cents
        o["cents"] += cents
    return orders


def _csv_rows():
    assert os.path.isfile(CSV_PATH), f"missing {CSV_PATH}"
    with open(CSV_PATH, newline="") as f:
        return list(csv.reader(f))


def _summary():
    assert os.path.isfile(JSON_PATH), f"missing {JSON_PATH}"
    with open(JSON_PATH) as f:
        data = json.load(f)
    assert isinstance(data, dict)
    return data


def test_csv_header_and_months():
    rows = _csv_rows()
    assert rows[0] == ["month", "orders", "revenue", "avg_order_value"]
    months = sorted({o["month"] for o in _paid().values()})
    assert [r[0] for r in rows[1:]] == months
    assert "2023-10" not in months


def test_csv_orders_and_revenue():
    by_month = collections.defaultdict(list)
    for o in _paid().values():
        by_month[o["month"]].append(o["cents"])
    for month, orders, revenue, avg in _csv_rows()[1:]:
        assert int(orders) == len(by_month[month]), month
        assert re.fullmatch(r"\d+\.\d\d", revenue), revenue
        assert revenue == f"{sum(by_month[month]) / 100:.2f}", month
        assert re.fullmatch(r"\d+\.\d\d", avg), avg
        assert abs(float(avg) - sum(by_month[month]) / 100 / len(by_month[month])) <= 0.0051, month


def test_summary_totals():
    s = _summary()
    assert set(s) == {"paid_orders", "total_revenue", "top_customers", "revenue_by_category"}
    orders = _paid()
    assert s["paid_orders"] == len(orders) and type(s["paid_orders"]) is int
    assert abs(s["total_revenue"] - sum(o["cents"] for o in orders.values()) / 100) < 0.006


def test_summary_top_customers():
    per = collections.Counter()
    for o in _paid().values():
        per[o["name"]] += o["cents"]
    ranked = sorted(per.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    got = _summary()["top_customers"]
    assert [c["name"] for c in got] == [n for n, _ in ranked]
    for c, (_, cents) in zip(got, ranked):
        assert set(c) == {"name", "revenue"} and abs(c["revenue"] - cents / 100) < 0.006


def test_summary_revenue_by_category():
    per = collections.Counter()
    for o in _paid().values():
        per.update(o["cats"])
    got = _summary()["revenue_by_category"]
    assert set(got) == set(per)
    for cat, cents in per.items():
        assert abs(got[cat] - cents / 100) < 0.006, cat


def test_invariant_db_unchanged():
    with open(DB, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == DB_SHA256
