import hashlib
import os
import subprocess
import tarfile
import time

import pytest

SCRIPT = "/app/backup.sh"


def run(args, cwd=None, date="20240131"):
    env = dict(os.environ)
    env.pop("BACKUP_DATE", None)
    if date is not None:
        env["BACKUP_DATE"] = date
    return subprocess.run([SCRIPT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=30)


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "my data"
    (root / "docs" / "deep dir").mkdir(parents=True)
    (root / ".hidden").mkdir()
    (root / "a.txt").write_text("alpha\n")
    (root / "skip.tmp").write_text("tmp\n")
    (root / "docs" / "b file.md").write_text("bravo\n")
    (root / "docs" / "deep dir" / "c.csv").write_text("1,2\n")
    (root / "docs" / "deep dir" / "cache.tmp").write_text("tmp\n")
    (root / ".hidden" / "secret").write_text("s\n")
    (root / "notes.tmp.txt").write_text("kept: ends in .txt\n")
    return root


def members(archive):
    with tarfile.open(archive, "r:gz") as tf:
        return {m.name[2:] if m.name.startswith("./") else m.name for m in tf.getmembers() if m.isfile()}


def test_script_is_executable():
    assert os.path.isfile(SCRIPT) and os.access(SCRIPT, os.X_OK)
    with open(SCRIPT) as f:
        assert f.readline().startswith("#!/bin/bash")


def test_creates_archive_with_default_label(src, tmp_path):
    res = run([str(src), str(tmp_path / "out")])
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "out" / "my data-20240131.tar.gz").is_file()


def test_custom_label_and_nested_dest(src, tmp_path):
    dest = tmp_path / "x" / "y" / "z"
    res = run([str(src) + "/", str(dest), "nightly_v1.2"])
    assert res.returncode == 0, res.stderr
    assert sorted(os.listdir(dest)) == ["nightly_v1.2-20240131.tar.gz", "nightly_v1.2-20240131.tar.gz.sha256"]


def test_archive_contents_exclude_tmp(src, tmp_path):
    res = run([str(src), str(tmp_path / "out"), "c"])
    assert res.returncode == 0, res.stderr
    assert members(tmp_path / "out" / "c-20240131.tar.gz") == {
        "a.txt", "docs/b file.md", "docs/deep dir/c.csv", ".hidden/secret", "notes.tmp.txt"}


def test_checksum_file(src, tmp_path):
    dest = tmp_path / "out"
    assert run([str(src), str(dest), "sum"]).returncode == 0
    line = (dest / "sum-20240131.tar.gz.sha256").read_text()
    digest = hashlib.sha256((dest / "sum-20240131.tar.gz").read_bytes()).hexdigest()
    assert line.strip() == f"{digest}  sum-20240131.tar.gz"
    check = subprocess.run(["sha256sum", "-c", "sum-20240131.tar.gz.sha256"], cwd=dest, capture_output=True)
    assert check.returncode == 0


def test_missing_source_exits_1(tmp_path):
    dest = tmp_path / "never"
    res = run([str(tmp_path / "nope"), str(dest)])
    assert res.returncode == 1 and res.stderr.strip()
    (tmp_path / "file").write_text("x")
    assert run([str(tmp_path / "file"), str(dest)]).returncode == 1
    assert not dest.exists()


def test_usage_errors_exit_2(src, tmp_path):
    assert run([]).returncode == 2
    assert run([str(src)]).returncode == 2
    assert run([str(src), str(tmp_path / "o"), "l", "extra"]).returncode == 2
    res = run([str(src), str(tmp_path / "o"), "bad label!"])
    assert res.returncode == 2 and res.stderr.strip()
    assert not (tmp_path / "o").exists() or os.listdir(tmp_path / "o") == []


def test_refuses_to_overwrite(src, tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "keep-20240131.tar.gz").write_bytes(b"old archive")
    res = run([str(src), str(dest), "keep"])
    assert res.returncode == 3 and res.stderr.strip()
    assert (dest / "keep-20240131.tar.gz").read_bytes() == b"old archive"
    assert not (dest / "keep-20240131.tar.gz.sha256").exists()


def test_relative_paths_print_absolute_archive(src, tmp_path):
    res = run(["my data", "rel out", "r"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    last = res.stdout.strip().splitlines()[-1]
    assert os.path.isabs(last)
    assert os.path.realpath(last) == os.path.realpath(tmp_path / "rel out" / "r-20240131.tar.gz")


def test_date_defaults_to_today(src, tmp_path):
    before = time.strftime("%Y%m%d")
    res = run([str(src), str(tmp_path / "out"), "d"], date=None)
    after = time.strftime("%Y%m%d")
    assert res.returncode == 0, res.stderr
    assert set(os.listdir(tmp_path / "out")) & {f"d-{before}.tar.gz", f"d-{after}.tar.gz"}
