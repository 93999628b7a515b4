import glob
import hashlib
import os
import re

REPORT = "/app/report.txt"
EXPECTED = [("api", 7), ("billing", 7), ("auth", 5), ("search", 5), ("cache", 3)]
LOG_SHA256 = {
    "backend.log": "e0a36f552c6ef3162f378a3aeb46a1337a40ead2667d3c64d8a7edb4b8c7d26b",
    "backend.log.1": "31e10b71e6e4d3e67e10a01d36bb26398438d0a2b1b0a10ef6073fd1696d779e",
    "frontend.log": "d5201ef65daf451d78155e45159e6af75f06621208e7419c957942e400901fbc",
    "jobs.log": "ae675c21bf13751ac1145de09545bfc426be27671574b9c627ca3099d8376327",
}


def _lines():
    assert os.path.isfile(REPORT), "missing /app/report.txt"
    with open(REPORT) as f:
        return [l for l in f.read().splitlines() if l.strip()]


def _service_lines():
    return [l for l in _lines() if not l.startswith("TOTAL:")]


def _recount():
    counts = {}
    for path in glob.glob("/app/logs/*.log"):
        for line in open(path):
            m = re.match(r"^\S+ \S+ \[(\w+)\] service=(\S+) ", line)
            if m and m.group(1) == "ERROR":
                counts[m.group(2)] = counts.get(m.group(2), 0) + 1
    return counts


def test_counts_per_service():
    got = {}
    for l in _service_lines():
        m = re.fullmatch(r"(\S+): (\d+)", l.strip())
        assert m, f"bad line format: {l!r}"
        got[m.group(1)] = int(m.group(2))
    assert got == dict(EXPECTED) == _recount()


def test_sorted_by_count_then_name():
    names = [l.split(":")[0] for l in _service_lines()]
    assert names == [s for s, _ in EXPECTED]


def test_total_line_is_last():
    lines = _lines()
    assert lines[-1].strip() == "TOTAL: 27"
    assert sum(1 for l in lines if l.startswith("TOTAL:")) == 1


def test_ignores_rotated_file_and_zero_services():
    names = {l.split(":")[0] for l in _service_lines()}
    # mailer has no ERROR lines; backend.log.1 would change billing/search/auth counts
    assert names and "mailer" not in names
    got = dict((l.split(": ")[0], int(l.split(": ")[1])) for l in _service_lines())
    assert got.get("billing") == 7 and got.get("auth") == 5


def test_invariant_logs_unchanged():
    names = sorted(os.path.basename(p) for p in glob.glob("/app/logs/*"))
    assert names == ["backend.log", "backend.log.1", "frontend.log", "jobs.log"]
    for n in names:
        with open(os.path.join("/app/logs", n), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == LOG_SHA256[n], n
