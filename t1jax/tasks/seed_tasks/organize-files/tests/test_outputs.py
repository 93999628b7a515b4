import hashlib
import os

INBOX = "/app/inbox"
# new relative path -> (size, sha256)
EXPECTED = {
    "noext/LICENSE": (12, "267f7a2e19dfa9df99af774520985a0e521925293ea5b7e767ab06969d06bf91"),
    "noext/Makefile": (14, "668b5bdcb917fa46983c7a161392ba344fc40b1a0bb03cadae87e2cae88242cb"),
    "gz/archive.tar.gz": (15, "63c043b641238f64f320aa5f28593585a2d8d400e2ac1b3fa93ca60a5d8c3d7a"),
    "csv/budget.2024.csv": (21, "2af75d7e0079045e5718a821a681ed9d8181eb2567786eb645549a2a8806b697"),
    "csv/data.csv": (12, "b9485148546419a0f6a85e8d708c923557c15d7f3c7d078ef1fa7f7c0f57d5a5"),
    "png/diagram.png": (13, "7a33bd39e179e66ee366eb778500a13d7dc3e5c1e4fd1688420141bf366e5ae0"),
    "log/empty.log": (0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    "txt/meeting notes.txt": (26, "358d0c153dbe03ae04de5bf93157cf207936a834912ab34c75fdfc9c02078e5c"),
    "txt/notes.txt": (18, "86bb148f5efa8cf0adcb109d9b33fcc64cac65c26dbddc910e655dee05ad3bde"),
    "jpg/photo.JPG": (190, "52d4154518893cccb73782d75709ed92683066eaa6c43c2cd163f228686a3164"),
    "txt/report.TXT": (51, "47dd3cf5eecff4728bdf74c567170218132cc1dd9f3ad7135b27b23060728341"),
    "sh/run.sh": (19, "a4e0317eafab5cf1bc4a0041c7c8aeb6ece56fe72e7b2b3017a8a6574614cd35"),
}


def test_top_level_only_extension_dirs():
    entries = os.listdir(INBOX)
    assert sorted(entries) == ["csv", "gz", "jpg", "log", "noext", "png", "sh", "txt"]
    assert all(os.path.isdir(os.path.join(INBOX, e)) for e in entries)


def test_files_in_extension_dirs():
    found = set()
    for root, _, files in os.walk(INBOX):
        for name in files:
            found.add(os.path.relpath(os.path.join(root, name), INBOX))
    assert found == set(EXPECTED)


def test_contents_intact():
    for rel, (size, digest) in EXPECTED.items():
        with open(os.path.join(INBOX, rel), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, rel


def test_manifest():
    with open("/app/manifest.csv") as f:
        lines = f.read().splitlines()
    want = ["path,bytes"] + [f"{p},{EXPECTED[p][0]}" for p in sorted(EXPECTED)]
    assert lines == want
