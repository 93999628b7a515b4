import csv
import hashlib
import os

REPORT = "/app/out/department_report.csv"
UNMATCHED = "/app/out/unmatched_employees.csv"
HEADER = ["dept_id", "dept_name", "location", "headcount", "total_salary", "avg_salary", "top_earner"]
INPUT_SHA256 = {
    "/app/data/employees.csv": "f469a5116f01e9ca29f3b408a97e4cb332fd9d7e30739787f7226cbd7dece1f8",
    "/app/data/departments.csv": "b8c199559216bc3ca15ae51e79fa97d9996c6680d2da03a9443f38d576ae3bf7",
}


def _read(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def _inputs():
    with open("/app/data/departments.csv", newline="") as f:
        depts = {r["dept_id"]: r for r in csv.DictReader(f)}
    with open("/app/data/employees.csv", newline="") as f:
        emps = list(csv.DictReader(f))
    return depts, emps


def _expected_rows():
    depts, emps = _inputs()
    out = {}
    for dept_id, d in depts.items():
        members = [e for e in emps if e["dept_id"] == dept_id]
        sal = [int(e["salary"]) for e in members]
        top = min((-int(e["salary"]), e["name"].encode()) for e in members)[1].decode() if members else ""
        out[dept_id] = {"dept_name": d["dept_name"], "location": d["location"],
                        "headcount": len(sal), "total_salary": sum(sal),
                        "avg": sum(sal) / len(sal) if sal else 0.0, "top_earner": top}
    return out


def _report():
    assert os.path.isfile(REPORT), "missing " + REPORT
    rows = _read(REPORT)
    assert rows and rows[0] == HEADER
    return rows[1:]


def test_report_header_line():
    with open(REPORT) as f:
        assert f.readline().rstrip("\r\n") == ",".join(HEADER)


def test_report_values():
    rows = _report()
    expected = _expected_rows()
    assert sorted(r[0] for r in rows) == sorted(expected)
    for r in rows:
        assert len(r) == len(HEADER), r
        e = expected[r[0]]
        assert r[1] == e["dept_name"] and r[2] == e["location"]
        assert int(r[3]) == e["headcount"]
        assert int(r[4]) == e["total_salary"]
        assert abs(float(r[5]) - e["avg"]) <= 0.005 + 1e-9, r
        assert r[5].count(".") == 1 and len(r[5].split(".")[1]) == 2, r[5]
        assert r[6] == e["top_earner"], r


def test_report_sorted():
    rows = _report()
    keys = [(-int(r[4]), r[1]) for r in rows]
    assert keys == sorted(keys)
    assert len(rows) == 8


def test_empty_department_and_tie():
    rows = {r[1]: r for r in _report()}
    assert rows["Facilities"][3:] == ["0", "0", "0.00", ""]
    assert rows["Finance"][6] == "Adam Tie"  # 120000 tie with "Zoe Tie"


def test_quoted_fields():
    with open(REPORT) as f:
        text = f.read()
    assert '"Research, Applied"' in text
    rows = {r[1]: r for r in _report()}
    assert rows["Research, Applied"][2] == "Vienna"


def test_unmatched_employees():
    assert os.path.isfile(UNMATCHED), "missing " + UNMATCHED
    rows = _read(UNMATCHED)
    assert rows[0] == ["emp_id", "name", "dept_id"]
    depts, emps = _inputs()
    expected = sorted(([e["emp_id"], e["name"], e["dept_id"]] for e in emps
                       if e["dept_id"] not in depts), key=lambda r: int(r[0]))
    assert len(expected) == 9
    assert rows[1:] == expected


def test_invariant_inputs_unchanged():
    for path, digest in INPUT_SHA256.items():
        with open(path, "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, path
