#!/bin/bash
# Join with Python's csv module (names and department names contain commas).
set -euo pipefail
mkdir -p /app/out
python3 - <<'PY'
import csv
from collections import defaultdict

with open("/app/data/departments.csv", newline="") as f:
    depts = {r["dept_id"]: r for r in csv.DictReader(f)}
with open("/app/data/employees.csv", newline="") as f:
    emps = list(csv.DictReader(f))

by_dept = defaultdict(list)
unmatched = []
for e in emps:
    (by_dept[e["dept_id"]] if e["dept_id"] in depts else unmatched).append(e)

rows = []
for dept_id, d in depts.items():
    members = by_dept[dept_id]
    sal = [int(e["salary"]) for e in members]
    total = sum(sal)
    avg = f"{total / len(sal):.2f}" if sal else "0.00"
    top = ""
    if members:
        best = max(sal)
        top = sorted(e["name"] for e in members if int(e["salary"]) == best)[0]
    rows.append([dept_id, d["dept_name"], d["location"], len(members), total, avg, top])
rows.sort(key=lambda r: (-r[4], r[1]))

with open("/app/out/department_report.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["dept_id", "dept_name", "location", "headcount", "total_salary", "avg_salary", "top_earner"])
    w.writerows(rows)
with open("/app/out/unmatched_employees.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["emp_id", "name", "dept_id"])
    for e in sorted(unmatched, key=lambda e: int(e["emp_id"])):
        w.writerow([e["emp_id"], e["name"], e["dept_id"]])
PY
cat /app/out/department_report.csv /app/out/unmatched_employees.csv
