"""Deterministically generate /app/measurements.csv in long format (fixed seed)."""
import random

rnd = random.Random(1312)
stations = ["ST-07", "ST-12", "ST-3", "AIRPORT", "harbor"]
metrics = {"temp": (-5, 35, 1), "humidity": (20, 100, 0), "wind": (0, 60, 1), "pressure": (980, 1040, 1)}
rows = []
for st in stations:
    for day in rnd.sample(range(1, 29), 9):
        date = f"2024-02-{day:02d}"
        for m, (lo, hi, nd) in metrics.items():
            if rnd.random() < 0.18:
                continue  # missing measurement -> NA in the wide table
            v = round(rnd.uniform(lo, hi), nd)
            rows.append([st, date, m, f"{v:.{nd}f}"])
            if rnd.random() < 0.06:  # corrected re-reading later in the file: last one wins
                rows.append([st, date, m, f"{round(rnd.uniform(lo, hi), nd):.{nd}f}"])
        if rnd.random() < 0.3:
            rows.append([st, date, "uv_index", str(rnd.randint(0, 11))])
rnd.shuffle(rows)
with open("/app/measurements.csv", "w") as f:
    f.write("station,date,metric,value\n")
    for r in rows:
        f.write(",".join(r) + "\n")
