#!/bin/bash
# Redact with Python byte regexes (re on bytes keeps non-UTF-8 bytes and CRLF untouched).
set -euo pipefail
mkdir -p /app/redacted
python3 - <<'PY'
import json
import re

OCT = rb"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
PATTERNS = [
    ("apikey", re.compile(rb"(?<![A-Za-z0-9_])(?:sk_live_|sk_test_)[A-Za-z0-9]{24}(?![A-Za-z0-9])"
                          rb"|(?<![A-Za-z0-9])AKIA[A-Z0-9]{16}(?![A-Za-z0-9])"), lambda m: b"[APIKEY]"),
    ("email", re.compile(rb"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}"), lambda m: b"[EMAIL]"),
    ("card", re.compile(rb"(?<![0-9])(?:[0-9]{16}|[0-9]{4}(?: [0-9]{4}){3}|[0-9]{4}(?:-[0-9]{4}){3})(?![0-9])"),
     lambda m: b"[CARD-" + m.group(0)[-4:] + b"]"),
    ("ipv4", re.compile(rb"(?<![0-9.])(?:" + OCT + rb"\.){3}" + OCT + rb"(?![0-9]|\.[0-9])"), lambda m: b"[IP]"),
]
with open("/app/raw/app.log", "rb") as f:
    data = f.read()
counts = {}
for name, rx, repl in PATTERNS:
    data, counts[name] = rx.subn(repl, data)
with open("/app/redacted/app.log", "wb") as f:
    f.write(data)
with open("/app/redacted/counts.json", "w") as f:
    json.dump({k: counts[k] for k in ("email", "ipv4", "card", "apikey")}, f)
print(counts)
PY
