"""Deterministically generate /app/input/users.jsonl with messy records (fixed seed)."""
import json
import os
import random

rnd = random.Random(4242)
names = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"]
os.makedirs("/app/input", exist_ok=True)
out = []
for i in range(260):
    rid = rnd.randint(1, 120)
    rec = {}
    # id: int, digit string, padded digit string, or broken
    r = rnd.random()
    if r < 0.6:
        rec["id"] = rid
    elif r < 0.8:
        rec["id"] = str(rid)
    elif r < 0.88:
        rec["id"] = f"{rid:05d}"
    elif r < 0.93:
        rec["id"] = rnd.choice(["x12", "", "-4", "3.5", None, 0])
    # else: id missing
    # user
    r = rnd.random()
    name = rnd.choice(names)
    if r < 0.6:
        rec["user"] = name
    elif r < 0.85:
        rec["user"] = rnd.choice(["  ", "", "\t"]) + name.upper() + rnd.choice([" ", "", "  "])
    elif r < 0.92:
        rec["user"] = rnd.choice(["", "   ", None, 17])
    # else: user missing
    # amount
    r = rnd.random()
    cents = rnd.randint(0, 99999)
    if r < 0.5:
        rec["amount"] = cents / 100
    elif r < 0.75:
        rec["amount"] = f"{cents / 100:.2f}"
    elif r < 0.82:
        rec["amount"] = cents // 100
    elif r < 0.9:
        rec["amount"] = f" {cents // 100} "
    elif r < 0.96:
        rec["amount"] = rnd.choice(["12,50", "abc", None, "", [1], "1e3x"])
    # else: amount missing
    # active (optional)
    r = rnd.random()
    if r < 0.3:
        rec["active"] = rnd.choice([True, False])
    elif r < 0.5:
        rec["active"] = rnd.choice(["true", "false", "TRUE", "False", "True"])
    elif r < 0.6:
        rec["active"] = rnd.choice([0, 1])
    elif r < 0.65:
        rec["active"] = rnd.choice(["yes", "maybe", 2, None])
    # else: missing -> false
    if rnd.random() < 0.2:
        rec["note"] = rnd.choice(["vip", "migrated", "ünïcode ✓"])
    items = list(rec.items())
    rnd.shuffle(items)
    line = json.dumps(dict(items), ensure_ascii=rnd.random() < 0.5)
    r = rnd.random()
    if r < 0.03:
        line = line[: len(line) // 2]  # truncated JSON
    elif r < 0.05:
        line = json.dumps([rec.get("id"), rec.get("user")])  # valid JSON, not an object
    elif r < 0.07:
        line = "   "
    elif r < 0.08:
        line = ""
    out.append(line)
with open("/app/input/users.jsonl", "w", encoding="utf-8") as f:
    f.write("\n".join(out) + "\n")
