"""Build /app/shop.db (schema version 1) with deterministic data."""
import random
import sqlite3

rng = random.Random(7)
con = sqlite3.connect("/app/shop.db")
con.executescript(open("/app/migrations/001_init.sql").read())
names = ["Ada", "Bruno", "Cleo", "Dev", "Elif", "Femi", "Gus", "Hana", "Ivo", "Jun", "Kira",
         "Leo", "Maya", "Nico", "Oona", "Pia", "Raj", "Sara", "Tom", "Uma"]
for cid in range(1, 41):
    name = f"{rng.choice(names)} {chr(65 + cid % 26)}."
    con.execute("INSERT INTO customers VALUES (?, ?, ?, ?)",
                (cid, name, f"user{cid}@example.com", f"2023-{cid % 12 + 1:02d}-{cid % 27 + 1:02d}"))
statuses = ["paid"] * 6 + ["refunded", "pending"]
oid = 5000
for cid in range(1, 41):
    for _ in range(rng.choice([0, 1, 2, 3, 5, 8, 13])):
        oid += rng.randint(1, 3)
        amount = rng.choice([999, 2500, 4999, 12000, 18950, 31000, 64900])
        con.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
                    (oid, cid, amount, rng.choice(statuses),
                     f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:00:00"))
con.commit()
con.close()
