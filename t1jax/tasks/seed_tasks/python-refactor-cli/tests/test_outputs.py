import csv
import io
import json
import random
import subprocess

import pytest

CLI = "/app/invtool/cli.py"
HEADER = "sku,name,category,qty,unit_price\n"
ROWS = [
    ("A-100", "Widget", "hardware", 12, "2.50"),
    ("A-101", "Widget, Large", "hardware", 9, "4.75"),
    ("B-200", "Cable", "Electronics", 40, "1.10"),
    ("B-201", "Adapter", "electronics", 3, "7.00"),
    ("C-300", "Manual", "books", 100, "0.40"),
    ("C-302", "Atlas", "Books", 12, "2.50"),
    ("C-301", "Gizmo", "hardware", 0, "19.99"),
]


def run(*args):
    return subprocess.run(["python3", CLI, *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def inv(tmp_path):
    path = tmp_path / "inv.csv"
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["sku", "name", "category", "qty", "unit_price"])
    w.writerows(ROWS)
    path.write_text(buf.getvalue())
    return str(path)


def ref(rows, min_qty=0, cats=None, sort="name", desc=False, top=None):
    items = [{"sku": s, "name": n, "category": c, "qty": q, "value": q * float(p)} for s, n, c, q, p in rows]
    items = [i for i in items if i["qty"] >= min_qty and (not cats or i["category"].lower() in {c.lower() for c in cats})]
    items.sort(key=lambda i: i["sku"])
    items.sort(key=lambda i: i[sort], reverse=desc)
    return items[:top] if top else items


def as_json(res):
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_default_table_sorted_by_name(inv):
    res = run("summarize", inv)
    assert res.returncode == 0, res.stderr
    items = ref(ROWS)
    expected = [f"{i['sku']:<10} {i['name']:<24} {i['qty']:>6} {i['value']:>12.2f}" for i in items]
    expected.append(f"TOTAL {sum(i['qty'] for i in items)} {sum(i['value'] for i in items):.2f}")
    assert res.stdout.splitlines() == expected


def test_min_qty_is_numeric(inv):
    got = as_json(run("summarize", inv, "--min-qty", "10", "--format", "json"))
    assert sorted(i["sku"] for i in got["items"]) == ["A-100", "B-200", "C-300", "C-302"]
    got = as_json(run("summarize", "--min-qty=4", inv, "--format", "json"))
    assert len(got["items"]) == 5
    res = run("summarize", inv, "--min-qty", "ten")
    assert res.returncode == 2 and res.stdout == ""


def test_category_repeatable_case_insensitive(inv):
    got = as_json(run("summarize", inv, "--category", "HARDWARE", "--category", "books", "--format", "json"))
    assert [i["sku"] for i in got["items"]] == [i["sku"] for i in ref(ROWS, cats=["hardware", "books"])]
    assert {i["sku"] for i in got["items"]} == {"A-100", "A-101", "C-300", "C-302", "C-301"}
    got = as_json(run("summarize", inv, "--category", "electronics", "--format", "json"))
    assert {i["sku"] for i in got["items"]} == {"B-200", "B-201"}


def test_sort_desc_keeps_sku_tiebreak(inv):
    got = as_json(run("summarize", inv, "--sort", "qty", "--desc", "--format", "json"))
    assert [i["sku"] for i in got["items"]] == ["C-300", "B-200", "A-100", "C-302", "A-101", "B-201", "C-301"]
    got = as_json(run("summarize", inv, "--sort", "value", "--format", "json"))
    assert [i["sku"] for i in got["items"]] == [i["sku"] for i in ref(ROWS, sort="value")]


def test_top_and_totals(inv):
    got = as_json(run("summarize", inv, "--sort", "value", "--desc", "--top", "2", "--format", "json"))
    assert [i["sku"] for i in got["items"]] == ["B-200", "A-101"]
    assert got["total_qty"] == 49 and got["total_value"] == pytest.approx(86.75)
    for bad in ("0", "-1", "x"):
        res = run("summarize", inv, "--top", bad)
        assert res.returncode == 2, bad
        assert res.stdout == ""


def test_csv_format(inv):
    res = run("summarize", inv, "--format", "csv", "--category", "hardware")
    assert res.returncode == 0, res.stderr
    assert res.stdout == ("sku,name,qty,value\nC-301,Gizmo,0,0.00\nA-100,Widget,12,30.00\n"
                          "A-101,\"Widget, Large\",9,42.75\n")


def test_unreadable_file_exit_3(tmp_path):
    missing = str(tmp_path / "nope.csv")
    res = run("summarize", missing)
    assert res.returncode == 3
    assert f"error: cannot read {missing}" in res.stderr and res.stdout == ""


def test_malformed_data_exit_4(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + "A-1,One,x,1,1.00\nA-2,Two,x,2,2.00\nA-3,Three,x,three,3.00\nA-4,Four,x,4,4.00\n")
    res = run("summarize", str(bad))
    assert res.returncode == 4
    assert res.stderr.startswith("error: line 4:") and res.stdout == ""
    bad.write_text(HEADER + "A-1,One,x,1,1.00\nA-2,Two,x,2,cheap\n")
    res = run("summarize", str(bad), "--format", "json")
    assert res.returncode == 4 and res.stderr.startswith("error: line 3:") and res.stdout == ""
    bad.write_text("sku,name,qty,unit_price\nA-1,One,1,1.00\n")
    res = run("summarize", str(bad))
    assert res.returncode == 4 and res.stderr.startswith("error: line 1:") and res.stdout == ""


def test_randomized_inventory_json(tmp_path):
    rnd = random.Random(99)
    cats = ["Tools", "tools", "Garden", "Kitchen"]
    rows = [(f"S-{rnd.randint(100, 999)}-{k}", rnd.choice(["Bolt", "Nut", "Hose", "Pan", "Saw", "Rake"]),
             rnd.choice(cats), rnd.randint(0, 60), f"{rnd.randint(1, 9999) / 100:.2f}") for k in range(60)]
    path = tmp_path / "big.csv"
    path.write_text("unit_price,qty,extra,category,name,sku\n" +
                    "".join(f"{p},{q},zz,{c},{n},{s}\n" for s, n, c, q, p in rows))
    for opts, kw in [([], {}), (["--min-qty", "25"], {"min_qty": 25}),
                     (["--category", "TOOLS", "--sort", "qty", "--desc", "--top", "7"],
                      {"cats": ["tools"], "sort": "qty", "desc": True, "top": 7}),
                     (["--sort", "value", "--top", "5", "--category", "garden", "--category", "kitchen"],
                      {"sort": "value", "top": 5, "cats": ["garden", "kitchen"]})]:
        got = as_json(run("summarize", str(path), "--format", "json", *opts))
        exp = ref(rows, **kw)
        assert [(i["sku"], i["qty"]) for i in got["items"]] == [(i["sku"], i["qty"]) for i in exp], opts
        assert got["total_qty"] == sum(i["qty"] for i in exp)
        assert got["total_value"] == pytest.approx(round(sum(i["value"] for i in exp), 2), abs=0.006)
