import collections
import csv
import hashlib
import json
import os

SUMMARY = "/app/summary.json"
CSV_PATH = "/app/sales.csv"
CSV_SHA256 = "81750cbc817cf209e489bfabd7a1e1acb5cb9148ff1810a1270dfd4144b6e818"
KEYS = {"total_orders", "total_revenue", "revenue_by_region", "top_product", "monthly_orders"}


def _summary():
    assert os.path.isfile(SUMMARY), "missing /app/summary.json"
    with open(SUMMARY) as f:
        data = json.load(f)
    assert isinstance(data, dict)
    return data


def _expected():
    with open(CSV_PATH, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "completed"]
    by_region, qty, months = collections.defaultdict(float), collections.Counter(), collections.Counter()
    total = 0.0
    for r in rows:
        rev = int(r["quantity"]) * float(r["unit_price"])
        total += rev
        by_region[r["region"]] += rev
        qty[r["product"]] += int(r["quantity"])
        months[r["date"][:7]] += 1
    top = sorted(qty.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    return {"total_orders": len(rows), "total_revenue": total, "revenue_by_region": dict(by_region),
            "top_product": top, "monthly_orders": dict(months)}


def test_exact_keys():
    assert set(_summary().keys()) == KEYS


def test_total_orders():
    got = _summary()["total_orders"]
    assert isinstance(got, int) and got == _expected()["total_orders"]


def test_total_revenue():
    got = _summary()["total_revenue"]
    assert isinstance(got, (int, float))
    assert abs(got - _expected()["total_revenue"]) < 0.011
    assert round(got, 2) == got


def test_revenue_by_region():
    got, exp = _summary()["revenue_by_region"], _expected()["revenue_by_region"]
    assert set(got) == set(exp)
    for region, value in exp.items():
        assert abs(got[region] - value) < 0.011, region


def test_top_product():
    assert _summary()["top_product"] == _expected()["top_product"]


def test_monthly_orders():
    assert _summary()["monthly_orders"] == _expected()["monthly_orders"]


def test_invariant_csv_unchanged():
    with open(CSV_PATH, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == CSV_SHA256
