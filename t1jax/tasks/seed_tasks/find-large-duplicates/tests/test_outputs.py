import hashlib
import os
from collections import defaultdict

DATA = "/app/data"
REPORT = "/app/out/duplicates.tsv"
SUMMARY = "/app/out/summary.txt"
MANIFEST_SHA256 = "6af17a663e9401c45981f923ddbbb13cb404f067fcbebcf8fdb28bf56d18854f"


def _sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _expected_groups():
    by_hash = defaultdict(list)
    for d, _, files in os.walk(DATA):
        for name in files:
            p = os.path.join(d, name)
            if os.path.islink(p) or not os.path.isfile(p) or os.path.getsize(p) < 1024:
                continue
            by_hash[_sha(p)].append(p)
    groups = []
    for h, paths in by_hash.items():
        if len(paths) > 1:
            groups.append((h, os.path.getsize(paths[0]), sorted(paths, key=os.fsencode)))
    groups.sort(key=lambda g: (-g[1], g[0]))
    return groups


def _report():
    assert os.path.isfile(REPORT), "missing " + REPORT
    with open(REPORT) as f:
        return [l.rstrip("\n").split("\t") for l in f if l.strip()]


def test_report_groups():
    got = {(r[0], int(r[1]), tuple(sorted(r[2:]))) for r in _report()}
    expected = {(h, s, tuple(sorted(p))) for h, s, p in _expected_groups()}
    assert len(expected) == 5
    assert got == expected


def test_report_order_and_format():
    rows = _report()
    expected = [[h, str(s)] + p for h, s, p in _expected_groups()]
    assert rows == expected
    for r in rows:
        assert all(os.path.isabs(p) for p in r[2:])


def test_small_files_and_symlinks_ignored():
    paths = {p for r in _report() for p in r[2:]}
    assert paths, "empty report"
    assert "/app/data/docs/small1.dat" not in paths and "/app/data/tmp/small2.dat" not in paths
    assert "/app/data/tmp/beach-link.jpg" not in paths
    assert "/app/data/docs/draft-a.txt" not in paths


def test_summary():
    assert os.path.isfile(SUMMARY), "missing " + SUMMARY
    groups = _expected_groups()
    g = len(groups)
    f = sum(len(p) for _, _, p in groups)
    b = sum(s * (len(p) - 1) for _, s, p in groups)
    with open(SUMMARY) as fh:
        assert fh.read().strip() == f"groups={g} files={f} reclaimed_bytes={b}"


def test_duplicates_hard_linked():
    groups = _expected_groups()
    assert groups
    grouped = set()
    for _, _, paths in groups:
        first = os.stat(paths[0])
        for p in paths:
            st = os.stat(p)
            assert (st.st_dev, st.st_ino) == (first.st_dev, first.st_ino), p
            assert st.st_nlink == len(paths), p
            grouped.add(p)
    # everything else keeps its own inode; the symlink stays a symlink
    for d, _, files in os.walk(DATA):
        for name in files:
            p = os.path.join(d, name)
            if p not in grouped and not os.path.islink(p):
                assert os.stat(p).st_nlink == 1, p
    assert os.path.islink("/app/data/tmp/beach-link.jpg")
    assert os.readlink("/app/data/tmp/beach-link.jpg") == "../photos/2023/beach.jpg"


def test_invariant_paths_and_contents_preserved():
    m = []
    for d, _, files in os.walk(DATA):
        for name in files:
            p = os.path.join(d, name)
            m.append((p, "->" + os.readlink(p)) if os.path.islink(p) else (p, _sha(p)))
    m.sort()
    assert hashlib.sha256(repr(m).encode()).hexdigest() == MANIFEST_SHA256
