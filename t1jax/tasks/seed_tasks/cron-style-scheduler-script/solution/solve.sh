#!/bin/bash
# Install /app/cronwhen, a Python implementation of the classic cron matching rules.
set -euo pipefail
cat > /app/cronwhen <<'PY'
#!/usr/bin/env python3
"""cronwhen CRONTAB "YYYY-MM-DD HH:MM": print the commands due at that minute."""
import re
import sys
from datetime import datetime

MONTHS = {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())}
DAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}
FIELDS = [(0, 59, {}), (0, 23, {}), (1, 31, {}), (1, 12, MONTHS), (0, 7, DAYS)]
MACROS = {"@hourly": "0 * * * *", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
          "@weekly": "0 0 * * 0", "@monthly": "0 0 1 * *", "@yearly": "0 0 1 1 *",
          "@annually": "0 0 1 1 *"}
ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class Invalid(Exception):
    pass


def value(tok, lo, hi, names):
    tok = tok.lower()
    if tok in names:
        return names[tok]
    if not re.fullmatch(r"[0-9]+", tok):
        raise Invalid(tok)
    v = int(tok)
    if not lo <= v <= hi:
        raise Invalid(tok)
    return v


def parse_field(text, lo, hi, names):
    out = set()
    for item in text.split(","):
        m = re.fullmatch(r"([^/]+)(?:/([0-9]+))?", item)
        if not m:
            raise Invalid(item)
        base, step = m.group(1), m.group(2)
        step = int(step) if step is not None else 1
        if step < 1:
            raise Invalid(item)
        if base == "*":
            a, b = lo, hi
        elif "-" in base:
            x, _, y = base.partition("-")
            a, b = value(x, lo, hi, names), value(y, lo, hi, names)
            if a > b:
                raise Invalid(item)
        else:
            if m.group(2) is not None:
                raise Invalid(item)
            a = b = value(base, lo, hi, names)
        out.update(range(a, b + 1, step))
    return out


def parse_line(line):
    """None for ignorable lines, (sets, dom_star, dow_star, command) for jobs; Invalid else."""
    s = line.strip()
    if not s or s.startswith("#") or ENV.match(s):
        return None
    if s.startswith("@"):
        parts = s.split(None, 1)
        if parts[0].lower() not in MACROS or len(parts) < 2 or not parts[1].strip():
            raise Invalid(s)
        fields, command = MACROS[parts[0].lower()].split(), parts[1].strip()
    else:
        parts = s.split(None, 5)
        if len(parts) < 6 or not parts[5].strip():
            raise Invalid(s)
        fields, command = parts[:5], parts[5].strip()
    sets = [parse_field(f, lo, hi, names) for f, (lo, hi, names) in zip(fields, FIELDS)]
    if 7 in sets[4]:
        sets[4].add(0)
    return sets, fields[2].startswith("*"), fields[4].startswith("*"), command


def due(job, t):
    sets, dom_star, dow_star, _ = job
    minute, hour, dom, month, dow = sets
    if t.minute not in minute or t.hour not in hour or t.month not in month:
        return False
    dom_ok = t.day in dom
    dow_ok = (t.isoweekday() % 7) in dow
    if not dom_star and not dow_star:
        return dom_ok or dow_ok
    return dom_ok and dow_ok


def main(argv):
    if len(argv) != 3:
        print("usage: cronwhen CRONTAB_FILE 'YYYY-MM-DD HH:MM'", file=sys.stderr)
        return 2
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}", argv[2]):
        print(f"cronwhen: bad timestamp: {argv[2]!r}", file=sys.stderr)
        return 2
    try:
        t = datetime.strptime(argv[2], "%Y-%m-%d %H:%M")
    except ValueError:
        print(f"cronwhen: bad timestamp: {argv[2]!r}", file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as err:
        print(f"cronwhen: {err}", file=sys.stderr)
        return 2
    status = 0
    for n, line in enumerate(lines, 1):
        try:
            job = parse_line(line)
        except Invalid:
            print(f"line {n}: invalid", file=sys.stderr)
            status = 1
            continue
        if job is not None and due(job, t):
            print(job[3])
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
PY
chmod 755 /app/cronwhen
/app/cronwhen /app/crontab "2024-03-15 09:00"
/app/cronwhen /app/crontab "2024-03-01 02:30"
