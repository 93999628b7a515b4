import glob
import re

OUT = "/app/emails.txt"
EXPECTED = [
    "alice.smith@example.com",
    "bob_jones+news@mail.example.org",
    "carol-w@sub.domain.co.uk",
    "dave@example.com",
    "grace%ops@corp-mail.net",
    "henry99@uni.edu",
    "judy@x.io",
    "laura@x.y.z.museum",
]
INVALID = ["john..doe@example.com", "eve.@example.com", "frank@example..com", "bad@-corp.com",
           "root@localhost", "ivan@example.c0m", "kim.lee@bad-.org", "ignored@example.com"]

LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
VALID = re.compile(r"(?!\.)(?!.*\.\.)[A-Za-z0-9._%+-]{1,64}(?<!\.)@(?:" + LABEL + r"\.)+[A-Za-z]{2,63}")


def _recompute():
    found = set()
    for path in glob.glob("/app/data/*.txt"):
        for tok in open(path).read().split():
            cand = tok.strip("<>()[]{}\"',;:!?.")
            if VALID.fullmatch(cand):
                found.add(cand.lower())
    return sorted(found)


def _read():
    with open(OUT) as f:
        return f.read()


def test_exact_addresses():
    assert set(_read().split()) == set(EXPECTED) == set(_recompute())


def test_format_sorted_unique_lowercase():
    text = _read()
    lines = text.split("\n")
    assert text.endswith("\n") and lines[-1] == ""
    body = lines[:-1]
    assert body and all(l and l == l.strip() and l == l.lower() for l in body)
    assert body == sorted(set(body))


def test_invalid_candidates_excluded():
    got = set(_read().split())
    assert got, "no addresses written"
    for bad in INVALID:
        assert bad not in got, bad


def test_case_duplicates_merged():
    got = _read().split()
    assert got.count("alice.smith@example.com") == 1 and got.count("dave@example.com") == 1
