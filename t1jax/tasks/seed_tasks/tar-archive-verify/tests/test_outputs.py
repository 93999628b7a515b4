import hashlib
import os
import subprocess
import tarfile

DIST = "/app/dist"
ARCHIVE = "/app/dist/project.tar.gz"
EXPECTED_FILES = sorted([
    "project/.env.example", "project/README.md", "project/data/sample.csv",
    "project/docs/guide with spaces.md", "project/docs/img/logo.bin", "project/src/build.txt",
    "project/src/changelog.log.md", "project/src/logs/keep.txt", "project/src/main.py",
    "project/src/util/strings.py",
])
INPUT_SHA256 = "0a5cef27317adc8e718bbcea980756826a1290c51ba39e7ae5e13ccc71fe3751"


def _sha(data):
    return hashlib.sha256(data).hexdigest()


def _members():
    assert os.path.isfile(ARCHIVE), f"missing {ARCHIVE}"
    with tarfile.open(ARCHIVE, "r:gz") as tf:
        return {m.name.removeprefix("./"): tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}


def _inputs_digest():
    h = hashlib.sha256()
    for root in ("/app/project", "/app/incoming"):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                p = os.path.join(dirpath, name)
                h.update(p.encode() + b"\0")
                with open(p, "rb") as f:
                    h.update(_sha(f.read()).encode())
    return h.hexdigest()


def test_archive_members_and_exclusions():
    members = _members()
    assert sorted(members) == EXPECTED_FILES


def test_archive_contents_exact():
    members = _members()
    for name in EXPECTED_FILES:
        with open(os.path.join("/app", name), "rb") as f:
            assert members.get(name) == f.read(), name


def test_archive_checksum_file():
    path = os.path.join(DIST, "project.tar.gz.sha256")
    assert os.path.isfile(path), f"missing {path}"
    with open(ARCHIVE, "rb") as f:
        digest = _sha(f.read())
    assert open(path).read().strip() == f"{digest}  project.tar.gz"
    res = subprocess.run(["sha256sum", "-c", "project.tar.gz.sha256"], cwd=DIST, capture_output=True)
    assert res.returncode == 0


def test_manifest():
    path = os.path.join(DIST, "MANIFEST.txt")
    assert os.path.isfile(path), f"missing {path}"
    members = _members()
    expected = [f"{_sha(members[n])}  {n}" for n in sorted(members, key=str.encode)]
    assert open(path).read().splitlines() == expected
    assert len(expected) == len(EXPECTED_FILES)


def test_corrupt_release_listed():
    path = os.path.join(DIST, "corrupt.txt")
    assert os.path.isfile(path), f"missing {path}"
    sums = dict(reversed(l.split("  ")) for l in open("/app/incoming/SHA256SUMS").read().splitlines())
    bad = sorted(n for n, d in sums.items() if _sha(open(f"/app/incoming/{n}", "rb").read()) != d)
    assert bad == ["release-3.tar.gz"]
    assert open(path).read().split() == bad


def test_deployed_config_from_newest_valid_release():
    assert os.path.isdir("/app/deploy"), "missing /app/deploy"
    assert os.listdir("/app/deploy") == ["app.conf"]
    with tarfile.open("/app/incoming/release-2.tar.gz", "r:gz") as tf:
        expected = tf.extractfile("release/config/app.conf").read()
    with open("/app/deploy/app.conf", "rb") as f:
        assert f.read() == expected


def test_invariant_inputs_unchanged():
    assert _inputs_digest() == INPUT_SHA256
