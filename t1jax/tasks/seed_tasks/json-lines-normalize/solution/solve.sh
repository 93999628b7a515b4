#!/bin/bash
# Validate and normalise each line in Python, keeping the last valid record per id.
set -euo pipefail
mkdir -p /app/output
python3 - <<'PY'
import json
import re

AMOUNT = re.compile(r"[0-9]+(\.[0-9]+)?")


def norm(rec):
    if not isinstance(rec, dict):
        return "invalid_json", None
    rid = rec.get("id")
    if isinstance(rid, int) and not isinstance(rid, bool) and rid > 0:
        pass
    elif isinstance(rid, str) and rid.isascii() and rid.isdigit() and int(rid) > 0:
        rid = int(rid)
    else:
        return "bad_id", None
    user = rec.get("user")
    if not isinstance(user, str) or not user.strip():
        return "bad_user", None
    amount = rec.get("amount")
    if isinstance(amount, (int, float)) and not isinstance(amount, bool):
        pass
    elif isinstance(amount, str) and AMOUNT.fullmatch(amount.strip()):
        s = amount.strip()
        amount = float(s) if "." in s else int(s)
    else:
        return "bad_amount", None
    active = rec.get("active", False)
    if isinstance(active, bool):
        pass
    elif isinstance(active, int) and active in (0, 1):
        active = bool(active)
    elif isinstance(active, str) and active.lower() in ("true", "false"):
        active = active.lower() == "true"
    else:
        return "bad_active", None
    return None, {"id": rid, "user": user.strip().lower(), "amount": amount, "active": active}


clean, rejects = {}, []
with open("/app/input/users.jsonl", encoding="utf-8") as f:
    for n, line in enumerate(f.read().split("\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        reason, out = norm(rec) if rec is not None else ("invalid_json", None)
        if reason:
            rejects.append({"line": n, "reason": reason})
        else:
            clean[out["id"]] = out
with open("/app/output/clean.jsonl", "w") as f:
    for rid in sorted(clean):
        f.write(json.dumps(clean[rid]) + "\n")
with open("/app/output/rejects.jsonl", "w") as f:
    for r in rejects:
        f.write(json.dumps(r) + "\n")
print(len(clean), "clean,", len(rejects), "rejected")
PY
