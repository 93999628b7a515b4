import collections
import hashlib
import json
import os
import re

INPUT = "/app/input/users.jsonl"
CLEAN = "/app/output/clean.jsonl"
REJECTS = "/app/output/rejects.jsonl"
INPUT_SHA256 = "3697b0224d3a095ae5c0b48027b17df6a9ed5cede7dc6e9ae75f010defecd44d"
AMOUNT = re.compile(r"[0-9]+(\.[0-9]+)?")


def _check(line):
    try:
        rec = json.loads(line)
    except ValueError:
        return "invalid_json", None
    if not isinstance(rec, dict):
        return "invalid_json", None
    rid = rec.get("id")
    if type(rid) is int and rid > 0:
        pass
    elif isinstance(rid, str) and re.fullmatch(r"[0-9]+", rid) and int(rid) > 0:
        rid = int(rid)
    else:
        return "bad_id", None
    user = rec.get("user")
    if not isinstance(user, str) or not user.strip():
        return "bad_user", None
    amount = rec.get("amount")
    if type(amount) in (int, float):
        pass
    elif isinstance(amount, str) and AMOUNT.fullmatch(amount.strip()):
        amount = float(amount.strip())
    else:
        return "bad_amount", None
    active = rec.get("active", False)
    if type(active) is bool:
        pass
    elif type(active) is int and active in (0, 1):
        active = bool(active)
    elif isinstance(active, str) and active.lower() in ("true", "false"):
        active = active.lower() == "true"
    else:
        return "bad_active", None
    return None, {"id": rid, "user": user.strip().lower(), "amount": amount, "active": active}


def _expected():
    clean, rejects, valid_lines = {}, [], collections.Counter()
    with open(INPUT, encoding="utf-8") as f:
        lines = f.read().split("\n")[:-1]
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        reason, rec = _check(line)
        if reason:
            rejects.append({"line": n, "reason": reason})
        else:
            clean[rec["id"]] = rec
            valid_lines[rec["id"]] += 1
    return [clean[k] for k in sorted(clean)], rejects, valid_lines


def _load(path):
    assert os.path.isfile(path), f"missing {path}"
    with open(path, encoding="utf-8") as f:
        return [json.loads(l) for l in f.read().splitlines() if l.strip()]


def test_clean_records_have_normalised_types():
    got = _load(CLEAN)
    assert got
    for r in got:
        assert set(r) == {"id", "user", "amount", "active"}, r
        assert type(r["id"]) is int and r["id"] > 0
        assert isinstance(r["user"], str) and r["user"] == r["user"].strip().lower() and r["user"]
        assert type(r["amount"]) in (int, float), r
        assert type(r["active"]) is bool, r


def test_clean_records_values():
    got = _load(CLEAN)
    exp, _, _ = _expected()
    assert [r["id"] for r in got] == [r["id"] for r in exp]
    for g, e in zip(got, exp):
        assert g["user"] == e["user"] and g["active"] == e["active"], (g, e)
        assert abs(g["amount"] - e["amount"]) < 1e-9, (g, e)


def test_dedupe_keeps_last_and_sorted():
    got = _load(CLEAN)
    ids = [r["id"] for r in got]
    assert ids == sorted(set(ids)), "ids must be unique and ascending"
    exp, _, valid_lines = _expected()
    dup_ids = {k for k, c in valid_lines.items() if c > 1}
    assert dup_ids, "test data must contain duplicates"
    exp_by_id = {r["id"]: r for r in exp}
    for r in got:
        if r["id"] in dup_ids:
            assert r["user"] == exp_by_id[r["id"]]["user"]
            assert abs(r["amount"] - exp_by_id[r["id"]]["amount"]) < 1e-9


def test_rejects_file():
    got = _load(REJECTS)
    _, exp, _ = _expected()
    assert got == exp


def test_every_reason_used():
    reasons = {r.get("reason") for r in _load(REJECTS)}
    assert reasons == {"invalid_json", "bad_id", "bad_user", "bad_amount", "bad_active"}


def test_invariant_input_unchanged():
    with open(INPUT, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == INPUT_SHA256
