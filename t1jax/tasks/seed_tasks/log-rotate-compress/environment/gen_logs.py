"""Deterministic log generations for /app/logs (fixed seed)."""
import random

rng = random.Random(42)
levels = ["INFO", "INFO", "INFO", "WARN", "ERROR", "DEBUG"]
msgs = ["request served", "cache miss", "user login", "job done", "retrying", "slow query"]


def write(path, day, n):
    with open(path, "w") as f:
        for i in range(n):
            f.write(f"2024-05-{day:02d} {i % 24:02d}:{i % 60:02d}:{(i * 7) % 60:02d} "
                    f"{rng.choice(levels)} {rng.choice(msgs)} id={rng.randint(1000, 9999)}\n")


write("/app/logs/app.log", 20, 120)          # current
write("/app/logs/app.log.1", 19, 90)         # yesterday, not compressed yet
write("/tmp/gen/app.log.2", 18, 80)
write("/tmp/gen/app.log.3", 17, 70)
write("/tmp/gen/app.log.5", 15, 50)          # generation 4 is missing
write("/tmp/gen/app.log.7", 13, 30)          # beyond the retention limit
write("/app/logs/other.log", 20, 40)
write("/app/logs/other.log.1", 19, 40)
