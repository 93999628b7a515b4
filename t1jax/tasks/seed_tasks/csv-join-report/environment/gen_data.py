"""Deterministic sample data: employees.csv and departments.csv (fixed seed)."""
import csv
import random

rng = random.Random(20240611)
departments = [
    (10, "Engineering", "Berlin"), (20, "Sales", "Madrid"), (30, "Support", "Lisbon"),
    (40, "Finance", "Paris"), (50, "Legal", "Rome"), (60, "Research, Applied", "Vienna"),
    (70, "Marketing", "Dublin"), (80, "Facilities", "Prague"),
]
first = ["Ana", "Ben", "Chloe", "Dmitri", "Eva", "Farid", "Greta", "Hugo", "Ines", "Jonas",
         "Kaya", "Luis", "Mona", "Nils", "Olga", "Pavel", "Quinn", "Rosa", "Sven", "Tara"]
last = ["Schmidt", "Garcia", "Silva", "Martin", "Rossi", "Novak", "Murphy", "Dubois",
        "Weber", "Costa", "O'Neil", "Horvat"]
dept_ids = [10, 10, 10, 20, 20, 30, 30, 30, 40, 50, 60, 60, 70, 99, 15]  # 99, 15: unknown, 80: none
rows = []
for emp_id in range(1001, 1061):
    name = f"{rng.choice(last)}, {rng.choice(first)}" if rng.random() < 0.3 else \
        f"{rng.choice(first)} {rng.choice(last)}"
    dept = rng.choice(dept_ids)
    salary = rng.randrange(38000, 132000, 250)
    rows.append((emp_id, name, dept, salary))
rows[5] = (rows[5][0], "Zoe Tie", 40, 120000)   # a tie for Finance's top earner
rows[6] = (rows[6][0], "Adam Tie", 40, 120000)
rng.shuffle(rows)
with open("/app/data/employees.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["emp_id", "name", "dept_id", "salary"])
    w.writerows(rows)
with open("/app/data/departments.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["dept_id", "dept_name", "location"])
    w.writerows(sorted(departments, key=lambda d: d[1]))
