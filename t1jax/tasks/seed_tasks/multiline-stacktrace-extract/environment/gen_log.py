"""Deterministically generate /app/app.log: log lines mixed with Python tracebacks (fixed seed)."""
import random

rnd = random.Random(90210)
EXC = [
    ("ValueError", ["invalid literal for int() with base 10: 'abc'", "math domain error",
                    "too many values to unpack (expected 2)"]),
    ("KeyError", ["'user_id'", "'region'", "42"]),
    ("ZeroDivisionError", ["division by zero"]),
    ("json.decoder.JSONDecodeError", ["Expecting value: line 1 column 1 (char 0)",
                                      "Unterminated string starting at: line 3 column 5 (char 41)"]),
    ("TimeoutError", [None]),
    ("app.errors.QuotaExceeded", ["tenant 'acme' used 1001/1000 requests: retry later"]),
]
FRAMES = [("/srv/app/worker.py", "run", "result = self.handle(job)"),
          ("/srv/app/jobs.py", "handle", "return parse(job.payload)"),
          ("/srv/app/parse.py", "parse", "value = int(raw) / scale"),
          ("/usr/lib/python3.11/json/__init__.py", "loads", "return _default_decoder.decode(s)"),
          ("/srv/app/quota.py", "check", "raise QuotaExceeded(msg)")]
SERVICES = ["worker", "api", "scheduler"]
MSGS = ["job started id=%d", "job finished id=%d", "heartbeat seq=%d", "cache hit ratio=0.%d",
        "Traceback collection enabled for job %d", "retrying request %d after Error"]


def ts(i):
    return f"2024-05-01 {8 + i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d},{rnd.randint(0, 999):03d}"


def traceback(exc, msg):
    out = ["Traceback (most recent call last):"]
    for path, fn, code in rnd.sample(FRAMES, rnd.randint(1, 4)):
        out.append(f'  File "{path}", line {rnd.randint(10, 400)}, in {fn}')
        out.append(f"    {code}")
    out.append(exc if msg is None else f"{exc}: {msg}")
    return out


lines, t = [], 0
for i in range(400):
    t += rnd.randint(1, 20)
    svc = rnd.choice(SERVICES)
    r = rnd.random()
    if r < 0.12:
        exc, msgs = rnd.choice(EXC)
        lines.append(f"{ts(t)} ERROR {svc}: unhandled exception in job {i}")
        lines += traceback(exc, rnd.choice(msgs))
        if rnd.random() < 0.25:  # chained exception
            lines.append("")
            lines.append("During handling of the above exception, another exception occurred:")
            lines.append("")
            exc2, msgs2 = rnd.choice(EXC)
            lines += traceback(exc2, rnd.choice(msgs2))
    elif r < 0.17:  # multi-line INFO message with indented continuation lines (not a traceback)
        lines.append(f"{ts(t)} INFO {svc}: config reloaded:")
        lines.append(f"    max_workers = {rnd.randint(1, 16)}")
        lines.append("    ValueError: not an exception, just a config comment")
    else:
        lines.append(f"{ts(t)} {rnd.choice(['INFO', 'INFO', 'DEBUG', 'WARNING'])} {svc}: "
                     + rnd.choice(MSGS) % i)
with open("/app/app.log", "w") as f:
    f.write("\n".join(lines) + "\n")
