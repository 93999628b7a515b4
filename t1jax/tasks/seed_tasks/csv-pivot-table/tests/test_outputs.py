import csv
import hashlib
import os

SRC = "/app/measurements.csv"
OUT = "/app/wide.csv"
SRC_SHA256 = "232b05ce5733f6845fad90f1ac62d5f82feb0bdc5dddd8b146e1753f2a93af0d"
METRICS = ["temp", "humidity", "wind", "pressure"]


def _expected():
    with open(SRC, newline="") as f:
        rows = list(csv.DictReader(f))
    keys, vals = set(), {}
    for r in rows:
        keys.add((r["station"], r["date"]))
        vals[(r["station"], r["date"], r["metric"])] = r["value"]
    out = []
    for st, d in sorted(keys, key=lambda k: (k[0].encode(), k[1].encode())):
        out.append([st, d] + [vals.get((st, d, m), "NA") for m in METRICS])
    return out


def _lines():
    assert os.path.isfile(OUT), "missing /app/wide.csv"
    with open(OUT, "rb") as f:
        data = f.read()
    assert b"\r" not in data, "use \\n line endings"
    return data.decode().splitlines()


def test_header():
    assert _lines()[0] == "station,date,temp,humidity,wind,pressure"


def test_row_keys_and_order():
    got = [l.split(",")[:2] for l in _lines()[1:]]
    assert got == [r[:2] for r in _expected()]


def test_values_last_occurrence_wins():
    got = [l.split(",") for l in _lines()[1:]]
    assert got == _expected()


def test_missing_values_are_na():
    got = [l.split(",") for l in _lines()[1:]]
    na = sum(row.count("NA") for row in got)
    assert na > 0 and na == sum(row.count("NA") for row in _expected())
    assert all(len(row) == 6 for row in got)


def test_invariant_source_unchanged():
    with open(SRC, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == SRC_SHA256
