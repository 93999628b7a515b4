"""Deterministically build /app/shop.db (fixed seed)."""
import random
import sqlite3

rnd = random.Random(5150)
db = sqlite3.connect("/app/shop.db")
db.executescript("""
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT NOT NULL);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL,
                       price_cents INTEGER NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     ordered_at TEXT NOT NULL, status TEXT NOT NULL);
CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(id),
                          product_id INTEGER NOT NULL REFERENCES products(id),
                          quantity INTEGER NOT NULL, unit_price_cents INTEGER NOT NULL);
""")
names = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov",
         "Donald Knuth", "Frances Allen", "Ken Thompson", "Margaret Hamilton", "Niklaus Wirth",
         "Radia Perlman", "John McCarthy"]
for i, n in enumerate(names, 1):
    db.execute("INSERT INTO customers VALUES (?,?,?)", (i, n, rnd.choice(["DE", "US", "FR", "UK"])))
products = [("Keyboard", "peripherals", 4999), ("Mouse", "peripherals", 1999),
            ("Monitor 27in", "displays", 27900), ("Monitor 24in", "displays", 18950),
            ("USB-C Cable", "accessories", 899), ("Laptop Stand", "accessories", 3450),
            ("Webcam", "peripherals", 6900), ("Headset", "audio", 8999), ("Speakers", "audio", 5400)]
for i, p in enumerate(products, 1):
    db.execute("INSERT INTO products VALUES (?,?,?,?)", (i, *p))
oid = 0
for month in range(1, 10):
    for _ in range(rnd.randint(8, 20)):
        oid += 1
        ts = f"2023-{month:02d}-{rnd.randint(1, 28):02d} {rnd.randint(0, 23):02d}:{rnd.randint(0, 59):02d}:00"
        status = rnd.choices(["paid", "cancelled", "refunded"], [80, 12, 8])[0]
        db.execute("INSERT INTO orders VALUES (?,?,?,?)", (oid, rnd.randint(1, len(names)), ts, status))
        for pid in rnd.sample(range(1, len(products) + 1), rnd.randint(1, 4)):
            price = products[pid - 1][2]
            if rnd.random() < 0.2:  # discounted sale price differs from list price
                price = price * rnd.choice([80, 85, 90]) // 100
            db.execute("INSERT INTO order_items VALUES (?,?,?,?)", (oid, pid, rnd.randint(1, 5), price))
# month 10 has only cancelled orders: it must not appear in the report
for _ in range(3):
    oid += 1
    db.execute("INSERT INTO orders VALUES (?,?,?,?)", (oid, 1, f"2023-10-0{_ + 1} 12:00:00", "cancelled"))
    db.execute("INSERT INTO order_items VALUES (?,?,?,?)", (oid, 1, 2, 4999))
db.commit()
db.close()
