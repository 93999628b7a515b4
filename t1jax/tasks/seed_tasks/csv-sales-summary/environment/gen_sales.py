"""Deterministically generate /app/sales.csv (fixed seed)."""
import csv
import random

rnd = random.Random(20240501)
regions = ["North", "South", "East", "West"]
products = [("Widget", 4.99), ("Gadget", 12.50), ("Widget, Large", 7.25),
            ("Gizmo \"Pro\"", 29.00), ("Doohickey", 1.75)]
with open("/app/sales.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["order_id", "date", "region", "product", "quantity", "unit_price", "status"])
    for i in range(1, 301):
        name, price = rnd.choice(products)
        month = rnd.randint(1, 6)
        day = rnd.randint(1, 28)
        status = "refunded" if rnd.random() < 0.12 else "completed"
        w.writerow([f"ORD-{i:04d}", f"2024-{month:02d}-{day:02d}", rnd.choice(regions),
                    name, rnd.randint(1, 20), f"{price:.2f}", status])
