import hashlib
import json
import os
import re

RAW = "/app/raw/app.log"
OUT = "/app/redacted/app.log"
COUNTS = "/app/redacted/counts.json"
RAW_SHA256 = "f10b0befdceb144e8799354d1b4b3d187706a11286a2bd7fa79a8ae7747eee9e"
OCT = rb"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
PATTERNS = {
    "email": re.compile(rb"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}"),
    "ipv4": re.compile(rb"(?<![0-9.])(?:" + OCT + rb"\.){3}" + OCT + rb"(?![0-9]|\.[0-9])"),
    "card": re.compile(rb"(?<![0-9])(?:[0-9]{16}|[0-9]{4}(?: [0-9]{4}){3}|[0-9]{4}(?:-[0-9]{4}){3})(?![0-9])"),
    "apikey": re.compile(rb"(?<![A-Za-z0-9_])(?:sk_live_|sk_test_)[A-Za-z0-9]{24}(?![A-Za-z0-9])"
                         rb"|(?<![A-Za-z0-9])AKIA[A-Z0-9]{16}(?![A-Za-z0-9])"),
}


def _raw():
    with open(RAW, "rb") as f:
        return f.read()


def _expected():
    """Single left-to-right pass over all patterns (they never overlap in this file)."""
    data = _raw()
    spans = []
    for kind, rx in PATTERNS.items():
        spans += [(m.start(), m.end(), kind, m.group(0)) for m in rx.finditer(data)]
    spans.sort()
    out, pos, counts = [], 0, {k: 0 for k in PATTERNS}
    for start, end, kind, text in spans:
        assert start >= pos, "overlapping matches in test data"
        out.append(data[pos:start])
        out.append({"email": b"[EMAIL]", "ipv4": b"[IP]", "apikey": b"[APIKEY]"}.get(kind)
                   or b"[CARD-" + text[-4:] + b"]")
        pos = end
        counts[kind] += 1
    out.append(data[pos:])
    return b"".join(out), counts


def _out():
    assert os.path.isfile(OUT), f"missing {OUT}"
    with open(OUT, "rb") as f:
        return f.read()


def test_redacted_file_byte_exact():
    expected, _ = _expected()
    got = _out()
    assert got.count(b"\r\n") == _raw().count(b"\r\n"), "CRLF line endings not preserved"
    assert got.splitlines(keepends=True) == expected.splitlines(keepends=True)


def test_no_secrets_left():
    got = _out()
    for kind, rx in PATTERNS.items():
        assert not rx.search(got), f"{kind} still present: {rx.search(got).group(0)!r}"
    assert b"[CARD-" in got and b"[APIKEY]" in got and b"[IP]" in got and b"[EMAIL]" in got


def test_near_misses_untouched():
    got = _out()
    raw = _raw()
    for marker in (b"version 1.2.3.4.5", b"and 10.0.0.256 and 1.2.3 and 7.7.7.7.7", b"order id ",
                   b" too short, sk_test_", b"not an email: user@localhost, @handle, foo@bar, x@y.z",
                   b"caf\xe9 bytes"):
        assert raw.count(marker) > 0
        assert got.count(marker) == raw.count(marker), marker
    assert got.endswith(b"trailing line without newline [IP]")


def test_counts_json():
    assert os.path.isfile(COUNTS), f"missing {COUNTS}"
    with open(COUNTS) as f:
        got = json.load(f)
    _, counts = _expected()
    assert got == counts


def test_invariant_raw_unchanged():
    assert hashlib.sha256(_raw()).hexdigest() == RAW_SHA256
