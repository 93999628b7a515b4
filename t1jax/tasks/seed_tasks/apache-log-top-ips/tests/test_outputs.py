import collections
import hashlib
import os
import re

LOG = "/app/access.log"
TOP = "/app/top_ips.txt"
STATUS = "/app/status_codes.csv"
LOG_SHA256 = "89bc253f33038337bdf9a20d548f0a8666f32b2f656c15243c1b9a038c622b5d"
LINE = re.compile(r'^(\d+\.\d+\.\d+\.\d+) \S+ \S+ \[[^\]]+\] "[^"]*" (\d{3}) ')


def _requests():
    out = []
    with open(LOG) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            m = LINE.match(line)
            assert m, f"unexpected log line {line!r}"
            out.append((m.group(1), int(m.group(2))))
    return out


def _read(path):
    assert os.path.isfile(path), f"missing {path}"
    with open(path) as f:
        return [l for l in f.read().splitlines() if l.strip()]


def _expected_top():
    counts = collections.Counter(ip for ip, _ in _requests())
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].encode()))
    return [f"{c} {ip}" for ip, c in ranked[:10]]


def test_top_ips_format():
    lines = _read(TOP)
    assert len(lines) == 10
    for l in lines:
        assert re.fullmatch(r"\d+ \d+\.\d+\.\d+\.\d+", l), f"bad line {l!r}"


def test_top_ips_counts():
    got = {l.split()[1]: int(l.split()[0]) for l in _read(TOP)}
    counts = collections.Counter(ip for ip, _ in _requests())
    for ip, c in got.items():
        assert counts[ip] == c, ip
    assert min(got.values()) >= sorted(counts.values(), reverse=True)[9]


def test_top_ips_order_and_ties():
    assert _read(TOP) == _expected_top()


def test_status_codes_csv():
    lines = _read(STATUS)
    assert lines[0] == "status,count"
    counts = collections.Counter(s for _, s in _requests())
    expected = [f"{s},{counts[s]}" for s in sorted(counts)]
    assert lines[1:] == expected


def test_invariant_log_unchanged():
    with open(LOG, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == LOG_SHA256
